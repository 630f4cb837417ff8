"""The FastAPI application: routes, API key, in-flight limit, server-sent events.

The client library blocks, so every call to Triton runs in a worker thread: non-streamed
choices through Starlette's thread pool, each streamed choice in its own thread that feeds an
asyncio queue (it notices a client that left at the next piece, and cancels the gRPC stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from client import ENSEMBLE_MODEL, STREAM_MODEL
from openai_api.errors import OpenAIError, from_client_error
from openai_api.generation import Backend, ChoiceResult, ChoiceStream
from openai_api.request import MODEL_ALIASES, MODEL_NAME, CompletionJob, parse_completion
from openai_api.settings import API_KEY_VARIABLE, Settings


class Slots:
    """Requests in flight, capped: past the cap a request gets 503 at once (used from the
    event loop only, so no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def acquire(self) -> None:
        if self.in_use >= self.limit:
            raise OpenAIError(
                503,
                f"the server is overloaded: {self.in_use} requests in flight, the most it takes "
                "at once (--max-concurrent); retry later",
                type_="server_error",
                code="overloaded",
            )
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _logprobs(result: ChoiceResult) -> dict[str, Any] | None:
    """OpenAI's logprobs object, with what the engine knows: each generated token's log
    probability. Token texts, offsets and alternatives are not returned by the ensemble."""
    if result.log_probs is None:
        return None
    return {
        "tokens": None,
        "token_logprobs": list(result.log_probs),
        "top_logprobs": None,
        "text_offset": None,
    }


def _job_usage(job: CompletionJob, results: list[ChoiceResult]) -> dict[str, int]:
    """Prompt tokens once per prompt (not once per choice), as OpenAI counts them."""
    prompt = sum(results[p * job.n].prompt_tokens for p in range(len(job.prompts)))
    return _usage(prompt, sum(r.completion_tokens for r in results))


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


class _StreamedChoice:
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


class _EventStream(StreamingResponse):
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


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for one Triton server (see :class:`Settings`)."""
    settings = settings or Settings.from_environment()
    backend = Backend(settings.triton_url, settings.checkpoint, settings.timeout_s)
    slots = Slots(settings.max_concurrent)
    app = FastAPI(
        title="codegen OpenAI-compatible API",
        summary="OpenAI completions in front of the Triton code-completion ensemble",
        docs_url=None,  # Swagger UI loads its assets from the internet
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.backend = backend
    app.state.slots = slots
    playground = resources.files("openai_api").joinpath("static/playground.html").read_text()

    def error_response(error: OpenAIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if error.status == 503 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(OpenAIError(exc.status_code, str(exc.detail), code="not_found"))

    def check_key(request: Request) -> None:
        if settings.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not token.strip():
            raise OpenAIError(
                401,
                "no API key given: send `Authorization: Bearer <key>` with the key the server "
                f"was started with ({API_KEY_VARIABLE})",
                code="invalid_api_key",
            )
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), settings.api_key.encode()
        ):
            raise OpenAIError(
                401,
                f"incorrect API key: use the key the server was started with ({API_KEY_VARIABLE})",
                code="invalid_api_key",
            )

    async def call(function: Callable[..., Any], *args: Any) -> Any:
        try:
            return await run_in_threadpool(function, *args)
        except Exception as exc:
            raise from_client_error(exc, settings.triton_url) from exc

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(playground)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Ready when Triton says so and a one-token completion goes through both paths (503
        otherwise, saying why)."""
        try:
            state = await call(backend.health)
        except OpenAIError as exc:
            return error_response(exc)
        problem = await run_in_threadpool(backend.serves) if state.serving else "not ready"
        body = {
            "status": "ok" if problem is None else "unavailable",
            "triton": state.url,
            "triton_version": state.server_version,
            "models": {m.name: m.state for m in state.models},
            "streaming": state.model_ready(STREAM_MODEL),
            "prompt_token_count": backend.counter.state,
        }
        if problem is not None:
            body["reason"] = problem
        return JSONResponse(body, status_code=200 if problem is None else 503)

    @app.get("/health/live", include_in_schema=False)
    async def live() -> dict[str, str]:
        """The process answers (Kubernetes' liveness probe: Triton's state does not matter)."""
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        """The one model that completes, under one name (``aliases``: the other names it
        answers to), once Triton serves the completion ensemble: a client that takes the first
        model listed can complete with it. Triton's other models (the stages, the engine) are
        not models a client can ask for; ``/health`` lists them."""
        check_key(request)
        state = await call(backend.health)
        ready = state.model_ready(ENSEMBLE_MODEL)
        entry = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "codegen"}
        return {
            "object": "list",
            "data": [{**entry, "aliases": list(MODEL_ALIASES)}] if ready else [],
        }

    async def completions(request: Request, path_model: str | None) -> Response:
        check_key(request)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OpenAIError(400, "the request body is not valid JSON") from None
        job = parse_completion(body, path_model, settings.max_choices)
        slots.acquire()
        if job.stream:
            return await stream_completion(job)  # releases the slot when the stream ends
        try:
            results = await asyncio.gather(
                *(call(backend.complete, r, job.stops) for r in job.requests)
            )
        finally:
            slots.release()
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": job.model,
                "choices": [
                    {
                        "text": (job.prompt_of(i) if job.echo else "") + result.text,
                        "index": i,
                        "logprobs": _logprobs(result),
                        "finish_reason": result.finish_reason,
                    }
                    for i, result in enumerate(results)
                ],
                "usage": _job_usage(job, results),
            }
        )

    async def stream_completion(job: CompletionJob) -> Response:
        choices: list[_StreamedChoice] = []
        released = False

        def cleanup() -> None:
            nonlocal released
            for choice in choices:
                choice.abandon()
            if not released:
                released = True
                slots.release()

        try:
            for i, request in enumerate(job.requests):
                choices.append(
                    _StreamedChoice(i, await call(backend.open_stream, request, job.stops))
                )
            # the first text of every choice before any byte is sent: a refused request (a
            # prompt over the context, say) still gets its status code
            await asyncio.gather(*(call(choice.stream.prime) for choice in choices))
        except BaseException:
            cleanup()
            raise
        completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(index: int, text: str, result: ChoiceResult | None = None) -> bytes:
            return _sse(
                {
                    "id": completion_id,
                    "object": "text_completion",
                    "created": created,
                    "model": job.model,
                    "choices": [
                        {
                            "text": text,
                            "index": index,
                            "logprobs": _logprobs(result) if result else None,
                            "finish_reason": result.finish_reason if result else None,
                        }
                    ],
                }
            )

        async def events() -> AsyncIterator[bytes]:
            queue: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            if job.echo:
                for choice in choices:
                    yield chunk(choice.index, job.prompt_of(choice.index))
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
                    yield _sse(from_client_error(value, settings.triton_url).body())
                    return  # no [DONE]: the stream failed
                else:
                    running -= 1
            if job.include_usage:
                ordered = [results[i] for i in range(len(choices))]
                yield _sse(
                    {
                        "id": completion_id,
                        "object": "text_completion",
                        "created": created,
                        "model": job.model,
                        "choices": [],
                        "usage": _job_usage(job, ordered),
                    }
                )
            yield _sse("[DONE]")

        return _EventStream(events(), cleanup)

    @app.post("/v1/completions")
    async def create_completion(request: Request) -> Response:
        """OpenAI's completions endpoint (streamed with ``"stream": true``)."""
        return await completions(request, None)

    @app.post("/v1/engines/{engine}/completions")
    async def create_engine_completion(engine: str, request: Request) -> Response:
        """The older engines route that Copilot-style editor plugins call."""
        return await completions(request, engine)

    return app
