"""A test hook of the engine model: hold the engine still, so tests make a condition true by
construction rather than by the machine's speed."""

from __future__ import annotations

import threading
from collections.abc import Callable


class EngineHold:
    """A test hook (config parameter ``test_hooks``): hold the engine still, from control
    datagrams on the cancel channel. ``hold``: the engine's thread waits once its current step
    ends and new requests wait before they are submitted; ``hold_after:N``: the engine runs N
    more steps, then its thread waits (submissions go on); ``advance:N``: a held engine runs N
    steps and holds again; ``release`` ends any of them; ``submitted`` answers how many
    requests have been submitted to the engine so far. It holds inside the stub (a stub stopped
    by a signal is called unhealthy by Triton within a second). Tests use it to make a
    condition true by construction (a request still running when its cancellation arrives, a
    burst that joins one batch, a piece delivered while generation has not ended), not by the
    machine's speed."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._steps = threading.Event()  # set: the engine's thread may go on
        self._submissions = threading.Event()  # set: requests may be submitted
        self._steps.set()
        self._submissions.set()
        self._steps_left: int | None = None
        self._submitted = 0

    def after_step(self, before_holding: Callable[[], None]) -> None:
        """(the engine's thread) Wait here while held; ``before_holding`` runs first."""
        if not self.enabled:
            return
        with self._lock:
            if self._steps_left is not None:
                self._steps_left -= 1
                if self._steps_left <= 0:
                    self._steps_left = None
                    self._steps.clear()
        if not self._steps.is_set():
            before_holding()
        self._steps.wait()

    def before_submit(self) -> None:
        if self.enabled:
            self._submissions.wait()

    def on_submitted(self) -> None:
        with self._lock:
            self._submitted += 1

    def control(self, word: str) -> str:
        if not self.enabled:
            return "refused: test_hooks is off in the engine model's config"
        with self._lock:
            if word == "hold":
                self._steps.clear()
                self._submissions.clear()
                return "held"
            if word.startswith("hold_after:") and word.split(":")[1].isdigit():
                self._steps_left = int(word.split(":")[1])
                return "holding"
            if word.startswith("advance:") and word.split(":")[1].isdigit():
                self._steps_left = int(word.split(":")[1])
                self._steps.set()
                return "advancing"
            if word == "submitted":
                return f"submitted:{self._submitted}"
            if word == "release":
                self._steps_left = None
                self._steps.set()
                self._submissions.set()
                return "released"
        return f"refused: unknown control {word!r}"
