"""Client side of the code-completion ensemble: the tensor contract, a library and a command.

``from client import CodegenClient`` needs no running server, and neither torch nor a
checkpoint: ``tritonclient`` is imported on the first request.
"""

from client.client import CodegenClient
from client.request import CompletionRequest
from client.results import (
    DEFAULT_PORTS,
    PROTOCOLS,
    CodegenError,
    Completion,
    Health,
    ModelStatus,
    SamplingOptions,
    ServerUnavailable,
    ServerUnavailableError,
    Target,
    TimedOutError,
    resolve_target,
    split_completion,
)
from client.stream import CompletionStream
from client.transport import StreamCancelledError, Transport
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
    "Transport",
    "resolve_target",
    "split_completion",
]
