"""Stopping a request on its client's word: TensorRT-LLM's convention, a second request with
the same request id and ``stop`` true (docs/api.md, "Stopping a request").

Triton 2.51 does not pass a unary ensemble request's cancellation on to the step already
running (and HTTP has none). So the client of ``gptj`` or of the ``ensemble`` names the request
to stop; ``gptj`` cancels its engine calls with that id through the engine's cancel channel
(:meth:`backend.engine_calls.EngineCalls.stop_client_requests`). A stream's stop request goes
to the engine itself (backend/engine_stage.py, ``NamedStreams``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from backend.io import FINAL, error_response, response
from contract.finish import CANCELLED
from engine.interface import GenerationResult
from engine.tensors import tensors_from_results

if TYPE_CHECKING:
    from backend.engine_calls import EngineCalls


def client_request_id(request) -> str:
    """The id the client gave its request (the ensemble passes it on to its steps): what a
    stop request names. Empty when none was given."""
    try:
        return request.request_id() or ""
    except Exception:  # an id Triton cannot hand over as text
        return ""


def stop_named(stop: Callable[[str], int], sender, client_id: str) -> bool:
    """Stop what generates under ``client_id`` (``stop`` does, and says how many there were);
    False when there was nothing (the stop request then got an error saying why, flagged
    final)."""
    if not client_id:
        sender.send(
            error_response(
                "stop=true needs the request id of the request to stop: send this request "
                "with that id (gRPC/HTTP `id`)"
            ),
            flags=FINAL,
        )
        return False
    if stop(client_id) == 0:
        sender.send(
            error_response(
                f"stop=true: no request with id {client_id!r} is generating here (it ended, "
                "or never reached this model)"
            ),
            flags=FINAL,
        )
        return False
    return True


def answer_stop(
    calls: EngineCalls,
    sender,
    arrays: Mapping[str, np.ndarray],
    client_id: str,
    requested: frozenset[str] | None = None,
) -> None:
    """A stop request (``stop`` true): stop the unary requests generating under its request
    id, whose clients then get an error saying so, and answer it at once with nothing
    generated (its own prompt), or with an error when there was nothing to stop."""
    if not stop_named(calls.stop_client_requests, sender, client_id):
        return
    lengths = arrays["input_lengths"].reshape(-1).tolist()
    results = [
        GenerationResult(row[:length].tolist(), [], [], CANCELLED)
        for row, length in zip(arrays["input_ids"], lengths, strict=True)
    ]
    sender.send(response(tensors_from_results(results, False), requested), flags=FINAL)
