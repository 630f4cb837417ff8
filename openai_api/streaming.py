"""Streamed completions: server-sent events fed by one worker thread per choice.

Each choice's thread reads its :class:`ChoiceStream` and feeds an asyncio queue. However the
response ends (done, failed, the client left before or while the body was sent) every choice
is abandoned: its request is cancelled on the server at once, even while the engine has no
piece to send, and the in-flight slot is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from openai_api.completions import (
    CLIENT_CLOSED_REQUEST,
    ClientLeftError,
    done_before_client_left,
)
from openai_api.dependencies import ApiState
from openai_api.errors import from_client_error
from openai_api.generation import ChoiceResult, ChoiceStream
from openai_api.repo_context import FittedContext
from openai_api.request import CompletionJob
from openai_api.shapes import job_usage, logprobs, sse


class StreamedChoice:
    """One streamed choice: a thread reads its :class:`ChoiceStream` and puts
    ``(index, kind, value)`` on the response's queue; :meth:`abandon` makes it stop and cancel."""

    def __init__(self, index: int, stream: ChoiceStream) -> None:
        self.index = index
        self.stream = stream
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        def put(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, (self.index, kind, value))

        def run() -> None:
            try:
                for piece in self.stream:
                    if self.stop.is_set():
                        return
                    put("text", piece)
                if not self.stop.is_set():
                    put("done", self.stream.result)
            except Exception as exc:
                put("error", exc)
            finally:
                self.stream.close()  # cancels the request if it is still generating
                put("end", None)

        self.thread = threading.Thread(target=run, name=f"choice-{self.index}", daemon=True)
        self.thread.start()

    def abandon(self) -> None:
        self.stop.set()
        if self.thread is None:  # never started: close it here, off the event loop
            threading.Thread(target=self.stream.close, daemon=True).start()
        else:  # wakes the reader even while no piece comes (a held or slow engine)
            self.stream.cancel()


class EventStream(StreamingResponse):
    """A StreamingResponse that always runs ``cleanup`` once it ends, however it ends (done,
    failed, or the client went away before or while the body was sent)."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cleanup()


async def primed(api: ApiState, request: Request, choices: Sequence[StreamedChoice]) -> None:
    """Wait for the first text of every choice (a refused request raises here, before any byte
    is sent, so it still gets its status code), or raise :class:`ClientLeftError` once the
    client leaves first, its choices cancelled on the server at once. On a long prompt the
    prefill alone takes seconds, and an editor has left long before it ends: nothing else
    watches the client until the first piece is written."""
    work = asyncio.ensure_future(asyncio.gather(*(api.call(c.stream.prime) for c in choices)))
    if await done_before_client_left(request, work):
        work.result()
        return
    for choice in choices:
        choice.stream.cancel()  # wakes the waiting prime
    with contextlib.suppress(Exception):
        await work
    raise ClientLeftError


class CompletionChunks:
    """The shape of a completion's chunks (``text_completion``); chat's differ only here
    (:class:`openai_api.chat.ChatChunks`)."""

    object = "text_completion"
    id_prefix = "cmpl-"

    def opening(self, index: int) -> dict[str, Any] | None:
        """A choice's first chunk, before its text (none for a completion)."""
        return None

    def choice(self, index: int, text: str, result: ChoiceResult | None) -> dict[str, Any]:
        return {
            "text": text,
            "index": index,
            "logprobs": logprobs(result) if result else None,
            "finish_reason": result.finish_reason if result else None,
        }


async def stream_completion(
    api: ApiState,
    request: Request,
    job: CompletionJob,
    context: FittedContext,
    shape: CompletionChunks | None = None,
) -> Response:
    """The job's choices as OpenAI's completion chunks (or ``shape``'s); the caller acquired a
    slot, which is released when the stream ends. ``context``: what its repository context
    kept (usage)."""
    shape = shape or CompletionChunks()
    choices: list[StreamedChoice] = []
    released = False

    def cleanup() -> None:
        nonlocal released
        for choice in choices:
            choice.abandon()
        if not released:
            released = True
            api.slots.release()

    try:
        for i, completion in enumerate(job.requests):
            stream = await api.call(api.backend.open_stream, completion)
            choices.append(StreamedChoice(i, stream))
        await primed(api, request, choices)
    except ClientLeftError:
        cleanup()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except BaseException:
        cleanup()
        raise
    completion_id, created = f"{shape.id_prefix}{uuid.uuid4().hex}", int(time.time())
    head = {"id": completion_id, "object": shape.object, "created": created, "model": job.model}

    def chunk(index: int, text: str, result: ChoiceResult | None = None) -> bytes:
        return sse({**head, "choices": [shape.choice(index, text, result)]})

    async def events() -> AsyncIterator[bytes]:
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for choice in choices:
            opening = shape.opening(choice.index)
            if opening is not None:
                yield sse({**head, "choices": [opening]})
        if job.echo:
            for choice in choices:
                yield chunk(choice.index, job.prompt_of(choice.index))
        for choice in choices:  # the first text is here already: sent before the threads start
            if first := choice.stream.take_primed():
                yield chunk(choice.index, first)
        for choice in choices:
            choice.start(loop, queue)
        results: dict[int, ChoiceResult] = {}
        running = len(choices)
        while running:
            index, kind, value = await queue.get()
            if kind == "text":
                yield chunk(index, value)
            elif kind == "done":
                results[index] = value
                # OpenAI sends the last chunk of a choice with its finish_reason
                yield chunk(index, "", value)
            elif kind == "error":
                yield sse(from_client_error(value, api.settings.triton_url).body())
                return  # no [DONE]: the stream failed
            else:
                running -= 1
        if job.include_usage:
            ordered = [results[i] for i in range(len(choices))]
            usage = {**job_usage(job, ordered), **context.usage()}
            yield sse({**head, "choices": [], "usage": usage})
        yield sse("[DONE]")

    return EventStream(events(), cleanup)
