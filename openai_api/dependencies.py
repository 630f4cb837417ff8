"""What every route shares, reached through FastAPI dependencies: the app's state (settings,
the Triton backend, the in-flight limit), the API key check, and calls into the blocking client
library from a worker thread."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from openai_api.errors import OpenAIError, from_client_error
from openai_api.generation import Backend
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


@dataclass
class ApiState:
    """One app's state (``app.state.api``): built once by :func:`openai_api.create_app`."""

    settings: Settings
    backend: Backend
    slots: Slots
    playground: str
    chat: Any = None  # openai_api.chat.ChatSource: the served model's chat template

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in a worker thread; a client-library error becomes the
        OpenAI error it maps to."""
        try:
            return await run_in_threadpool(function, *args)
        except Exception as exc:
            raise from_client_error(exc, self.settings.triton_url) from exc


async def api_state(request: Request) -> ApiState:
    # async, as authorized: FastAPI runs a plain-def dependency on a worker thread, a hand-off
    # each way in every request's first token
    return request.app.state.api


def error_response(error: OpenAIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status == 503 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def authorized(request: Request, api: Annotated[ApiState, Depends(api_state)]) -> ApiState:
    """The state, once the request carries the API key (when the server has one)."""
    key = api.settings.api_key
    if key is None:
        return api
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if not token.strip():
        raise OpenAIError(
            401,
            "no API key given: send `Authorization: Bearer <key>` with the key the server "
            f"was started with ({API_KEY_VARIABLE})",
            code="invalid_api_key",
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise OpenAIError(
            401,
            f"incorrect API key: use the key the server was started with ({API_KEY_VARIABLE})",
            code="invalid_api_key",
        )
    return api


State = Annotated[ApiState, Depends(api_state)]
Authorized = Annotated[ApiState, Depends(authorized)]
