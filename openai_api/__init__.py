"""An OpenAI-compatible completions API in front of the Triton ensemble, and a web playground.

A thin HTTP layer (FastAPI + uvicorn) over the client library: every request is built by
:class:`client.CompletionRequest`, so options are refused with the same rules and words as the
server's, and sent over gRPC by :class:`client.CodegenClient`.

    python -m openai_api --port 8080 --triton localhost:8001      # or: make api

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/engines/{engine}/completions``, ``GET /v1/models``, llama.cpp's ``POST /infill``,
``GET /health`` and the playground at ``/``. See README.md ("OpenAI-compatible API").
"""

from openai_api.app import create_app
from openai_api.settings import Settings

__all__ = ["Settings", "create_app"]
