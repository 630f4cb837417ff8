"""A unary ``ensemble`` request whose client gives up, on the platform ensemble, on both backends
(issue 39).

Triton 2.51 does not pass a raw client's gRPC deadline on to the ensemble step already running
(core r24.10 ``ensemble_scheduler.cc``, ``ScheduleSteps``; server#6739): the ``gptj`` step runs
its row to the end for nobody. The project's client library therefore sends a stop request with
the request's id when its ``complete`` times out, which frees the engine row at its next step.
docs/operations.md says so. By construction: the engine is held while the client gives up, so
the row cannot end by itself first however fast the machine."""

from __future__ import annotations

import threading

import pytest
import tritonclient.grpc as grpcclient
from engine_hold import engine_held, wait_for
from server_metrics import cancels_sent, engine_counters, sample, scrape
from test_client_cancel import in_flight
from tritonclient.utils import InferenceServerException

from client import CodegenClient, CompletionRequest, TimedOutError
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, MODEL_STAGE

PROMPT = "def add(a, b):\n"
ASKED = 480


@pytest.fixture(params=["torch", "openvino"])
def any_server(request):
    return request.getfixturevalue("server" if request.param == "torch" else "openvino_server")


def running(server) -> float:
    return sample(scrape(server), names.ENGINE_RUNNING, ENGINE_MODEL) or 0.0


def test_the_client_librarys_timeout_stops_its_unary_row(any_server):
    server = any_server
    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server), CodegenClient(server.grpc_url, "grpc", timeout=1.0) as codegen:
        with pytest.raises(TimedOutError):
            codegen.complete(PROMPT, ASKED)
        # its stop request was answered before the error was raised: gptj passed it on
        assert cancels_sent(server, MODEL_STAGE) == sent_before + 1
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the abandoned row",
    )
    wait_for(lambda: running(server) == 0, "the engine still runs the abandoned row")
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert after[names.ENGINE_CANCELLED] - before[names.ENGINE_CANCELLED] == 1
    assert generated < ASKED, f"{generated:.0f} of {ASKED} tokens generated for nobody"


def test_a_raw_grpc_deadline_on_the_ensemble_is_not_passed_on(server):
    """The Triton 2.51 limit docs/operations.md names: the running gptj step never hears of its
    ensemble client's deadline, so the row ends by itself (not cancelled)."""
    asked = 24  # the row runs to its end: keep it short
    request = CompletionRequest((PROMPT,), max_tokens=asked)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    failures: list[Exception] = []

    def ask() -> None:
        try:
            client.infer(ENSEMBLE_MODEL, request.infer_inputs(grpcclient), client_timeout=1.0)
        except InferenceServerException as exc:
            failures.append(exc)

    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        caller = threading.Thread(target=ask)
        caller.start()
        wait_for(lambda: in_flight(server, MODEL_STAGE) >= 1, "the request never reached gptj")
        caller.join(timeout=60)
        assert failures and "Deadline" in str(failures[0]), failures
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_REQUESTS] > before[names.ENGINE_REQUESTS],
        "the abandoned row never ended",
    )
    wait_for(lambda: running(server) == 0, "the engine still runs the row")
    after = engine_counters(server)
    assert after[names.ENGINE_CANCELLED] == before[names.ENGINE_CANCELLED]
    assert cancels_sent(server, MODEL_STAGE) == sent_before
    client.close()
