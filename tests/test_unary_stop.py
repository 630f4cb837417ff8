"""A raw client of the unary ensemble stops its own generation: a second request with the same
request id and ``stop`` true (TensorRT-LLM's convention). Triton 2.51 does not pass a client's
cancellation of a unary ensemble request on to the step already running, so this is how a
client that gives up stops the work (docs/api.md, "Stopping a request").

By construction: the engine is held (the request waits at its door, in the model stage), and the
stop request is answered while it is held, so the generation of 500 tokens cannot have finished
first on however fast a machine, whatever the model generates."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from engine_hold import engine_held, wait_for
from server_metrics import cancels_sent, engine_counters, sample, scrape
from tritonclient.utils import InferenceServerException

from client import CompletionRequest
from client.request import stop_inputs
from contract import metrics as names
from contract.tensors import ENSEMBLE_MODEL, MODEL_STAGE

PROMPT = "def fib(n):\n"


def in_flight(server) -> float:
    return sample(scrape(server), names.CALLS_IN_FLIGHT, MODEL_STAGE) or 0.0


def test_a_stop_request_ends_the_unary_request_with_its_id(server):
    asked = 500
    request_id = f"stop-me-{uuid.uuid4().hex}"
    outcome: dict[str, object] = {}

    def generate() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        request = CompletionRequest((PROMPT,), max_tokens=asked)
        try:
            outcome["result"] = client.infer(
                ENSEMBLE_MODEL, request.infer_inputs(grpcclient), request_id=request_id
            )
        except InferenceServerException as exc:
            outcome["error"] = exc.message()

    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        thread = threading.Thread(target=generate)
        thread.start()
        wait_for(lambda: in_flight(server) >= 1, "the unary request never reached gptj")
        # the stop request: same id, stop true, any prompt (it is answered with nothing
        # generated); over HTTP here, to show it needs no gRPC
        stopper = httpclient.InferenceServerClient(server.http_url)
        answer = stopper.infer(ENSEMBLE_MODEL, stop_inputs(httpclient, "x"), request_id=request_id)
        assert answer.as_numpy("OUTPUT_0").reshape(-1)[0].decode() == "x"
        assert cancels_sent(server, MODEL_STAGE) == sent_before + 1
    thread.join(timeout=60)
    assert not thread.is_alive(), "the stopped request never ended"
    assert "result" not in outcome, "the stopped request was answered as if it had finished"
    assert "stopped: a stop request for request id" in str(outcome["error"])
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the stopped sequence",
    )
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert after[names.ENGINE_CANCELLED] - before[names.ENGINE_CANCELLED] == 1
    assert generated < asked, f"{generated:.0f} of {asked} tokens generated after the stop"


def test_a_stop_request_that_names_nothing_generating_is_refused(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="no request with id 'nothing-here'"):
        client.infer(ENSEMBLE_MODEL, stop_inputs(grpcclient, "x"), request_id="nothing-here")


def test_a_stop_request_without_an_id_is_refused(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="needs the request id"):
        client.infer(ENSEMBLE_MODEL, stop_inputs(grpcclient, "x"))


def test_stop_false_is_an_ordinary_request(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    request = CompletionRequest((PROMPT,), max_tokens=4)
    inputs = request.infer_inputs(grpcclient)
    flag = grpcclient.InferInput("stop", [1, 1], "BOOL")
    flag.set_data_from_numpy(np.array([[False]]))
    result = client.infer(ENSEMBLE_MODEL, [*inputs, flag], request_id="not-a-stop")
    assert result.as_numpy("sequence_length").reshape(-1)[0] > 0
