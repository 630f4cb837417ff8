"""The soak's view of the server's processes: the RSS of tritonserver's tree, sampled through
the run, and the python-backend stub the stub-kill drill kills. The server itself is found or
started by :func:`reporting.triton.open_triton`; a server found running is never drilled.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from contract.tensors import ENGINE_MODEL
from reporting.triton import ServedTriton

STUB_BINARY = "triton_python_backend_stub"


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


# --- memory --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RssSample:
    t_s: float  # seconds since the run began
    phase: str
    rss_bytes: int  # tritonserver and its stubs, summed
    processes: int


@dataclass(frozen=True)
class Flatness:
    """Is the server's memory flat after warm-up? The largest RSS of the last third of the
    samples against the largest of the first third (max, not mean: a leak raises the peaks)."""

    samples: int
    first_third_max: int | None
    last_third_max: int | None
    growth: float | None  # last / first - 1
    tolerance: float
    flat: bool | None  # None: too few samples to say
    note: str


def rss_flatness(samples: Sequence[int], tolerance: float, minimum: int = 6) -> Flatness:
    """Flatness of the RSS values of the measured phase after warm-up, in time order."""
    if len(samples) < minimum:
        return Flatness(
            len(samples),
            None,
            None,
            None,
            tolerance,
            None,
            f"too few samples after warm-up ({len(samples)} < {minimum}): run longer",
        )
    third = len(samples) // 3
    first, last = max(samples[:third]), max(samples[-third:])
    growth = last / first - 1
    flat = growth <= tolerance
    verb = "flat" if flat else "growing"
    note = (
        f"{verb}: last third max {last / 2**20:,.0f} MiB vs first third max "
        f"{first / 2**20:,.0f} MiB ({growth:+.1%}, tolerance {tolerance:.0%})"
    )
    return Flatness(len(samples), first, last, growth, tolerance, flat, note)


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


class RssSampler:
    """Samples the server tree's RSS every ``every`` seconds in a thread, labelled with the
    phase the soak is in."""

    def __init__(self, served: ServedTriton, clock: Any, every: float) -> None:
        self.served, self.clock, self.every = served, clock, every
        self.samples: list[RssSample] = []
        self.phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._root: psutil.Process | None = None

    def start(self) -> RssSampler:
        self._root = tritonserver(self.served)
        self._thread.start()
        return self

    @property
    def available(self) -> bool:
        return self._root is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._root is not None and self._root.is_running():
                rss, count = tree_rss(self._root)
                if count:
                    self.samples.append(RssSample(round(self.clock(), 2), self.phase, rss, count))
            self._stop.wait(self.every)

    def latest(self) -> RssSample | None:
        return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


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
