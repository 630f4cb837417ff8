"""The soak's view of the server (found or started by :func:`reporting.triton.open_triton`): the
RSS of tritonserver's tree and the engine's gauges, sampled through the run, and the engine
model's python-backend stub, which the stub-kill drill kills."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import httpx
import psutil

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from reporting.triton import ServedTriton, read_snapshot
from serving.watchdog import model_stubs

SAMPLE_COLUMNS = ("t_s", "phase", "rss_bytes", "processes", "steps", "running", "pending")
ENGINE_GAUGES = (names.ENGINE_STEPS, names.ENGINE_RUNNING, names.PENDING_REQUEST_COUNT)


def tritonserver(served: ServedTriton) -> psutil.Process | None:
    """tritonserver's process: the launcher's child when the soak started it, else the one
    serving this HTTP port."""
    launcher, flag = served.launcher, f"--http-port={served.endpoints.ports.http}"
    with contextlib.suppress(psutil.Error):
        if launcher is not None and launcher.process is not None:
            candidates = psutil.Process(launcher.process.pid).children(recursive=True)
        else:
            candidates = [p for p in psutil.process_iter(["cmdline"])
                          if flag in (p.info["cmdline"] or [])]  # fmt: skip
        return next((p for p in candidates if p.name() == "tritonserver"), None)
    return None


def find_stub(server: psutil.Process) -> psutil.Process | None:
    """The python-backend stub serving the engine model."""
    with contextlib.suppress(psutil.Error):
        stubs = model_stubs(server.pid)
        return next((psutil.Process(p) for p, m in stubs.items() if m == ENGINE_MODEL), None)
    return None


class Sampler:
    """Every ``every`` seconds, a sample (:data:`SAMPLE_COLUMNS`): the RSS of tritonserver and
    its stubs, summed, and the engine's step counter and queues, labelled with the soak's phase:
    RSS for the flatness check, the engine to tell a stall apart (stepping with sequences
    running: busy; not stepping with requests pending: wedged)."""

    def __init__(self, served: ServedTriton, clock: Callable[[], float], every: float) -> None:
        self.served, self.clock, self.every = served, clock, every
        self.samples: list[dict[str, Any]] = []
        self.phase = "start"
        self.root: psutil.Process | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self.root = tritonserver(self.served)
        self._thread.start()

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
            values = (round(self.clock(), 2), self.phase, rss, count, *engine)
            self.samples.append(dict(zip(SAMPLE_COLUMNS, values, strict=True)))
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def during(self, begin: float, end: float) -> str:
        """What the engine did between ``begin`` and ``end`` (run time), in a phrase."""
        inside = [s for s in self.samples if begin <= s["t_s"] <= end and s["steps"] is not None]
        if len(inside) < 2:
            return ""
        a, b = inside[0], inside[-1]
        running, pending = (max(s[k] or 0 for s in inside) for k in ("running", "pending"))
        return (f"{b['steps'] - a['steps']:.0f} steps in {b['t_s'] - a['t_s']:.0f} s, up to "
                f"{running:.0f} sequences running and {pending:.0f} requests pending in "
                "Triton")  # fmt: skip


def http_status(url: str, timeout: float = 2.0) -> str:
    """A readiness endpoint's answer as text: "200", "400 <body>", or "no answer (...)"."""
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"no answer ({exc})"
    body = "" if response.status_code == 200 else response.text.strip()
    return f"{response.status_code} {body}".strip()
