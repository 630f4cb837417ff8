"""Clients that leave at any point free everything their requests held.

python_backend r24.10 loses a decoupled BLS caller's error response after the first response
(contract/tensors.py, ENGINE_ERROR, says how): a stream whose gRPC client cancelled it used to
end in the engine with such an error, and the streaming model's worker waited for it for ever,
holding one of its slots. After about 320 cancelled streams it had none left and stopped
executing, while the server still said ready."""

from __future__ import annotations

import queue
import subprocess
import sys

import pandas as pd
import tritonclient.grpc as grpcclient
from engine_hold import engine_held, wait_for
from server_metrics import cancels_sent, engine_counters, sample, scrape

from client.request import CompletionRequest, requested_outputs
from contract import metrics as names
from contract.tensors import STREAM_MODEL


def calls_in_flight(server, model: str) -> float:
    return sample(scrape(server), names.CALLS_IN_FLIGHT, model) or 0.0


def test_a_stream_its_grpc_client_cancels_gives_its_slot_back(server):
    """By construction: the engine is held still (tests/engine_hold.py) after its first few
    steps until the cancellation has been passed on: the engine certainly ends the stream as
    cancelled, after it sent tokens."""
    before = engine_counters(server)
    sent_before = cancels_sent(server, STREAM_MODEL)
    request = CompletionRequest(("def f(x):\n",), max_tokens=400)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with engine_held(server, after_steps=4):
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            STREAM_MODEL, request.infer_inputs(grpcclient), outputs=requested_outputs(grpcclient)
        )
        _, error = answers.get(timeout=120)
        assert error is None, error
        client.stop_stream(cancel_requests=True)
        wait_for(
            lambda: cancels_sent(server, STREAM_MODEL) > sent_before,
            "the streaming model never passed its client's cancellation on",
        )
    client.close()
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the cancelled stream",
    )
    wait_for(
        lambda: calls_in_flight(server, STREAM_MODEL) == 0,
        "the cancelled stream still holds a slot of the streaming model",
    )


def test_hundreds_of_abandoned_requests_leave_the_full_capacity(server, tmp_path):
    """Streams cancelled after 0-8 pieces, HTTP streams closed, unary requests given up by a
    deadline while queued or running, and streams read to their end, all at once: no error, no
    stall, and afterwards nothing is held and new requests are answered (loadtest/stress.py,
    on Locust, which patches its process with gevent: it runs in a process of its own)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.stress",
            "--grpc",
            server.grpc_url,
            "--http",
            server.http_url,
            "--metrics",
            server.metrics_url,
            "--duration",
            "60",
            "--max-requests",
            "30",
            "--cancel-threads",
            "8",
            "--prompt-chars",
            "150,450",
            "--stall",
            "120",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert run.stdout.rstrip().endswith("PASS")
    assert (tmp_path / "locust.html").stat().st_size > 0
    events = pd.read_csv(tmp_path / "events.csv")
    assert set(events["kind"]) == {"grpc-cancel", "grpc-full", "http-abandon", "unary"}
    assert (events["outcome"] != "error").all()
    assert events.groupby("kind").size().max() <= 8 * 30  # --max-requests bounds each user
