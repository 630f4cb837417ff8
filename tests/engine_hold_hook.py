"""The tests' hooks in the engine model (backend/engine_hooks.py): hold the engine still, so
tests make a condition true by construction rather than by the machine's speed.

The tests' repository names this file in the engine model's ``hooks_file``; the stub loads it
(it imports nothing of the project). Control words come as datagrams on a Unix socket of its
own (Linux abstract namespace, named after the server's pid and the model), and each is
answered to its sender: tests/engine_hold.py sends them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable


def control_address(model: str, server_pid: int | None = None) -> str:
    """The abstract socket the hold listens on (leading NUL: no file)."""
    return f"\0codegen-test-hold-{server_pid or os.getppid()}-{model}"


class EngineHold:
    """Hold the engine still, from control datagrams. ``hold``: the engine's thread waits
    once its current step ends and new requests wait before they are submitted;
    ``hold_after:N``: the engine runs N more steps, then its thread waits (submissions go on);
    ``advance:N``: a held engine runs N steps and holds again; ``release`` ends any of them;
    ``submitted`` answers how many requests have been submitted to the engine so far, and
    ``waiting`` how many wait to be (they reached the engine model while held) and how many of
    those their clients have left. It
    holds inside the stub (a stub stopped by a signal is called unhealthy by Triton within a
    second). Tests use it to make a
    condition true by construction (a request still running when its cancellation arrives, a
    burst that joins one batch, a piece delivered while generation has not ended), not by the
    machine's speed."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._steps = threading.Event()  # set: the engine's thread may go on
        self._submissions = threading.Event()  # set: requests may be submitted
        self._steps.set()
        self._submissions.set()
        self._steps_left: int | None = None
        self._submitted = 0
        self._waiting: list[Callable[[], bool]] = []  # each waiting request's client_left

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

    def before_submit(self, client_left: Callable[[], bool]) -> None:
        if self.enabled:
            with self._lock:
                self._waiting.append(client_left)
            self._submissions.wait()
            with self._lock:
                self._waiting.remove(client_left)

    def on_submitted(self) -> None:
        with self._lock:
            self._submitted += 1

    def control(self, word: str) -> str:
        if not self.enabled:
            return "refused: the hold is off"
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
            if word == "waiting":
                left = sum(client_left() for client_left in self._waiting)
                return f"waiting:{len(self._waiting)},left:{left}"
            if word == "release":
                self._steps_left = None
                self._steps.set()
                self._submissions.set()
                return "released"
        return f"refused: unknown control {word!r}"

    def close(self) -> None:
        self.control("release")


class ControlListener:
    """Receives control words in a thread of its own and answers each to its sender."""

    def __init__(self, address: str, hold: EngineHold) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.hold = hold
        self.thread = threading.Thread(target=self._serve, name="test-hold", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data, sender = self.sock.recvfrom(256)
            except OSError:
                return  # closed
            answer = self.hold.control(data.decode(errors="replace"))
            if sender:
                with contextlib.suppress(OSError):
                    self.sock.sendto(answer.encode(), sender)


class _Installed(EngineHold):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.listener = ControlListener(control_address(model), self)

    def close(self) -> None:
        super().close()
        with contextlib.suppress(OSError):
            self.listener.sock.shutdown(socket.SHUT_RDWR)
        self.listener.sock.close()


def install(model_name: str) -> EngineHold:
    """What backend/engine_hooks.py calls in the engine model's stub."""
    return _Installed(model_name)
