"""Passing a client's cancellation from a model that calls the engine to the engine's model.

The ``gptj`` and ``ensemble_stream`` models reach the engine through BLS, and in Triton 2.51
(python backend r24.10) a BLS request cannot be cancelled: its response iterator has no
``cancel()`` (added in r25.04) and nothing else asks Triton to cancel it. So a caller names each
engine request (its BLS request id, a random key) and, when its own client goes away, sends that
key in a datagram to a Unix socket the engine's model listens on. The socket lives in Linux's
abstract namespace (no file, gone with the process) under a name made of the server's pid and
the engine model's name, which every python-backend stub of that server can compute: stubs are
children of the tritonserver process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

KEY_PREFIX = "codegen-"


def channel_address(model: str, server_pid: int | None = None) -> str:
    """The abstract socket name of ``model``'s cancel channel (leading NUL: no file)."""
    return f"\0codegen-cancel-{server_pid or os.getppid()}-{model}"


def new_key(owner_pid: int | None = None) -> str:
    """A key no other request has: the BLS request id a cancellation names. With the caller
    stub's pid in it (``codegen-<pid>-<random>``) the engine also tells that stub of each
    response (backend/bls_ready.py)."""
    if owner_pid is None:
        return KEY_PREFIX + uuid.uuid4().hex
    return f"{KEY_PREFIX}{owner_pid}-{uuid.uuid4().hex}"


class CancelSender:
    """A caller's end: fire-and-forget datagrams naming the engine requests to cancel."""

    def __init__(self, model: str, server_pid: int | None = None) -> None:
        self.address = channel_address(model, server_pid)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def cancel(self, key: str) -> bool:
        """Ask for ``key``'s generation to stop; False when the engine could not be told (it
        then runs to its end, as before the channel existed: wasted work, not a wrong answer)."""
        try:
            self.sock.sendto(key.encode(), self.address)
            return True
        except OSError as exc:
            log.warning("could not send a cancellation to the engine: %r", exc)
            return False

    def close(self) -> None:
        self.sock.close()


class Cancellable(Protocol):
    """An engine ``Handle``, as far as cancelling goes."""

    def cancel(self) -> None: ...


class CancelRegistry:
    """The engine model's end: which handles each key names, and keys cancelled too early.

    A cancellation can arrive before its request has left Triton's queue (or after it
    finished); such keys are remembered (the last ``remember`` of them), so a request whose key
    was already cancelled is dropped as soon as it is submitted.
    """

    def __init__(self, remember: int = 4096) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, list[Cancellable]] = {}
        self._early: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def track(self, key: str, handle: Cancellable) -> None:
        """Make ``key`` name ``handle`` (one per row of the request) until ``forget(key)``."""
        if not key:
            return
        with self._lock:
            self._open.setdefault(key, []).append(handle)
            cancelled = key in self._early
        if cancelled:
            handle.cancel()

    def cancel(self, key: str) -> int:
        """Cancel every handle ``key`` names; returns how many (0: remembered for later)."""
        with self._lock:
            handles = list(self._open.get(key, ()))
            self._early[key] = None
            self._early.move_to_end(key)
            while len(self._early) > self._remember:
                self._early.popitem(last=False)
        for handle in handles:
            handle.cancel()
        return len(handles)

    def forget(self, key: str) -> None:
        if not key:
            return
        with self._lock:
            self._open.pop(key, None)
            self._early.pop(key, None)

    @property
    def open(self) -> int:
        return len(self._open)


class CancelListener:
    """Receives cancel datagrams on the engine model's channel in a thread of its own."""

    def __init__(
        self,
        model: str,
        on_cancel: Callable[[str], object],
        server_pid: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(channel_address(model, server_pid))
        self.on_cancel = on_cancel
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name="engine-cancels", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(256)
            except OSError:
                if self._closed:
                    return
                log.exception("cancel channel failed")
                continue
            try:
                self.on_cancel(data.decode(errors="replace"))
            except Exception:  # a bad datagram must not end the listener
                log.exception("could not handle %r", data)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
