"""Noticing a tritonserver that died or hung, for the launchers (`make triton`, `make api`).

Triton 2.51 neither restarts a python-backend stub that died nor stops saying ready, and a
tritonserver whose heap is corrupt can stay alive without answering anything (seen under
abandon-on-keystroke traffic: ``free(): corrupted unsorted chunks``, then no answer on
``/v2/health/live``). A process check alone sees neither. The watchdog checks three things,
cheapest first: the server process, its model stubs, and ``/v2/health/live`` answered within
``LIVENESS_TIMEOUT_S`` (``LIVENESS_FAILURES`` misses in a row, ``LIVENESS_PERIOD_S`` apart, mean
hung: the same numbers as the Kubernetes liveness probe in k8s/base/deployment.yaml, which a
test keeps in step).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from serving.process import http_ready

LIVENESS_PERIOD_S = 5.0
LIVENESS_TIMEOUT_S = 5.0
LIVENESS_FAILURES = 3

# launcher exit codes a supervisor (Kubernetes, compose, systemd) reads as "restart me"
STUB_EXIT_CODE = 3  # a model's python-backend stub died
HUNG_EXIT_CODE = 4  # tritonserver stopped answering /v2/health/live
DIED_EXIT_CODE = 5  # tritonserver exited on its own (a crash)

# After its last model unloaded, tritonserver exits within about a second; past this it waits
# on an open gRPC stream (see Stopping)
UNLOADED_GRACE_S = 5.0


def model_stubs(server_pid: int) -> dict[int, str]:
    """The python-backend stub processes of a running tritonserver: pid -> model name.

    A stub's command line holds its model's path (``<repository>/<model>/<version>/model.py``).
    """
    stubs = {}
    for child in psutil.Process(server_pid).children():
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if command and command[0].endswith("triton_python_backend_stub") and len(command) > 1:
            stubs[child.pid] = Path(command[1]).parent.parent.name
    return stubs


def dead_stub(stubs: dict[int, str]) -> str | None:
    """The model whose stub is gone (or a zombie), if any."""
    for pid, model in stubs.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            pass
        return model
    return None


@dataclass
class Fault:
    """What the watchdog found, as the launcher says it and exits with it."""

    message: str
    exit_code: int


@dataclass
class Watchdog:
    """Call ``check()`` often (it rate-limits the HTTP probe itself); it returns a Fault once
    the server died, a stub died, or the server stopped answering its liveness endpoint."""

    pid: int
    live_url: str
    stubs: dict[int, str] = field(default_factory=dict)
    period_s: float = LIVENESS_PERIOD_S
    timeout_s: float = LIVENESS_TIMEOUT_S
    failures_allowed: int = LIVENESS_FAILURES
    misses: int = 0
    _next_probe: float = 0.0

    def check(self) -> Fault | None:
        try:
            process = psutil.Process(self.pid)
            gone = process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone:
            return Fault("tritonserver exited on its own (see the log above)", DIED_EXIT_CODE)
        if self.stubs and (model := dead_stub(self.stubs)):
            return Fault(
                f"the {model!r} model's python-backend stub died: stopping tritonserver so that "
                "a supervisor restarts it (see the log above for why it died)",
                STUB_EXIT_CODE,
            )
        now = time.monotonic()
        if now < self._next_probe:
            return None
        self._next_probe = now + self.period_s
        if http_ready(self.live_url, timeout=self.timeout_s):
            self.misses = 0
            return None
        self.misses += 1
        if self.misses < self.failures_allowed:
            return None
        return Fault(
            f"tritonserver did not answer {self.live_url} within {self.timeout_s:.0f}s "
            f"{self.misses} times in a row: it is hung; killing it so that a supervisor "
            "restarts it",
            HUNG_EXIT_CODE,
        )

    def responsive(self) -> bool:
        """One quick probe, for a stop in progress: a hung server is killed at once."""
        return http_ready(self.live_url, timeout=min(self.timeout_s, 2.0))


@dataclass
class Stopping:
    """A tritonserver sent its stop signal (SIGINT), and when to end it rather than wait.

    Triton 2.51 closes its HTTP endpoint first (so HTTP cannot tell a stopping server from a
    hung one), waits ``--exit-timeout-secs`` for requests in flight, unloads its models (each
    stub exits) and then stops gRPC with a shutdown that has no deadline: while a client keeps
    a gRPC stream open, even an idle one, tritonserver never exits (a stream that carried a
    request also keeps ``ensemble_stream`` loaded until the exit timeout, after which
    ``exit(1)`` waits in the same shutdown). The one clean thing left to do then is to end it.
    """

    pid: int
    grace_s: float  # the server's exit timeout and a margin: past it, end the server
    had_stubs: bool  # whether model stubs ran when the signal was sent
    likely: str = "a client keeps a gRPC stream open, which holds a model loaded"
    since: float = field(default_factory=time.monotonic)
    unloaded_since: float | None = None

    def why_end(self) -> str | None:
        """None while the stop may go on by itself; else why the server is to be ended now."""
        now = time.monotonic()
        if self.had_stubs and not has_stubs(self.pid):
            self.unloaded_since = self.unloaded_since or now
            if now - self.unloaded_since > UNLOADED_GRACE_S:
                return (
                    "tritonserver has unloaded every model but does not exit: Triton 2.51 "
                    "waits without end for clients to close their gRPC streams; ending it "
                    "(nothing is lost, see docs/operations.md)"
                )
        if now - self.since > self.grace_s:
            return (
                f"tritonserver has not exited {self.grace_s:.0f} s after the stop signal, the "
                f"time it gives requests in flight over (most likely {self.likely}): ending it "
                "(see docs/operations.md)"
            )
        return None


def has_stubs(pid: int) -> bool:
    """Whether tritonserver ``pid`` still runs model stubs (False once it is gone)."""
    try:
        return bool(model_stubs(pid))
    except psutil.Error:
        return False


def kill_server_tree(pid: int) -> None:
    """SIGKILL tritonserver and its stubs (its process group: it leads one of its own), so
    that nothing is left behind even when the server is hung or stopped."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
