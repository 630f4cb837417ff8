"""The soak's view of the server: the RSS of tritonserver's tree and the engine's gauges,
sampled through the run, and the python-backend stub the stub-kill drill kills. The server
itself is found or started by :func:`reporting.triton.open_triton`; a server found running
is never drilled.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import psutil

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from reporting.triton import ServedTriton, read_snapshot

STUB_BINARY = "triton_python_backend_stub"
ENGINE_GAUGES = (names.ENGINE_STEPS, names.ENGINE_RUNNING, names.PENDING_REQUEST_COUNT)


def tritonserver(served: ServedTriton) -> psutil.Process | None:
    """tritonserver's process on this machine (None when not found)."""
    launcher = served.launcher
    if launcher is not None and launcher.process is not None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(launcher.process.pid).children(recursive=True):
                if child.name() == "tritonserver":
                    return child
        return None
    if not served.endpoints.is_local:
        return None
    flag = f"--http-port={served.endpoints.ports.http}"
    for proc in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] == "tritonserver" and flag in (proc.info["cmdline"] or []):
                return proc
    return None


# --- sampling ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the run began
    phase: str
    rss_bytes: int | None  # tritonserver and its stubs, summed (None: not found)
    processes: int
    steps: float | None  # codegen_engine_steps_total
    running: float | None  # codegen_engine_running_sequences
    pending: float | None  # Triton's pending requests, every model


def tree_rss(root: psutil.Process) -> tuple[int, int]:
    """RSS of a process and all its descendants (tritonserver and its python-backend stubs),
    summed, and how many processes that was."""
    total, count = 0, 0
    with contextlib.suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
                count += 1
    return total, count


class Sampler:
    """The server tree's RSS and the engine's step counter and queues every ``every``
    seconds, labelled with the phase the soak is in: RSS for the flatness check, the engine
    to tell a stall apart (stepping with sequences running: busy; not stepping with requests
    pending: wedged)."""

    def __init__(self, served: ServedTriton, clock: Any, every: float) -> None:
        self.served, self.clock, self.every = served, clock, every
        self.samples: list[Sample] = []
        self.phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._root: psutil.Process | None = None

    def start(self) -> Sampler:
        self._root = tritonserver(self.served)
        self._thread.start()
        return self

    @property
    def available(self) -> bool:
        return self._root is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, count = (None, 0)
            if self._root is not None and self._root.is_running():
                rss, count = tree_rss(self._root)
            engine: list[float | None] = [None, None, None]
            with contextlib.suppress(OSError, ValueError):
                snapshot = read_snapshot(self.served.endpoints.metrics_url, timeout=2.0)
                engine = [snapshot.value(n) for n in ENGINE_GAUGES]
            self.samples.append(Sample(round(self.clock(), 2), self.phase, rss, count, *engine))
            self._stop.wait(self.every)

    def latest_rss(self) -> str:
        rss = next((s.rss_bytes for s in reversed(self.samples) if s.rss_bytes), None)
        return "n/a" if rss is None else f"{rss / 2**30:.2f} GiB"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def during(self, begin: float, end: float) -> str:
        """What the engine did between ``begin`` and ``end`` (run time), in a phrase."""
        inside = [s for s in self.samples if begin <= s.t_s <= end and s.steps is not None]
        if len(inside) < 2:
            return ""
        steps = inside[-1].steps - inside[0].steps
        return (
            f"{steps:.0f} steps in {inside[-1].t_s - inside[0].t_s:.0f} s, up to "
            f"{max(s.running or 0 for s in inside):.0f} sequences running and "
            f"{max(s.pending or 0 for s in inside):.0f} requests pending in Triton"
        )


# --- the stub-kill drill -------------------------------------------------------------------


def find_stub(server: psutil.Process, model: str = ENGINE_MODEL) -> psutil.Process | None:
    """The python-backend stub serving ``model``: a child of tritonserver whose command line
    runs ``triton_python_backend_stub <repository>/<model>/<version>/model.py ... <model>_0_0``.
    """
    marker = f"/{model}/"
    for child in server.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if not cmdline or STUB_BINARY not in cmdline[0]:
                continue
            model_py = next((a for a in cmdline if a.endswith("model.py")), "")
            instance = any(a.startswith(f"{model}_") for a in cmdline[1:])
            if marker in model_py or instance:
                return child
    return None


def http_status(url: str, timeout: float = 2.0) -> str:
    """A readiness endpoint's answer as text: "200", "400 <body>", or "no answer (...)"."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.status)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        return f"{exc.code} {body}".strip()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer ({reason})"
