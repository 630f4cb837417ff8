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
from dataclasses import replace

from fastapi import Request

from client import CompletionRequest
from openai_api.dependencies import ApiState
from openai_api.generation import ChoiceResult, PendingChoice
from openai_api.repo_context import ContextChunk, FittedContext

log = logging.getLogger("openai_api")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left (nobody reads it)


class ClientLeftError(Exception):
    """The client disconnected before its answer was ready; nothing is sent back."""


async def client_left(request: Request) -> None:
    """Return once the client disconnects. The body was read already, so the next ASGI
    message is the disconnect (or the end of the response, when this task is cancelled)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def done_before_client_left(request: Request, work: asyncio.Future) -> bool:
    """Wait until ``work`` is done or the client has left, whichever comes first; True when
    the work was done."""
    left = asyncio.ensure_future(client_left(request))
    try:
        await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
    return work.done()


async def run_choices(
    api: ApiState,
    request: Request,
    requests: Sequence[CompletionRequest],
    stops: Sequence[str],
    streamed: bool = False,
) -> list[ChoiceResult]:
    """Every choice, whole, in order; raises :class:`ClientLeftError` (after cancelling them
    all) if the client leaves first. ``streamed``: from the engine model whatever the
    request (a prompt with special tokens, which the unary ensemble's text does not echo)."""
    backend = api.backend
    choices: list[PendingChoice] = [
        await (api.call(backend.open_stream, r) if streamed else api.call(backend.choice, r, stops))
        for r in requests
    ]
    work = asyncio.ensure_future(asyncio.gather(*(api.call(c.run) for c in choices)))
    if await done_before_client_left(request, work):
        return work.result()
    log.info("the client left: cancelling its %d choice(s)", len(choices))
    cancels = [api.call(choice.cancel) for choice in choices]
    for outcome in await asyncio.gather(*cancels, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.warning("could not cancel a choice whose client left: %s", outcome)
    with contextlib.suppress(Exception):  # it ends cancelled (an error), or had just finished
        await work
    raise ClientLeftError


async def with_context(
    api: ApiState, request: CompletionRequest, chunks: Sequence[ContextChunk]
) -> tuple[CompletionRequest, FittedContext]:
    """``request`` (one prompt) with the repository context that fits its budget before its
    prompt (:mod:`openai_api.repo_context`), and what was kept; unchanged without chunks."""
    (prefix,) = request.prompts
    if not chunks:
        return request, FittedContext(prefix, 0, 0, None)
    suffix = request.suffixes[0]
    fitted = await api.call(api.backend.fit_context, chunks, prefix, suffix, request.max_tokens)
    return replace(request, prompts=(fitted.prompt,)), fitted


def warmed(result: ChoiceResult) -> ChoiceResult:
    """A warm-up's answer (``max_tokens``/``n_predict`` 0): its prompt went through the
    engine, so the prefix cache holds it; the one token computed is not an answer."""
    return replace(result, text="", completion_tokens=0, finish_reason="length", log_probs=None)
