"""The launcher (`make triton`): the server listens on loopback by default, and neither it nor
its python-backend stubs outlive a launcher killed with SIGKILL."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from contract.tensors import ENGINE_MODEL
from serving.process import free_ports, port_in_use
from serving.watchdog import DIED_EXIT_CODE, HUNG_EXIT_CODE, STUB_EXIT_CODE, model_stubs


def loopback(ip: str) -> bool:
    """127.0.0.1, also as gRPC writes it (the IPv4-mapped IPv6 form ::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def wait_ready(url: str, launcher: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launcher.poll() is None, f"the launcher exited: {launcher.args}"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{url} not ready after {timeout}s")


@dataclass
class Launched:
    launcher: subprocess.Popen
    ports: list[int]
    server: psutil.Process
    family: list[psutil.Process]  # tritonserver and its python-backend stubs

    def assert_all_gone(self, timeout: float) -> None:
        _, alive = psutil.wait_procs(self.family, timeout=timeout)
        assert not alive, f"outlived the launcher: {[(p.pid, p.name()) for p in alive]}"
        assert not any(port_in_use(port) for port in self.ports)


@contextlib.contextmanager
def launched(model_repository, log: Path) -> Iterator[Launched]:
    """`python -m serving.triton` on free ports, ready; whatever happens, nothing is left.

    Its output goes to a file: a pipe nobody reads would fill and block the server."""
    ports = free_ports(3)
    http, grpc, metrics = (str(port) for port in ports)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.triton",
            "--model-repository",
            str(model_repository),
            "--http-port",
            http,
            "--grpc-port",
            grpc,
            "--metrics-port",
            metrics,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    family: list[psutil.Process] = []
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", launcher)
        server = psutil.Process(launcher.pid).children()[0]
        family += [server, *server.children(recursive=True)]
        yield Launched(launcher, ports, server, family)
    finally:
        for process in [launcher, *family]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.kill()


def test_sigkilled_launcher_leaves_no_server_and_frees_its_ports(model_repository, tmp_path):
    with launched(model_repository, tmp_path / "launcher.log") as run:
        assert run.server.name() == "tritonserver"
        assert any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in run.family)
        listening = {
            c.laddr
            for c in run.server.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert len(listening) == 3 and all(loopback(addr.ip) for addr in listening), listening

        os.kill(run.launcher.pid, signal.SIGKILL)
        run.launcher.wait(timeout=10)
        run.assert_all_gone(timeout=60)


@pytest.mark.parametrize("repository", ["model_repository", "openvino_model_repository"])
def test_a_dead_model_stub_stops_the_server_so_a_supervisor_restarts_it(
    repository, request, tmp_path
):
    """Triton 2.51 keeps saying ready when a stub dies; the launcher must not (either backend)."""
    log = tmp_path / "launcher.log"
    with launched(request.getfixturevalue(repository), log) as run:
        # the launcher lists the stubs it watches once it has seen the server ready: kill
        # after that, or it watches a list without the dead one (a race of the test, not of
        # a server that dies later)
        deadline = time.monotonic() + 60
        while "Triton is ready" not in log.read_text():
            assert time.monotonic() < deadline, "the launcher never said ready"
            time.sleep(0.2)
        time.sleep(1.0)
        stubs = model_stubs(run.server.pid)
        assert set(stubs.values()) >= {"gptj", "preprocessing", "postprocessing", ENGINE_MODEL}
        engine = next(pid for pid, model in stubs.items() if model == ENGINE_MODEL)

        os.kill(engine, signal.SIGKILL)  # the stub that holds the engine
        assert run.launcher.wait(timeout=120) == STUB_EXIT_CODE
        assert f"the '{ENGINE_MODEL}' model's python-backend stub died" in log.read_text()
        run.assert_all_gone(timeout=30)


def wait_for_line(log: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"the launcher never said {text!r}"
        time.sleep(0.2)


def test_a_hung_server_is_noticed_killed_and_reported(model_repository, tmp_path):
    """A tritonserver that is alive but answers nothing (here: stopped with SIGSTOP, as a
    server whose heap is corrupt hangs) is killed, and the launcher exits non-zero."""
    log = tmp_path / "launcher.log"
    with launched(model_repository, log) as run:
        wait_for_line(log, "Triton is ready")
        os.kill(run.server.pid, signal.SIGSTOP)
        # the watchdog needs LIVENESS_FAILURES probes LIVENESS_PERIOD_S apart: bounded polling
        assert run.launcher.wait(timeout=120) == HUNG_EXIT_CODE
        assert "it is hung; killing it" in log.read_text()
        run.assert_all_gone(timeout=30)


def test_sigterm_stops_the_launcher_at_once_even_when_the_server_hangs(model_repository, tmp_path):
    log = tmp_path / "launcher.log"
    with launched(model_repository, log) as run:
        wait_for_line(log, "Triton is ready")
        os.kill(run.server.pid, signal.SIGSTOP)
        run.launcher.send_signal(signal.SIGTERM)
        # a hung server is killed as soon as it fails to answer one probe (2 s), well within
        # the grace a healthy server gets (STOP_GRACE_S)
        assert run.launcher.wait(timeout=30) == 0
        assert "does not answer while stopping: killing it" in log.read_text()
        run.assert_all_gone(timeout=30)


def test_a_crashed_server_makes_the_launcher_exit_non_zero(model_repository, tmp_path):
    log = tmp_path / "launcher.log"
    with launched(model_repository, log) as run:
        wait_for_line(log, "Triton is ready")
        os.kill(run.server.pid, signal.SIGSEGV)
        assert run.launcher.wait(timeout=60) == DIED_EXIT_CODE
        assert "tritonserver exited on its own" in log.read_text()
        run.assert_all_gone(timeout=30)
