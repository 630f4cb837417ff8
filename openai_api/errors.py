"""OpenAI's error shape, and how the client library's exceptions map onto its status codes."""

from __future__ import annotations

import re
from typing import Any

from client import CodegenError, InvalidRequestError, ServerUnavailableError
from contract.fim import NO_FIM_START

# The contract's option names (which the client library's messages use) -> OpenAI's.
CONTRACT_TO_OPENAI = {
    "runtime_top_p": "top_p",
    "runtime_top_k": "top_k",
    "random_seed": "seed",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_tokens",
    "prompt": "prompt",
    "n_indent": "n_indent",  # the editor stop rules, read under their own names
    "t_max_predict_ms": "t_max_predict_ms",
}
CONTEXT_OVERFLOW = "exceeds the model's context"
_OVERLOAD_HINTS = ("exceeds maximum queue size", "resource_exhausted", "overload")


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_option(param: str, message: str) -> OpenAIError:
    """400 naming the option the client should change."""
    return OpenAIError(400, message, param=param, code="invalid_value")


def from_invalid_request(exc: InvalidRequestError) -> OpenAIError:
    """A refusal of :class:`client.CompletionRequest`, reworded with OpenAI's option name."""
    message = str(exc)
    first = re.match(r"\w+", message)
    name = first.group(0) if first else ""
    param = CONTRACT_TO_OPENAI.get(name)
    if param is not None and param != name:
        message = param + message[len(name) :]
    elif param is None and "prompt" in message:
        param = "prompt"
    return bad_option(param or "", message) if param else OpenAIError(400, message)


def from_client_error(exc: BaseException, triton_url: str) -> OpenAIError:
    """Map what the client library raised to a status code a caller can act on."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return from_invalid_request(exc)
    if isinstance(exc, ServerUnavailableError):
        return OpenAIError(
            503,
            f"the model server (Triton at {triton_url}) is unavailable ({exc.reason}); retry "
            "later, or start it with `make triton` (`make api` starts one when none answers)",
            type_="server_error",
            code="model_server_unavailable",
        )
    message = str(exc)
    lowered = message.lower()
    if NO_FIM_START in message:  # the server's tokenizer decides, so it refuses in the stream
        return bad_option("suffix", message[message.index(NO_FIM_START) :])
    if CONTEXT_OVERFLOW in message:
        return OpenAIError(
            413,
            f"{message}. Shorten the prompt or lower max_tokens.",
            param="prompt",
            code="context_length_exceeded",
        )
    if any(hint in lowered for hint in _OVERLOAD_HINTS):
        return OpenAIError(
            503,
            f"the model server is overloaded ({message}); retry later",
            type_="server_error",
            code="overloaded",
        )
    if isinstance(exc, CodegenError) and message.startswith("no answer from"):
        return OpenAIError(504, message, type_="server_error", code="timeout")
    if isinstance(exc, CodegenError):
        return OpenAIError(
            500, f"the model server failed the request: {message}", type_="server_error"
        )
    return OpenAIError(500, f"{type(exc).__name__}: {exc}", type_="server_error")
