"""The API server's settings: command-line flags, with environment variables as defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from serving.paths import DEFAULT_CHECKPOINT

API_KEY_VARIABLE = "CODEGEN_API_KEY"
# The prompt tokens (repository context + prefix + suffix + max_tokens) a request with
# input_extra may reach before its last chunks are dropped: a cold prefill of 2,048 tokens takes
# about a second on 2 cores (docs/api.md, "Repository context")
DEFAULT_CONTEXT_TOKENS = 2048


@dataclass(frozen=True)
class Settings:
    """How the API reaches Triton and what it lets clients do.

    ``triton_url``: Triton's gRPC endpoint (``host:port`` or ``grpc://host:port``).
    ``api_key``: when set, every ``/v1`` request needs ``Authorization: Bearer <key>``.
    ``checkpoint``: the served checkpoint's folder; its tokenizer counts prompt tokens so that
    non-streamed requests can use the unary ``ensemble`` (see :mod:`openai_api.generation`).
    ``max_concurrent``: requests in flight at once; more are answered 503 at once rather than
    queued where nobody sees them. ``max_choices``: the largest ``n`` (times prompts) accepted.
    ``context_tokens``: the prompt budget of a request with repository context
    (:mod:`openai_api.repo_context`), within the model's own context.
    """

    triton_url: str = "localhost:8001"
    api_key: str | None = None
    checkpoint: Path | None = DEFAULT_CHECKPOINT
    max_concurrent: int = 128
    max_choices: int = 16
    timeout_s: float = 600.0
    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    @classmethod
    def from_environment(cls, **overrides: object) -> Settings:
        """Defaults from TRITON_URL and CODEGEN_API_KEY (or a file named by
        CODEGEN_API_KEY_FILE, as Kubernetes mounts a Secret; an absent file means no key), then
        ``overrides`` (None = keep)."""
        key = os.environ.get(API_KEY_VARIABLE) or None
        key_file = os.environ.get(API_KEY_VARIABLE + "_FILE")
        if key is None and key_file and Path(key_file).is_file():
            key = Path(key_file).read_text().strip() or None
        values: dict[str, object] = {
            "triton_url": os.environ.get("TRITON_URL") or cls.triton_url,
            "api_key": key,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
