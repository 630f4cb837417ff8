"""One engine per server: the unary path (``ensemble`` -> ``gptj``, or ``gptj`` directly) and
the streaming path (``ensemble_stream``, a one-step ensemble over the ``engine`` model, or the
engine model directly) both run on the ``engine`` model, so the checkpoint is loaded once and a
unary and a streamed request share one running batch. Also the channel that passes ``gptj``'s
cancellation on to the engine (a BLS request cannot be cancelled in 2.51)."""

from __future__ import annotations

import queue
import re
import threading

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from server_metrics import sample, scrape, settled_scrape

from backend.cancel import CancelListener, CancelRegistry, CancelSender, new_key
from client.client import CodegenClient
from client.request import CompletionRequest, requested_outputs
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, STREAM_MODEL
from serving.watchdog import model_stubs

PROMPT = "def add(a, b):\n"


def engine_metric(text: str, name: str) -> float:
    value = sample(text, name, ENGINE_MODEL)
    assert value is not None, f"{name} for {ENGINE_MODEL} not in the metrics"
    return value


def test_the_checkpoint_is_loaded_once_by_the_engine_model(server):
    log = server.log_file.read_text()
    loads = re.findall(r"(\w+): serving (\S+) \(", log)
    assert [model for model, _ in loads] == [ENGINE_MODEL], loads
    # every engine metric is the engine model's, and only its
    text = scrape(server)
    labels = set(re.findall(r'^codegen_engine_\w+\{model="([^"]+)"\}', text, re.MULTILINE))
    assert labels == {ENGINE_MODEL}
    # one stub process holds the engine (torch loaded): the others are far smaller
    stubs = model_stubs(server.process.pid)
    assert sorted(stubs.values()).count(ENGINE_MODEL) == 1
    assert "gptj" in stubs.values()
    # a streamed token crosses one stub process, the engine's: the streaming model has none
    assert STREAM_MODEL not in stubs.values()


