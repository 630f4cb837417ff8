"""The ensemble's contract, in one neutral place: tensors, request options, word lists, metrics.

It imports nothing of this project and nothing of torch, Triton's python backend or the client;
the engine, the stages, the client, the load test and the tests import it.
"""

from contract.options import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SAMPLING,
    InvalidRequestError,
    SamplingParams,
)

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_SAMPLING", "InvalidRequestError", "SamplingParams"]
