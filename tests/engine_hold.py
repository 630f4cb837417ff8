"""Holding the engine still, so that a test's condition is true by construction rather than by
the machine's speed: the ``EngineHold`` that the tests' repository plugs into the engine model
(tests/engine_hold_hook.py, named by its ``hooks_file``) is told through its own socket to hold,
and answers once it holds.
While held, the engine's thread waits after its current step and new requests wait before they
reach the engine, however fast the machine is."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from collections.abc import Callable

import pytest
from engine_hold_hook import control_address

from contract.tensors import ENGINE_MODEL


def control(server, word: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(f"\0codegen-test-{os.getpid()}-{uuid.uuid4().hex}")
        sock.settimeout(30)
        sock.sendto(word.encode(), control_address(ENGINE_MODEL, server.process.pid))
        return sock.recv(256).decode()


@contextlib.contextmanager
def engine_held(server, after_steps: int | None = None):
    """The engine held still inside this block (or, with ``after_steps``, once it has run that
    many more steps), and going on after it."""
    if after_steps is None:
        answer = control(server, "hold")
        assert answer == "held", answer
    else:
        answer = control(server, f"hold_after:{after_steps}")
        assert answer == "holding", answer
    try:
        yield
    finally:
        answer = control(server, "release")
        assert answer == "released", answer


def wait_for(condition, what: str, timeout: float = 60, fail: bool = True) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (a failure, or False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            assert not fail, what
            return False
        time.sleep(0.1)
    return True


def advance_until(server, condition: Callable[[], bool], what: str, tokens: int = 4) -> None:
    """Let a held engine run ``tokens`` steps at a time (at most 100 times) until ``condition``
    holds. A client's departure reaches the engine only when its caller next writes (HTTP) or
    polls (gRPC), which a held engine never lets come; advancing in small steps lets it come
    while the generation stays far from its end, however fast the machine is."""
    for _ in range(100):
        if wait_for(condition, what, 2, fail=False):
            return
        assert control(server, f"advance:{tokens}") == "advancing"
    pytest.fail(what)


def submitted(server) -> int:
    """How many requests the engine model has submitted to its engine since it started."""
    answer = control(server, "submitted")
    assert answer.startswith("submitted:"), answer
    return int(answer.split(":")[1])


def waiting(server) -> tuple[int, int]:
    """How many requests wait at a held engine's door (reached the engine model, not yet
    submitted to its engine), and how many of those Triton knows their clients have left."""
    answer = control(server, "waiting")
    match = re.fullmatch(r"waiting:(\d+),left:(\d+)", answer)
    assert match, answer
    return int(match.group(1)), int(match.group(2))


def reached(server) -> bool:
    """Whether a request waits at the held engine's door."""
    return waiting(server)[0] >= 1


def left_waiting(server) -> bool:
    """Whether a request waiting at the held engine's door has been left by its client."""
    return waiting(server)[1] >= 1
