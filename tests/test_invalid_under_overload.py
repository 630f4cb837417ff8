"""A request the engine would refuse is refused by the model that receives it, before it can
wait in the engine's queue behind valid work: under overload that wait used to outlast the
queue's timeout, and the client got "Request timeout expired" instead of what was wrong.

By construction: the engine is held (tests/engine_hold.py), so no valid work moves and an
answer can only come from the model in front of it."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from engine_hold import engine_held
from test_unary_cancel import stage_inputs
from tritonclient.utils import InferenceServerException

from client.request import CompletionRequest, requested_outputs
from contract.tensors import MODEL_STAGE, STREAM_MODEL


def test_invalid_requests_are_refused_while_the_engine_is_held(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with engine_held(server):
        with pytest.raises(InferenceServerException, match="exceeds the model's context"):
            client.infer(MODEL_STAGE, stage_inputs([5, 6, 7, 8], 5000), client_timeout=60)
        with pytest.raises(InferenceServerException, match="beam_width=64 is over"):
            client.infer(
                MODEL_STAGE,
                [*stage_inputs([5, 6, 7], 4), _uint32("beam_width", 64)],
                client_timeout=60,
            )
        # the streaming model, after its own tokenization
        answers: queue.Queue = queue.Queue()
        stream = grpcclient.InferenceServerClient(server.grpc_url)
        stream.start_stream(callback=lambda result, error: answers.put((result, error)))
        stream.async_stream_infer(
            STREAM_MODEL,
            CompletionRequest(("def f(x):\n",), max_tokens=5000).infer_inputs(grpcclient),
            outputs=requested_outputs(grpcclient),
        )
        _, error = answers.get(timeout=60)
        stream.stop_stream()
        assert error is not None and "exceeds the model's context" in str(error), error


def _uint32(name: str, value: int):
    tensor = grpcclient.InferInput(name, [1, 1], "UINT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.uint32))
    return tensor
