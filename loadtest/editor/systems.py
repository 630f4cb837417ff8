"""The servers a run measures, each a :class:`System`: how its typists' requests travel, its
own counters (tokens generated, prompt tokens received and reused), the CPU its process tree
used, and when it is idle.

- The project: Triton (and, over ``openai``, the API in front of it), its counters from the
  engine model's metrics (:mod:`contract.metrics`).
- llama.cpp's ``llama-server`` (:mod:`reporting.llama_server`): ``llamacpp:tokens_predicted_total``
  (it counts a cancelled request's tokens as it drops it), ``llamacpp:prompt_tokens_total``
  (prefilled) and ``llamacpp:prompt_tokens_cached_total`` (taken from its prompt cache).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.editor.protocols import Sender
from reporting import llama_server as llama
from reporting.machine import tree_cpu_seconds
from reporting.triton import read_snapshot, wait_for_drain

# the counters every system gives, by the same names
GENERATED, PROMPT, REUSED, SEQUENCES, CANCELLED = (
    "generated", "prompt", "reused", "sequences", "cancelled",
)  # fmt: skip
STOPS, PAST_STOP = "editor_stops", "past_stop"  # the engine's editor stop counters
ENGINE_COUNTERS = {
    GENERATED: names.ENGINE_GENERATED_TOKENS,
    PROMPT: names.ENGINE_PROMPT_TOKENS,
    REUSED: names.ENGINE_PROMPT_TOKENS_REUSED,
    SEQUENCES: names.ENGINE_REQUESTS,
    CANCELLED: names.ENGINE_CANCELLED,
    STOPS: names.ENGINE_EDITOR_STOPS,
    PAST_STOP: names.ENGINE_TOKENS_PAST_STOP,
}
IDLE_POLL_S = 0.05


@dataclass
class System:
    """One server under test. ``counters`` gives the named counters so far; ``busy`` how many
    requests it still holds (None: unknown)."""

    label: str
    sender: Sender
    counters: Callable[[], dict[str, float]]
    busy: Callable[[], int | None]
    pids: list[int] = field(default_factory=list)
    engine: bool = True  # the project's engine (its finished-sequences counter exists)

    def cpu_s(self) -> float:
        """CPU seconds so far; NaN for a server this run did not start (no process to read)."""
        return tree_cpu_seconds(self.pids) if self.pids else float("nan")

    def drain(self, timeout: float) -> bool:
        """Wait until the server holds no request; whether it got there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if not self.busy():
                    return True
            time.sleep(IDLE_POLL_S)
        return False

    def settled(self, before: dict[str, float], limit_s: float) -> dict[str, float] | None:
        """The counters once the request sent after ``before`` was counted: the engine counts
        a sequence's tokens when it finishes it (its sequences counter moves on), llama.cpp
        when it releases the slot (nothing processing); None if not within ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                now = self.counters()
                if self.engine and now[SEQUENCES] > before[SEQUENCES]:
                    return now
                if not self.engine and not self.busy():
                    return now
            time.sleep(IDLE_POLL_S)
        return None


def triton_system(label: str, sender: Sender, metrics_url: str, pids: list[int]) -> System:
    def counters() -> dict[str, float]:
        snapshot = read_snapshot(metrics_url)
        return {k: snapshot.value(v, model=ENGINE_MODEL) for k, v in ENGINE_COUNTERS.items()}

    def busy() -> int | None:
        state, _ = wait_for_drain(metrics_url, 0.0)
        return None if state is None else state.running + state.pending

    return System(label, sender, counters, busy, pids)


def llama_system(label: str, sender: Sender, metrics_url: str, pids: list[int]) -> System:
    def counters() -> dict[str, float]:
        snapshot = read_snapshot(metrics_url)
        prefilled, cached = snapshot.value(llama.PREFILLED), snapshot.value(llama.CACHED)
        return {GENERATED: snapshot.value(llama.PREDICTED), PROMPT: prefilled + cached,
                REUSED: cached}  # fmt: skip

    def busy() -> int | None:
        return int(read_snapshot(metrics_url).gauge(llama.PROCESSING) or 0)

    return System(label, sender, counters, busy, pids, engine=False)
