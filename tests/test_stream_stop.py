"""A stream stops on a stop request with its id (``stop`` true), as a unary request does: a way
to stop a generation that does not depend on Triton passing a gRPC stream's cancellation on
(r24.10 has a race that can lose it). The client library sends one when it leaves a stream
early (on the engine model, which it streams from); a raw client of ``ensemble_stream`` sends
one there.

By construction: the engine is held once the stream's first piece was read, so its 400 tokens
cannot all be generated before the stop arrives, however fast the machine is."""

from __future__ import annotations

import queue
import uuid

import tritonclient.grpc as grpcclient
from engine_hold import engine_held, wait_for
from server_metrics import engine_counters, sample, scrape, settled_scrape

from client import CodegenClient, CompletionRequest
from client.request import requested_outputs, stop_inputs
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, STREAM_MODEL

PROMPT = "def fib(n):\n"


def _open_stream(server, request_id: str) -> tuple[grpcclient.InferenceServerClient, queue.Queue]:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(
        STREAM_MODEL,
        CompletionRequest((PROMPT,), max_tokens=400).infer_inputs(grpcclient),
        outputs=requested_outputs(grpcclient),
        request_id=request_id,
    )
    return client, answers


def _stop(server, request_id: str) -> tuple[object, object]:
    """Send a stop request on a stream of its own; its one answer."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(
        STREAM_MODEL,
        stop_inputs(grpcclient),
        request_id=request_id,
        enable_empty_final_response=True,
    )
    try:
        return answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()


def test_a_stop_request_ends_the_stream_with_its_id(server):
    request_id = f"stop-stream-{uuid.uuid4().hex}"
    before = engine_counters(server)
    # the engine holds after a few steps: the stream is still generating when the stop
    # comes, however fast the engine runs ahead of its reader
    with engine_held(server, after_steps=4):
        client, answers = _open_stream(server, request_id)
        _, error = answers.get(timeout=120)
        assert error is None, error
        result, error = _stop(server, request_id)
        assert error is None, error
        assert result.get_response().parameters["triton_final_response"].bool_param
    # the stream ends with an error naming the stop, after the pieces already on their way
    while (answer := answers.get(timeout=120))[1] is None:
        pass
    assert "stopped" in answer[1].message() and request_id in answer[1].message()
    client.stop_stream()
    client.close()
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the stopped stream",
    )


def test_a_stop_request_for_no_stream_is_refused(server):
    _, error = _stop(server, f"nothing-{uuid.uuid4().hex}")
    assert error is not None and "no request with id" in error.message()


def test_the_client_library_sends_a_stop_when_it_leaves_a_stream(server):
    def executions() -> float:
        return sample(scrape(server), "nv_inference_exec_count", ENGINE_MODEL) or 0

    before = engine_counters(server)
    # the engine holds after a few steps (the stream still generating when it is left), and
    # nothing moves but what this test sends
    with (
        CodegenClient(server.grpc_url, "grpc", timeout=120) as codegen,
        engine_held(server, after_steps=4),
    ):
        stream = codegen.stream(PROMPT, max_tokens=400)
        next(stream)
        started = sample(settled_scrape(server), "nv_inference_exec_count", ENGINE_MODEL)
        stream.close()  # sends the stop request and waits (a little) for its answer
        wait_for(
            lambda: executions() == started + 1,  # Triton counts it once execute returned
            "the stop request never ran in the engine model",
        )
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the stream its client left",
    )
