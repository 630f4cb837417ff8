"""The API's routes: the playground, health, models and OpenAI's completions endpoints.

The client library blocks, so every call to Triton runs in a worker thread: non-streamed
choices through Starlette's thread pool while the request watches for its client leaving
(:mod:`openai_api.completions`), each streamed choice in its own thread that feeds an asyncio
queue (:mod:`openai_api.streaming`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from client import ENSEMBLE_MODEL, STREAM_MODEL
from openai_api.capabilities import takes_suffix
from openai_api.completions import (
    CLIENT_CLOSED_REQUEST,
    ClientLeftError,
    run_choices,
    warmed,
    with_context,
)
from openai_api.dependencies import ApiState, Authorized, State, error_response
from openai_api.errors import OpenAIError
from openai_api.request import MODEL_ALIASES, MODEL_NAME, parse_completion
from openai_api.shapes import job_usage, logprobs
from openai_api.streaming import stream_completion

router = APIRouter()


async def read_json(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise OpenAIError(400, "the request body is not valid JSON") from None


@router.get("/", include_in_schema=False)
async def index(api: State) -> HTMLResponse:
    return HTMLResponse(api.playground)


@router.get("/health")
async def health(api: State) -> JSONResponse:
    """Ready when Triton says so and a one-token completion goes through both paths (503
    otherwise, saying why)."""
    try:
        state = await api.call(api.backend.health)
    except OpenAIError as exc:
        return error_response(exc)
    problem = await run_in_threadpool(api.backend.serves) if state.serving else "not ready"
    body = {
        "status": "ok" if problem is None else "unavailable",
        "triton": state.url,
        "triton_version": state.server_version,
        "models": {m.name: m.state for m in state.models},
        "streaming": state.model_ready(STREAM_MODEL),
    }
    if problem is not None:
        body["reason"] = problem
    return JSONResponse(body, status_code=200 if problem is None else 503)


@router.get("/health/live", include_in_schema=False)
async def live() -> dict[str, str]:
    """The process answers (Kubernetes' liveness probe: Triton's state does not matter)."""
    return {"status": "ok"}


@router.get("/v1/models")
async def models(api: Authorized) -> dict[str, Any]:
    """The one model that completes, under one name (``aliases``: the other names it answers
    to), once Triton serves the completion ensemble: a client that takes the first model
    listed can complete with it. Triton's other models (the stages, the engine) are not models
    a client can ask for; ``/health`` lists them. ``fim``: whether it takes a ``suffix`` (true
    or false; null when Triton could not say), asked of Triton (:mod:`.capabilities`);
    ``chat``: whether ``/v1/chat/completions`` takes it (it has a chat template, read from the
    API's checkpoint once that is checked to be the served one: :mod:`openai_api.chat`)."""
    state = await api.call(api.backend.health)
    if not state.model_ready(ENSEMBLE_MODEL):
        return {"object": "list", "data": []}
    fim = await run_in_threadpool(takes_suffix, api.settings.triton_url)
    chat = await api.call(api.chat.available)
    entry = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "codegen"}
    entry.update({"aliases": list(MODEL_ALIASES), "fim": fim, "chat": chat})
    return {"object": "list", "data": [entry]}


async def completions(api: ApiState, request: Request, path_model: str | None) -> Response:
    job = parse_completion(await read_json(request), path_model, api.settings.max_choices)
    api.slots.acquire()
    try:
        first, context = await with_context(api, job.requests[0], job.chunks)
    except BaseException:
        api.slots.release()
        raise
    if job.chunks:  # one prompt (parse_completion checks), its n choices
        job = replace(job, requests=tuple(replace(r, prompts=first.prompts) for r in job.requests))
    if job.stream:
        return await stream_completion(api, request, job, context)  # releases the slot at the end
    try:
        results = await run_choices(api, request, job.requests, job.stops)
    except ClientLeftError:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        api.slots.release()
    if job.warm_only:
        results = [warmed(result) for result in results]
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
                    "logprobs": logprobs(result),
                    "finish_reason": result.finish_reason,
                }
                for i, result in enumerate(results)
            ],
            "usage": {**job_usage(job, results), **context.usage()},
        }
    )


@router.post("/v1/completions")
async def create_completion(request: Request, api: Authorized) -> Response:
    """OpenAI's completions endpoint (streamed with ``"stream": true``)."""
    return await completions(api, request, None)


@router.post("/v1/engines/{engine}/completions")
async def create_engine_completion(engine: str, request: Request, api: Authorized) -> Response:
    """The older engines route that Copilot-style editor plugins call."""
    return await completions(api, request, engine)
