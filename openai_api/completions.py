"""Non-streamed choices that stop generating when their client leaves.

The choices run in worker threads (the client library blocks) while the event loop waits for
the client's disconnect; if it comes first, every choice is cancelled on the server at once
(a unary choice by a stop request with its id, a streamed one by cancelling its gRPC stream),
so the engine drops the sequences at its next step rather than generate for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from fastapi import Request

from client import CompletionRequest
from openai_api.dependencies import ApiState
from openai_api.generation import ChoiceResult, PendingChoice

log = logging.getLogger("openai_api")


class ClientLeftError(Exception):
    """The client disconnected before its answer was ready; nothing is sent back."""


async def client_left(request: Request) -> None:
    """Return once the client disconnects. The body was read already, so the next ASGI
    message is the disconnect (or the end of the response, when this task is cancelled)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_choices(
    api: ApiState,
    request: Request,
    requests: Sequence[CompletionRequest],
    stops: Sequence[str],
) -> list[ChoiceResult]:
    """Every choice, whole, in order; raises :class:`ClientLeftError` (after cancelling them
    all) if the client leaves first."""
    choices: list[PendingChoice] = [await api.call(api.backend.choice, r, stops) for r in requests]
    work = asyncio.ensure_future(asyncio.gather(*(api.call(c.run) for c in choices)))
    left = asyncio.ensure_future(client_left(request))
    try:
        await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
    if work.done():
        return work.result()
    log.info("the client left: cancelling its %d choice(s)", len(choices))
    cancels = [api.call(choice.cancel) for choice in choices]
    for outcome in await asyncio.gather(*cancels, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.warning("could not cancel a choice whose client left: %s", outcome)
    with contextlib.suppress(Exception):  # it ends cancelled (an error), or had just finished
        await work
    raise ClientLeftError
