"""The soak's phases as the stages of a Locust load shape: the ramp to saturation, the soak at
twice it, then the editor phase and the drain, which the run drives and ends itself. Pure: the
tests tick it by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RAMP_LEVELS = (1, 2, 4, 8, 16, 32, 64)
RAMP, SOAK, EDITOR, DRAIN = "ramp", "soak", "editor", "drain"
NEXT = {RAMP: SOAK, SOAK: EDITOR, EDITOR: DRAIN, DRAIN: ""}


@dataclass
class SoakPlan:
    """Ramp levels (1, 2, 4, ... clients), each measured over ``ramp_step_s`` after a quarter
    step to settle, longer (up to 4x) until ``level`` requests were answered in it; the ramp
    stops after ``ramp_patience`` levels in a row that do not beat the best by ``ramp_gain``.
    Then ``clients`` (2 x saturation) for ``duration_s``. ``completed(t)``: requests answered
    since ``t``; ``tokens()``: the engine's generated-token counter (None: not exported)."""

    duration_s: float
    completed: Callable[[float], int]
    tokens: Callable[[], float | None] = lambda: None
    saturation: int | None = None  # given: no ramp
    clients: int | None = None
    ramp_step_s: float = 8.0
    ramp_gain: float = 0.10
    ramp_patience: int = 2
    max_clients: int = 32
    steps: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    stages: list[tuple[str, float, float | None]] = field(default_factory=list)  # name, from, to

    def __post_init__(self) -> None:
        self.levels = [n for n in RAMP_LEVELS if n <= self.max_clients] or [1]
        self.level = 0  # index into levels
        self.window: tuple[float, float | None] | None = None  # (opened, tokens then)
        self.flat = 0
        self.best: dict[str, Any] | None = None
        self.ended: set[str] = set()
        if self.saturation:
            self.note = "given (--saturation)"

    @property
    def stage(self) -> str | None:
        return self.stages[-1][0] if self.stages and self.stages[-1][2] is None else None

    @property
    def soak_clients(self) -> int:
        return self.clients or 2 * (self.saturation or 1)

    def finish(self, name: str, now: float) -> None:  # the run ended the editor phase, the drain
        self.ended.add(name)
        self.tick(now)

    def tick(self, now: float) -> tuple[int, str] | None:
        """(users, stage) at ``now``; None once every stage is over."""
        if not self.stages:
            self.stages.append((SOAK if self.saturation else RAMP, now, None))
        while name := self.stage:
            began = self.stages[-1][1]
            if name == RAMP and self._ramp(now, began):
                return self.levels[self.level], RAMP
            if name == SOAK and now < began + self.duration_s:
                return self.soak_clients, SOAK
            if name in (EDITOR, DRAIN) and name not in self.ended:
                return 0, name
            self.stages[-1] = (name, began, now)
            if following := NEXT[name]:
                self.stages.append((following, now, None))
        return None

    def _ramp(self, now: float, began: float) -> bool:
        """Whether the ramp goes on at ``now`` (measuring and stepping as it goes)."""
        level = self.levels[self.level]
        if self.window is None:
            settled = (self.steps[-1]["closed"] if self.steps else began) + self.ramp_step_s / 4
            if now >= settled:
                self.window = (now, self.tokens())
            return True
        (opened, tokens0), done = self.window, self.completed(self.window[0])
        span = now - opened
        if span < 4 * self.ramp_step_s and (span < self.ramp_step_s or done < max(2, level)):
            return True
        tokens1, self.window = self.tokens(), None
        rate = (tokens1 - tokens0) / span if tokens0 is not None and tokens1 is not None else 0.0
        step = {
            "clients": level,
            "rps": done / span,
            "tokens_per_s": rate,
            "window_s": round(span, 1),
            "done": done,
            "closed": now,
        }
        self.steps.append(step)
        measure = "tokens_per_s" if rate else "rps"
        if self.best is None or step[measure] > self.best[measure] * (1 + self.ramp_gain):
            self.best, self.flat = step, 0
        else:
            self.flat += 1
        if self.flat >= self.ramp_patience:
            self.note = (
                f"throughput stopped rising at {self.best['clients']} clients: {level} "
                f"gave {step[measure]:.1f} {measure.replace('_', ' ')} vs "
                f"{self.best[measure]:.1f} (needs +{self.ramp_gain:.0%})"
            )
        elif self.level + 1 < len(self.levels):
            self.level += 1
            return True
        else:
            self.note = (
                f"throughput still rising at the last level ({level}, --max-clients)"
                if self.flat == 0
                else f"the ramp ended at --max-clients {level}; best at {self.best['clients']}"
            )
        self.saturation = self.best["clients"]
        return False

    def summary(self) -> dict[str, Any]:
        steps = [{k: v for k, v in s.items() if k != "closed"} for s in self.steps]
        return {"clients": self.saturation, "steps": steps, "note": self.note}
