"""A unary request whose client gives up (a gRPC deadline) stops generating: the model stage
asks Triton every quarter second whether its request was cancelled and, if so, tells the engine
model to drop it (backend/cancel.py: a BLS request cannot be cancelled in Triton 2.51).

Through the ``ensemble`` Triton 2.51 does not pass the cancellation on to a step already
running (the ensemble only stops before its next step), so the model stage cannot see it there;
the README says so. What a client of the stage itself (or of the streaming model) gets is
tested here and in test_client.py."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from engine_hold import engine_held, wait_for
from server_metrics import cancels_sent, engine_counters
from tritonclient.utils import InferenceServerException

from contract import metrics as names
from contract.tensors import MODEL_STAGE


def stage_inputs(prompt_ids: list[int], asked: int) -> list:
    """The model stage's own tensors (a client of ``gptj`` itself, as a BLS caller would be)."""
    arrays = {
        "input_ids": np.array([prompt_ids], dtype=np.uint32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.uint32),
        "request_output_len": np.array([[asked]], dtype=np.uint32),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "UINT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_a_unary_client_that_times_out_stops_its_generation(server):
    """By construction: the engine is held still until the model stage has passed the
    client's deadline on (its cancellations counter moved), so the generation of 500 tokens
    cannot have finished first, on however fast a machine."""
    asked = 500
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer(MODEL_STAGE, stage_inputs([5, 6, 7, 8], asked), client_timeout=0.2)
        wait_for(
            lambda: cancels_sent(server, MODEL_STAGE) > sent_before,
            "the model stage never passed the client's deadline on to the engine",
        )
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_REQUESTS] > before[names.ENGINE_REQUESTS],
        "the abandoned sequence never finished",
    )
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert after[names.ENGINE_CANCELLED] - before[names.ENGINE_CANCELLED] == 1
    assert generated < asked, f"{generated:.0f} of {asked} tokens generated for nobody"
