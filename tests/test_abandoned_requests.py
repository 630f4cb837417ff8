"""Clients that leave at any point free everything their requests held: the engine's row, and
the stream's place in the engine model (which answers streams itself and sees its client leave
through Triton's ``is_cancelled``)."""

from __future__ import annotations

import queue
import subprocess
import sys

import pandas as pd
import tritonclient.grpc as grpcclient
from conftest import OPENVINO_PREFILL_CHUNK
from engine_hold import advance_until, engine_held, wait_for
from server_metrics import dropped_since, engine_counters, sample, scrape
from tokenizers import Tokenizer

from client.request import CompletionRequest, requested_outputs
from contract import metrics as names
from contract.tensors import ENGINE_MODEL


def running(server) -> float:
    return sample(scrape(server), names.ENGINE_RUNNING, ENGINE_MODEL) or 0.0


def stream_to_engine(client, request: CompletionRequest, answers: queue.Queue) -> None:
    """Send ``request`` to the engine model on a raw gRPC stream of ``client``'s; its answers
    go to ``answers`` as ``(result, error)``."""
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(
        ENGINE_MODEL, request.infer_inputs(grpcclient), outputs=requested_outputs(grpcclient)
    )


def test_a_stream_its_grpc_client_cancels_gives_its_row_back(server):
    """A raw gRPC stream from the engine model (the client library's stream). By construction:
    the engine is held still (tests/engine_hold.py) after its first few steps, then advanced a
    few tokens at a time until it dropped the sequence: the engine certainly ends the stream as
    cancelled, after it sent tokens, far from its end. (A raw client of ``ensemble_stream``
    stops its stream with a stop request instead: tests/test_stream_stop.py.)"""
    before = engine_counters(server)
    request = CompletionRequest(("def f(x):\n",), max_tokens=400)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with engine_held(server, after_steps=4):
        stream_to_engine(client, request, answers)
        _, error = answers.get(timeout=120)
        assert error is None, error
        client.stop_stream(cancel_requests=True)
        advance_until(
            server,
            lambda: dropped_since(server, before),
            "the engine never dropped the stream its client cancelled",
        )
    client.close()
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert generated < 400, f"{generated:.0f} of 400 tokens generated for nobody"
    wait_for(lambda: running(server) == 0, "the cancelled stream still holds an engine row")


def test_a_stream_left_in_its_prefill_is_dropped_before_its_first_token(
    openvino_server, tiny_checkpoint
):
    """A prompt of about 400 tokens, which the tests' openvino engine prefills 64 a pass
    (conftest.py): its client leaves after the first pass, and the engine, advanced one pass at
    a time, drops the stream between two chunks, before its prefill ends: not one token is
    generated for it. (Before the engine asked after each pass, a stream sent nothing while it
    prefilled, so its departure was seen only at its first token: the whole prompt was
    prefilled for nobody.) By construction: the engine holds after the first pass."""
    tokenizer = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    line = "    total = total + values[index] * weights[index]\n"
    prompt = "def f(values, weights):\n" + line * (
        400 // len(tokenizer.encode(line, add_special_tokens=False).ids)
    )
    passes = len(tokenizer.encode(prompt, add_special_tokens=False).ids) / OPENVINO_PREFILL_CHUNK
    assert passes > 5, f"the prompt takes {passes:.1f} passes: too few to leave in between"
    server, before = openvino_server, engine_counters(openvino_server)
    request = CompletionRequest((prompt,), max_tokens=8, temperature=0.0)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with engine_held(server, after_steps=1):
        stream_to_engine(client, request, answers)
        wait_for(lambda: running(server) >= 1, "the stream never reached the engine")
        client.stop_stream(cancel_requests=True)
        advance_until(
            server,
            lambda: dropped_since(server, before),
            "the engine never dropped the stream its client left in its prefill",
            tokens=1,
        )
    client.close()
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert generated == 0, f"{generated:.0f} token(s) generated: its prefill ran to its end"
    pieces = []
    while not answers.empty():
        result, _ = answers.get()
        pieces += [] if result is None else [result]
    assert not pieces, f"{len(pieces)} piece(s) reached a client that had left"
    wait_for(lambda: running(server) == 0, "the dropped stream still holds an engine row")


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
