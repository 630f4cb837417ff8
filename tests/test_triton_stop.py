"""Ctrl-C (or SIGTERM) on `make triton` lets tritonserver stop by itself, and ends it only where
Triton 2.51 would wait for ever: a client holding a gRPC stream open (docs/operations.md).

Triton 2.51 closes its HTTP endpoint as soon as it gets its stop signal; the launcher used to
read that as "hung" and kill every stopping server about a second in. These tests assert on
what the launcher says and its exit code, never on how long the stop took."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
import tritonclient.grpc as grpcclient
from test_launcher import launched, wait_for_line

from serving import watchdog
from serving.paths import MODEL_REPOSITORY
from serving.process import free_ports
from serving.triton import STOP_GRACE_S, Ports, TritonServer
from serving.watchdog import Stopping

CLEAN = "tritonserver stopped (exit code 0)"
ENDED = ("killing it", "ending it")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_lets_tritonserver_exit_by_itself(model_repository, tmp_path, stop_signal):
    log = tmp_path / "launcher.log"
    with launched(model_repository, log) as run:
        wait_for_line(log, "Triton is ready")
        # Ctrl-C sends SIGINT to the terminal's foreground process group: the launcher's;
        # tritonserver has a group of its own, so only the launcher gets it, as here
        run.launcher.send_signal(stop_signal)
        assert run.launcher.wait(timeout=120) == 0
        said = log.read_text()
        assert CLEAN in said, said[-3000:]
        assert not any(word in said for word in ENDED), said[-3000:]
        run.assert_all_gone(timeout=30)


def test_a_grpc_stream_left_open_is_ended_in_plain_words(model_repository, tmp_path):
    """An open stream, even one that never carried a request, keeps tritonserver 2.51 in its
    gRPC shutdown for ever once its models are unloaded: the launcher says so and ends it."""
    log = tmp_path / "launcher.log"
    with launched(model_repository, log) as run:
        wait_for_line(log, "Triton is ready")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{run.ports[1]}")
        client.start_stream(callback=lambda result, error: None)
        try:
            run.launcher.send_signal(signal.SIGINT)
            assert run.launcher.wait(timeout=120) == 0
        finally:
            with contextlib.suppress(Exception):
                client.stop_stream()
            client.close()
        said = log.read_text()
        assert "waits without end for clients to close their gRPC streams" in said, said[-3000:]
        assert "does not answer" not in said
        run.assert_all_gone(timeout=30)


def test_the_library_stop_lets_tritonserver_exit_by_itself(model_repository, tmp_path):
    """TritonServer.stop(): what the test fixtures and `make api` use."""
    triton = TritonServer(model_repository, Ports(*free_ports(3)), log_file=tmp_path / "t.log")
    triton.start()
    try:
        triton.wait_ready(timeout=240)
    finally:
        code = triton.stop()
    assert triton.stop_note is None
    assert code == 0, (tmp_path / "t.log").read_text()[-3000:]


def test_the_exit_timeout_follows_the_last_flag():
    server = TritonServer(MODEL_REPOSITORY)
    assert server.exit_timeout == STOP_GRACE_S
    assert f"--exit-timeout-secs={STOP_GRACE_S}" in server.command()
    server.extra_args = ["--exit-timeout-secs=3", "--log-verbose=1", "--exit-timeout-secs", "7"]
    assert server.exit_timeout == 7


def test_a_server_without_stubs_left_is_ended_once_they_are_gone(monkeypatch):
    monkeypatch.setattr(watchdog, "UNLOADED_GRACE_S", -1.0)
    this = os.getpid()  # a process with no model stubs: as tritonserver once all unloaded
    assert Stopping(this, grace_s=3600, had_stubs=False).why_end() is None
    why = Stopping(this, grace_s=3600, had_stubs=True).why_end()
    assert why and "gRPC streams" in why
    late = Stopping(this, grace_s=-1, had_stubs=False, likely="a test").why_end() or ""
    assert "after the stop signal" in late and "most likely a test" in late
