"""Client side of the code-completion ensemble: the tensor contract, a library and a command.

``from client import CodegenClient`` needs no running server, and neither torch nor a
checkpoint: ``tritonclient`` is imported on the first request.
"""

from client.client import (
    DEFAULT_PORTS,
    PROTOCOLS,
    CodegenClient,
    CodegenError,
    Completion,
    CompletionStream,
    Health,
    ModelStatus,
    SamplingOptions,
    ServerUnavailable,
    ServerUnavailableError,
    StreamCancelledError,
    Target,
    TimedOutError,
    resolve_target,
    split_completion,
)
from client.request import CompletionRequest
from contract.options import InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL

__all__ = [
    "DEFAULT_PORTS",
    "ENSEMBLE_MODEL",
    "PROTOCOLS",
    "STREAM_MODEL",
    "CodegenClient",
    "CodegenError",
    "Completion",
    "CompletionRequest",
    "CompletionStream",
    "Health",
    "InvalidRequestError",
    "ModelStatus",
    "SamplingOptions",
    "ServerUnavailable",
    "ServerUnavailableError",
    "StreamCancelledError",
    "Target",
    "TimedOutError",
    "resolve_target",
    "split_completion",
]
