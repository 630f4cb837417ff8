"""A llama.cpp-compatible ``POST /infill``, for editor plugins written for llama-server
(llama.vim, llama.vscode): the text around the cursor in, the middle out.

The request maps onto the project's fill-in-the-middle (``suffix``, docs/fim.md): the text
before the cursor is ``input_prefix``, then ``prompt`` (llama.cpp puts ``prompt`` after its
middle sentinel: it is the start of the middle the user already typed, so it ends the prefix
here); the text after the cursor is ``input_suffix``. ``input_extra`` is repository context,
put before all of it (:mod:`openai_api.repo_context`: whole chunks, first ones first, within a
token budget; what was dropped is reported), and ``n_predict`` 0 only fills the prompt cache
(llama.vim's warm-up). Fields this server cannot honour are refused by name. The answer has
llama.cpp's shape: ``{"content", "stop", ...}``, or with ``stream`` one server-sent event per
piece (``data: {"content": ..., "stop": false}``) and a last one with ``stop`` true and the
counts. A client that leaves stops the generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from client import CompletionRequest
from contract.options import DEFAULT_MAX_TOKENS, InvalidRequestError
from openai_api.completions import (
    CLIENT_CLOSED_REQUEST,
    ClientLeftError,
    run_choices,
    warmed,
    with_context,
)
from openai_api.dependencies import ApiState, authorized
from openai_api.errors import OpenAIError, bad_option, from_client_error
from openai_api.generation import ChoiceResult
from openai_api.repo_context import ContextChunk, FittedContext, parse_chunks
from openai_api.request import EDITOR_FIELDS, MODEL_NAME, editor_options
from openai_api.routes import read_json
from openai_api.shapes import sse
from openai_api.streaming import EventStream, StreamedChoice, primed

router = APIRouter()

FIELDS = frozenset(
    {
        "input_prefix",
        "input_suffix",
        "input_extra",
        "prompt",
        "n_predict",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop",
        "stream",
        "cache_prompt",
        *EDITOR_FIELDS,
        "token_healing",
    }
)


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_option(name, f"{name} must be a string, got {value!r}")
    return value


def _number(body: dict[str, Any], name: str, kinds: tuple[type, ...]) -> Any:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise bad_option(name, f"{name} must be a number, got {value!r}")
    return value


@dataclass(frozen=True)
class InfillJob:
    """A checked ``/infill`` request: the request without its repository context (fitted in
    later: it needs the server's token counts), the chunks, stops and how to answer."""

    request: CompletionRequest
    stops: tuple[str, ...]
    stream: bool
    chunks: tuple[ContextChunk, ...] = ()
    warm_only: bool = False  # n_predict 0: fill the prefix cache, answer nothing


def parse_infill(body: Any) -> InfillJob:
    """The checked request; a 400 naming what is wrong."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_option(
            unknown[0],
            f"{unknown[0]} is not supported by this server's /infill (it takes "
            f"{', '.join(sorted(FIELDS))}); leave it out",
        )
    chunks = parse_chunks(body)
    prefix = _text(body, "input_prefix") + _text(body, "prompt")
    suffix = _text(body, "input_suffix")
    if body.get("cache_prompt", True) is not True:
        raise bad_option(
            "cache_prompt",
            "cache_prompt must be true here: this server's prefix cache (engine/config.pbtxt "
            "prefix_caching) serves every request alike; leave it out",
        )
    n_predict = _number(body, "n_predict", (int,))
    if n_predict is not None and n_predict < 0:
        raise bad_option(
            "n_predict",
            f"n_predict must be 0 (only fill the prompt cache) or a positive number of tokens, "
            f"got {n_predict} (this server generates no unbounded completions)",
        )
    warm_only = n_predict == 0
    seed = _number(body, "seed", (int,))
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_option("stop", "stop must be a list of non-empty strings")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_option("stream", f"stream must be true or false, got {stream!r}")
    if warm_only and stream:
        raise bad_option(
            "stream",
            "n_predict 0 only fills the prompt cache and answers nothing: send stream false",
        )
    options: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if (value := _number(body, name, (int, float))) is not None:
            options[name] = float(value)
    if (top_k := _number(body, "top_k", (int,))) is not None:
        options["top_k"] = top_k
    healing = body.get("token_healing")  # absent: the server's default (on)
    if healing is not None and not isinstance(healing, bool):
        raise bad_option("token_healing", f"token_healing must be true or false, got {healing!r}")
    options["token_healing"] = healing
    try:
        request = CompletionRequest(
            (prefix,),
            # a warm-up computes one token, which is not returned
            max_tokens=1 if warm_only else n_predict or DEFAULT_MAX_TOKENS,
            seed=None if seed is None or seed == -1 else seed,  # -1: llama.cpp's random seed
            stop_words=tuple(stop),
            suffix=suffix or None,
            **options,
            **editor_options(body),
        )
    except InvalidRequestError as exc:
        raise from_client_error(exc, "") from exc
    return InfillJob(request, tuple(stop), stream, chunks, warm_only)


def _final(result: ChoiceResult, context: FittedContext) -> dict[str, Any]:
    """llama.cpp's closing fields: the end, the token counts, and (beyond llama.cpp's) what
    the repository context kept; ``truncated`` when chunks were dropped."""
    final = {
        "stop": True,
        "model": MODEL_NAME,
        "tokens_predicted": result.completion_tokens,
        "tokens_evaluated": result.prompt_tokens,
    }
    if context.chunks_sent:
        final["truncated"] = context.chunks_used < context.chunks_sent
        final["usage"] = context.usage()
    return final


@router.post("/infill")
async def infill(request: Request, api: Annotated[ApiState, Depends(authorized)]) -> Response:
    """Fill in the middle, llama.cpp-style (see the module docstring)."""
    job = parse_infill(await read_json(request))
    api.slots.acquire()
    try:
        completion, context = await with_context(api, job.request, job.chunks)
    except BaseException:
        api.slots.release()
        raise
    if job.stream:
        return await _stream(api, request, completion, context)
    try:
        (result,) = await run_choices(api, request, [completion], job.stops)
    except ClientLeftError:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        api.slots.release()
    if job.warm_only:
        result = warmed(result)
    return JSONResponse({"content": result.text, **_final(result, context)})


async def _stream(
    api: ApiState,
    request: Request,
    completion: CompletionRequest,
    context: FittedContext,
):
    released = False
    choice: StreamedChoice | None = None

    def cleanup() -> None:
        nonlocal released
        if choice is not None:
            choice.abandon()
        if not released:
            released = True
            api.slots.release()

    try:
        choice = StreamedChoice(0, await api.call(api.backend.open_stream, completion))
        await primed(api, request, [choice])
    except ClientLeftError:
        cleanup()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except BaseException:
        cleanup()
        raise

    async def events() -> AsyncIterator[bytes]:
        assert choice is not None
        queue: asyncio.Queue = asyncio.Queue()
        choice.start(asyncio.get_running_loop(), queue)
        while True:
            _, kind, value = await queue.get()
            if kind == "text":
                yield sse({"content": value, "stop": False})
            elif kind == "done":
                yield sse({"content": "", **_final(value, context)})
            elif kind == "error":
                yield sse(from_client_error(value, api.settings.triton_url).body())
                return
            else:
                return

    return EventStream(events(), cleanup)
