"""The FastAPI application: its state, its error handlers and its routers.

The routes live at module level on routers (:mod:`openai_api.routes`,
:mod:`openai_api.infill`) and reach this app's state through dependencies
(:mod:`openai_api.dependencies`), so one process can hold several apps (the tests do).
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from openai_api.chat import ChatSource
from openai_api.chat import router as chat_router
from openai_api.dependencies import ApiState, Slots, error_response
from openai_api.errors import OpenAIError
from openai_api.generation import Backend
from openai_api.infill import router as infill_router
from openai_api.routes import router
from openai_api.settings import Settings


async def _openai_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return error_response(exc)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(OpenAIError(exc.status_code, str(exc.detail), code="not_found"))


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for one Triton server (see :class:`Settings`)."""
    settings = settings or Settings.from_environment()
    app = FastAPI(
        title="codegen OpenAI-compatible API",
        summary="OpenAI completions in front of the Triton code-completion ensemble",
        docs_url=None,  # Swagger UI loads its assets from the internet
        redoc_url=None,
    )
    app.state.api = ApiState(
        settings=settings,
        backend=Backend(
            settings.triton_url, settings.checkpoint, settings.timeout_s, settings.context_tokens
        ),
        slots=Slots(settings.max_concurrent),
        playground=resources.files("openai_api").joinpath("static/playground.html").read_text(),
    )
    app.state.api.chat = ChatSource(app.state.api.backend)
    # the parts by name too, as before the routes moved to a router
    app.state.settings = app.state.api.settings
    app.state.backend = app.state.api.backend
    app.state.slots = app.state.api.slots
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(router)
    app.include_router(infill_router)
    app.include_router(chat_router)
    return app