def test_a_unary_and_a_streamed_request_share_the_running_batch(server):
    """A long stream, and once it runs a unary request through the ensemble: the engine's
    forward passes carry both (more rows than steps), in one engine.

    On a loaded machine the unary request can take longer to reach the engine than the stream
    takes to finish, so up to three tries; two separate engines would never batch them."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    unary = CompletionRequest(PROMPT, max_tokens=32)
    tries = []
    for _ in range(3):
        before = settled_scrape(server)
        answered: queue.Queue = queue.Queue()
        codegen = CodegenClient(server.grpc_url, "grpc", timeout=60)
        with codegen, codegen.stream("x = 1\n", max_tokens=480) as stream:
            next(stream)  # the stream is in the engine now
            grpc.async_infer(
                ENSEMBLE_MODEL,
                unary.infer_inputs(grpcclient),
                callback=lambda result, error, answered=answered: answered.put((result, error)),
                outputs=requested_outputs(grpcclient),
            )
            list(stream)
        result, error = answered.get(timeout=60)
        assert error is None, error
        assert result.as_numpy("OUTPUT_0").reshape(-1)[0].decode().startswith(PROMPT)
        after = settled_scrape(server)

        def delta(name: str, after=after, before=before) -> float:
            return engine_metric(after, name) - engine_metric(before, name)

        assert delta(names.ENGINE_REQUESTS) == 2
        tries.append((delta(names.ENGINE_STEP_ROWS), delta(names.ENGINE_STEPS)))
        if tries[-1][0] > tries[-1][1]:
            break
    assert tries[-1][0] > tries[-1][1], f"(rows, steps) of each try: {tries}: never batched"


# -- the cancel channel, without Triton ---------------------------------------------------------


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_the_registry_cancels_every_row_of_a_key_and_only_its_own():
    registry = CancelRegistry()
    mine, mine_too, other = FakeHandle(), FakeHandle(), FakeHandle()
    registry.track("a", mine)
    registry.track("a", mine_too)
    registry.track("b", other)
    assert registry.cancel("a") == 2
    assert mine.cancelled and mine_too.cancelled and not other.cancelled
    registry.forget("a")
    registry.forget("b")
    assert registry.open == 0
    registry.track("", FakeHandle())  # a request without an id is not tracked
    assert registry.open == 0


def test_a_cancellation_that_arrives_before_its_request_still_cancels_it():
    """The caller's client can go away while its engine request still waits in Triton's
    queue: the key is remembered and the request dropped once it is submitted."""
    registry = CancelRegistry(remember=2)
    assert registry.cancel("early") == 0
    late = FakeHandle()
    registry.track("early", late)
    assert late.cancelled
    for key in ("x", "y", "z"):  # only the last `remember` early keys are kept
        registry.cancel(key)
    registry.track("x", forgotten := FakeHandle())
    assert not forgotten.cancelled


def test_a_cancel_datagram_reaches_the_listener_of_its_server_and_model():
    received: list[str] = []
    arrived = threading.Event()

    def on_cancel(key: str) -> None:
        received.append(key)
        arrived.set()

    pid = psutil.Process().pid  # stands for the tritonserver both ends are children of
    listener = CancelListener("engine-test", on_cancel, server_pid=pid)
    other_server = CancelSender("engine-test", server_pid=pid + 1)
    sender = CancelSender("engine-test", server_pid=pid)
    try:
        key = new_key()
        assert not other_server.cancel(key)  # nobody listens there: reported, not raised
        assert sender.cancel(key)
        assert arrived.wait(5)
        assert received == [key]
    finally:
        sender.close()
        other_server.close()
        listener.close()


@pytest.mark.parametrize("count", [1000])
def test_keys_are_unique(count):
    assert len({new_key() for _ in range(count)}) == count


def test_a_stream_that_asks_for_one_output_gets_only_that_output(server):
    """Responses carry only the requested outputs: the python backend r24.10 stub would drop
    the others in ``send`` without holding the GIL (README, "Python backend r24.10 and
    threads")."""
    answers: queue.Queue = queue.Queue()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        request = CompletionRequest(PROMPT, max_tokens=8)
        grpc.async_stream_infer(
            "ensemble_stream",
            request.infer_inputs(grpcclient),
            outputs=[grpcclient.InferRequestedOutput("OUTPUT_0")],
            enable_empty_final_response=True,
        )
        pieces = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            names_sent = {output.name for output in response.outputs}
            assert names_sent <= {"OUTPUT_0"}, names_sent
            if names_sent:
                pieces.append(result.as_numpy("OUTPUT_0").reshape(-1)[0].decode())
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        grpc.stop_stream()
    assert pieces and "".join(pieces)


def test_the_engine_model_takes_the_model_stage_tensors_that_gptj_forwards(server):
    """gptj's call carries its own typed inputs, unchanged: the engine model answers them with
    the same greedy tokens as gptj does, and refuses a request that also sends text."""
    from test_unary_cancel import stage_inputs

    from contract.tensors import MODEL_STAGE

    client = grpcclient.InferenceServerClient(server.grpc_url)
    ids = [5, 6, 7, 8]
    outputs = [grpcclient.InferRequestedOutput("output_ids")]
    through_gptj = client.infer(MODEL_STAGE, stage_inputs(ids, 6), outputs=outputs)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(ENGINE_MODEL, stage_inputs(ids, 6), outputs=outputs)
        result, error = answers.get(timeout=60)
        assert error is None, error
        direct = result.as_numpy("output_ids")
        assert direct.tolist() == through_gptj.as_numpy("output_ids").tolist()
        assert direct[0, 0, : len(ids)].tolist() == ids
        text = grpcclient.InferInput("INPUT_0", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"def f():"]], dtype=np.object_))
        client.async_stream_infer(ENGINE_MODEL, [*stage_inputs(ids, 6), text], outputs=outputs)
        _, error = answers.get(timeout=60)
        assert error is not None and "input_ids (token ids) and INPUT_0 (text)" in str(error)
    finally:
        client.stop_stream()
