"""A server run as a child process: ready when an HTTP endpoint answers 200, stopped with its
own graceful signal (then killed if it lingers). Triton and the load test's Prometheus share it;
the load test also uses the probes below for servers it did not start."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import IO, Any


def http_ready(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers 200 now (a readiness endpoint, any host)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` answers HTTP at all (any status) within ``timeout``: a
    server that is stopping still answers; a hung one does not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (a server running, or still starting)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a private server."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nothing listens on now (all held open until all are found)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Run in the child between fork and exec: the kernel kills it when its parent dies.

    Without it a server in its own process group outlives a launcher killed with SIGKILL (an OOM
    killer, a runtime's grace-period kill) and keeps answering on its ports; tritonserver's
    python-backend stubs watch tritonserver and exit with it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the prctl: go now
        os._exit(1)


def spawn_tied(command: list[str], stdout: IO[bytes] | None, **popen: Any) -> subprocess.Popen:
    """Start a server process in its own process group (Ctrl-C reaches only this process, which
    then stops it in order) that the kernel kills should this process die, however it dies.

    Not in a session of its own: Linux's autogroup scheduling gives each session an equal share
    of the CPU, and a Triton in its own session, its engine busy on every core, kept an API in
    another waiting tens of milliseconds at each wake-up (an abandoned stream was noticed 30-60
    tokens late on 2 cores; in one session, 2). In one session the threads share fairly."""
    return subprocess.Popen(
        command,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        process_group=0,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
        **popen,
    )


class ManagedServer:
    name = "server"
    stop_signal = signal.SIGTERM
    ready_timeout = 60.0  # seconds wait_ready waits by default
    stop_timeout = 30.0  # seconds between the stop signal and a kill

    process: subprocess.Popen | None = None

    def start(self) -> ManagedServer:
        raise NotImplementedError

    @property
    def ready_url(self) -> str:
        raise NotImplementedError

    @property
    def log_hint(self) -> str:
        """Where to look when the server dies (e.g. "; see server.log")."""
        return ""

    def ready(self) -> bool:
        return http_ready(self.ready_url)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ready; fail early if our child exits. With no child (``start`` not
        called) it waits for a server someone else is starting on the same address."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"{self.name} exited with code {code}{self.log_hint}")
            if self.ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f}s")

    def stop(self, timeout: float | None = None) -> int | None:
        """Graceful stop; the exit code, or None if it never ran."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(self.stop_signal)
        try:
            return self.process.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> ManagedServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
