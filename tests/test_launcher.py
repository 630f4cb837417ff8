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

import psutil
import pytest

from serving.process import port_in_use
from tests.conftest import free_ports


def loopback(ip: str) -> bool:
    """127.0.0.1, also as gRPC writes it (the IPv4-mapped IPv6 form ::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def wait_ready(url: str, launcher: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.stdout.read().decode()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{url} not ready after {timeout}s")


def test_sigkilled_launcher_leaves_no_server_and_frees_its_ports(model_repository, tmp_path):
    http, grpc, metrics = free_ports(3)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "serving.triton", "--model-repository", str(model_repository),
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    family: list[psutil.Process] = []
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", launcher)
        server = psutil.Process(launcher.pid).children()[0]
        family += [server, *server.children(recursive=True)]
        assert server.name() == "tritonserver"
        assert any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in family[1:])
        listening = {
            c.laddr for c in server.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
        }
        assert len(listening) == 3 and all(loopback(addr.ip) for addr in listening), listening

        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        _, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, f"outlived the launcher: {[(p.pid, p.name()) for p in alive]}"
        assert not any(port_in_use(port) for port in (http, grpc, metrics))
    finally:  # whatever failed, leave nothing of this test's server behind
        for process in [launcher, *family]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.kill()
