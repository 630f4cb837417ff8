"""The soak's view of the server: the RSS of tritonserver's tree and the engine's gauges,
sampled through the run, and the python-backend stub the stub-kill drill kills. The server
itself is found or started by :func:`reporting.triton.open_triton`; a server found running
is never drilled.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from reporting.triton import ServedTriton, read_snapshot

STUB_BINARY = "triton_python_backend_stub"
ENGINE_GAUGES = (names.ENGINE_STEPS, names.ENGINE_RUNNING, names.PENDING_REQUEST_COUNT)


def tritonserver(served: ServedTriton) -> psutil.Process | None:
    """tritonserver's process on this machine: the launcher's child when the soak started it,
    else the one serving this HTTP port (None when not found)."""
    launcher, flag = served.launcher, f"--http-port={served.endpoints.ports.http}"
    with contextlib.suppress(psutil.Error):
        if launcher is not None and launcher.process is not None:
            candidates = psutil.Process(launcher.process.pid).children(recursive=True)
        else:
            candidates = [p for p in psutil.process_iter(["cmdline"])
                          if flag in (p.info["cmdline"] or [])]  # fmt: skip
        return next((p for p in candidates if p.name() == "tritonserver"), None)
    return None


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the run began
    phase: str
    rss_bytes: int | None  # tritonserver and its stubs, summed (None: not found)
    processes: int
    steps: float | None  # codegen_engine_steps_total
    running: float | None  # codegen_engine_running_sequences
    pending: float | None  # Triton's pending requests, every model


class Sampler:
    """The server tree's RSS (tritonserver and its python-backend stubs) and the engine's step
    counter and queues every ``every`` seconds, labelled with the phase the soak is in: RSS for
    the flatness check, the engine to tell a stall apart (stepping with sequences running:
    busy; not stepping with requests pending: wedged)."""

    def __init__(self, served: ServedTriton, clock: Any, every: float) -> None:
        self.served, self.clock, self.every = served, clock, every
        self.samples: list[Sample] = []
        self.phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self.root: psutil.Process | None = None

    def start(self) -> Sampler:
        self.root = tritonserver(self.served)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, count = None, 0
            with contextlib.suppress(psutil.Error):
                tree = [self.root, *self.root.children(recursive=True)] if self.root else []
                rss, count = sum(p.memory_info().rss for p in tree) or None, len(tree)
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
        return (
            f"{inside[-1].steps - inside[0].steps:.0f} steps in "
            f"{inside[-1].t_s - inside[0].t_s:.0f} s, up to "
            f"{max(s.running or 0 for s in inside):.0f} sequences running and "
            f"{max(s.pending or 0 for s in inside):.0f} requests pending in Triton"
        )


def find_stub(server: psutil.Process, model: str = ENGINE_MODEL) -> psutil.Process | None:
    """The python-backend stub serving ``model``: a child of tritonserver whose command line
    runs ``triton_python_backend_stub <repository>/<model>/<version>/model.py ... <model>_0_0``.
    """
    for child in server.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if (
                cmdline
                and STUB_BINARY in cmdline[0]
                and any(
                    a.startswith(f"{model}_") or (a.endswith("model.py") and f"/{model}/" in a)
                    for a in cmdline[1:]
                )
            ):
                return child
    return None


def http_status(url: str, timeout: float = 2.0) -> str:
    """A readiness endpoint's answer as text: "200", "400 <body>", or "no answer (...)"."""
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"no answer ({exc})"
    body = "" if response.status_code == 200 else response.text.strip()
    return f"{response.status_code} {body}".strip()
