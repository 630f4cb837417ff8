"""The client library and the ``codegen`` command stop the generation when they give up: on
their timeout and on Ctrl-C, streamed (the gRPC stream is cancelled) and unary (a stop request
with the request's id; Triton 2.51 does not pass a unary ensemble request's cancellation on).

By construction: the engine is held while the client gives up, so the generation cannot have
finished first on however fast a machine. A stream waits at the held engine's door and is
dropped when it opens (the engine model sees its client left); a unary request's stop reaches
``gptj``, whose cancellation counter shows it. The engine's own counters show the sequence
dropped."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
from engine_hold import engine_held, left_waiting, reached, wait_for
from server_metrics import cancels_sent, engine_counters, sample, scrape
from test_cli import CODEGEN, EXIT_INTERRUPTED

from client import CodegenClient, StreamCancelledError, TimedOutError
from client.cli import EXIT_SERVER_ERROR
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, MODEL_STAGE

PROMPT = "def fib(n):\n"
ASKED = 480  # far more than an abandoned sequence may generate


def in_flight(server, model: str) -> float:
    return sample(scrape(server), names.CALLS_IN_FLIGHT, model) or 0.0


def waits_at_engine(server, model: str) -> bool:
    """Whether a request through ``model`` waits at the held engine: ``gptj`` holds it in
    flight; the engine model's own (streamed) requests wait at its door."""
    if model == MODEL_STAGE:
        return in_flight(server, MODEL_STAGE) >= 1
    assert model == ENGINE_MODEL, model
    return reached(server)


def departure_seen(server, model: str, sent_before: float) -> bool:
    """Whether the client's departure reached the engine's side: ``gptj`` passed a cancellation
    on (its counter passed ``sent_before``), or the engine model sees a waiting request left."""
    if model == MODEL_STAGE:
        return cancels_sent(server, MODEL_STAGE) > sent_before
    return left_waiting(server)


def assert_dropped(server, before: dict[str, float], most: int = ASKED - 1) -> None:
    """The engine finished the sequence as cancelled, having generated at most ``most`` tokens
    (0: dropped before its prefill, its client gone while it waited)."""
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_CANCELLED] > before[names.ENGINE_CANCELLED],
        "the engine never dropped the abandoned sequence",
    )
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    assert after[names.ENGINE_CANCELLED] - before[names.ENGINE_CANCELLED] == 1
    assert generated <= most, f"{generated:.0f} tokens generated for nobody (at most {most})"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_unary_request_that_times_out_is_stopped(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server), CodegenClient(url, protocol, timeout=1.0) as codegen:
        with pytest.raises(TimedOutError, match="no answer"):
            codegen.complete(PROMPT, ASKED)
        # the stop request was answered before the error was raised
        assert cancels_sent(server, MODEL_STAGE) == sent_before + 1
    assert_dropped(server, before)


def test_a_stream_that_times_out_is_cancelled(server):
    before = engine_counters(server)
    with engine_held(server), CodegenClient(server.grpc_url, timeout=1.0) as codegen:
        with pytest.raises(TimedOutError, match="no answer"):
            "".join(codegen.stream(PROMPT, ASKED))
        wait_for(lambda: left_waiting(server), "the engine never saw the client leave")
    assert_dropped(server, before, most=0)


def test_a_stream_cancelled_from_another_thread_ends_at_once(server):
    """``CompletionStream.cancel`` wakes a reader blocked on a held engine."""
    before = engine_counters(server)
    outcome: list[BaseException] = []
    with engine_held(server), CodegenClient(server.grpc_url) as codegen:
        stream = codegen.stream(PROMPT, ASKED)

        def read() -> None:
            try:
                "".join(stream)
            except BaseException as exc:
                outcome.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        wait_for(lambda: reached(server), "the stream never reached the engine")
        stream.cancel()
        reader.join(timeout=60)
        assert not reader.is_alive(), "the reader never woke"
        assert isinstance(outcome[0], StreamCancelledError)
        wait_for(lambda: left_waiting(server), "the engine never saw the client leave")
    assert_dropped(server, before, most=0)


def codegen_process(*args: str) -> subprocess.Popen:
    command = [CODEGEN] if CODEGEN else [sys.executable, "-m", "client.cli"]
    return subprocess.Popen(
        [*command, "complete", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a shell without job control starts background children with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_ctrl_c_cancels_a_streamed_codegen(server):
    before = engine_counters(server)
    with engine_held(server):
        process = codegen_process("--stream", PROMPT, "-n", str(ASKED), "--url", server.grpc_url)
        # it is streaming: its request waits at the held engine's door
        wait_for(lambda: reached(server), "the stream never reached the engine")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert process.returncode == EXIT_INTERRUPTED
        assert b"interrupted; the generation was stopped on the server" in err
        wait_for(lambda: left_waiting(server), "the engine never saw the client leave")
    assert_dropped(server, before, most=0)


def test_ctrl_c_stops_a_unary_codegen(server):
    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        process = codegen_process(PROMPT, "-n", str(ASKED), "--url", server.grpc_url)
        wait_for(lambda: in_flight(server, MODEL_STAGE) >= 1, "the request never reached gptj")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert process.returncode == EXIT_INTERRUPTED, err
        assert b"interrupted; the generation was stopped on the server" in err
        assert cancels_sent(server, MODEL_STAGE) == sent_before + 1
    assert_dropped(server, before)


def test_codegen_timeout_stops_a_unary_request(server):
    before = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        process = codegen_process(
            PROMPT, "-n", str(ASKED), "--url", server.grpc_url, "--timeout", "1"
        )
        _, err = process.communicate(timeout=60)
        assert process.returncode == EXIT_SERVER_ERROR, err
        assert b"the generation was stopped on the server" in err
        assert cancels_sent(server, MODEL_STAGE) == sent_before + 1
    assert_dropped(server, before)
