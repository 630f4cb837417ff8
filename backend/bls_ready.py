"""Reading a decoupled BLS response only once it is there: the way round a deadlock in the
python backend's stub (r24.10, and unchanged in python_backend's main branch).

The caller stub (``gptj``) reads the engine's responses through BLS
response iterators. Three locks in that stub can close a cycle:

- a thread in ``ResponseIterator::Next`` on an empty buffer waits on the iterator's condition
  with the GIL released; woken by a response, it holds the iterator's mutex and wants the GIL;
- the stub's message thread, holding the map of iterators' mutex, wants that iterator's mutex
  to queue the request's next response there;
- any thread starting a decoupled BLS request (``exec``) holds the GIL and wants the map's
  mutex (``Stub::GetResponseIterator``).

Caught with gdb on a wedged test server (``loadtest/stress.py``): the engine's thread blocked
in ``send`` for ever, every stream of ``ensemble_stream`` waiting, readiness still true.

The cycle needs ``Next`` to wait. So the engine model says, after each response to a caller's
request has been handed over (its ``send`` returns only once the caller's stub has queued the
response in the iterator), "one more for key K" on a Unix stream socket the caller listens on,
and the caller calls ``next()`` only when a response is waiting or the iterator has ended:
``Next`` then never waits, and takes the iterator's mutex while holding the GIL, which breaks
the cycle.

The socket lives in Linux's abstract namespace under the caller stub's pid, which is written
into the BLS request id (``codegen-<pid>-<random>``, backend/cancel.py's key), so the engine
knows where to tell without any set-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

FINAL_MARK = "F"
# Past this long without word of a response the reader calls next() anyway (the old way, which
# can wait inside the stub): the engine's word is lost only if the socket failed.
WORD_TIMEOUT_S = 120.0


def ready_address(pid: int) -> str:
    """The abstract socket name (leading NUL: no file) on which caller stub ``pid`` listens."""
    return f"\0codegen-ready-{pid}"


def owner_pid(key: str) -> int | None:
    """The caller stub's pid written in a BLS request id ``codegen-<pid>-<random>``."""
    parts = key.split("-")
    if len(parts) == 3 and parts[0] == "codegen" and parts[1].isdigit():
        return int(parts[1])
    return None


class _Waiting:
    """What the engine said of one request: how many responses it handed over, and whether
    the last one (the final flag) was among them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.told = 0
        self.final = False


class ReadyListener:
    """The caller's end: counts the engine's responses per request key."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self._lock = threading.Lock()
        self._keys: dict[str, _Waiting] = {}
        self._closed = False
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(ready_address(self.pid))
        self.sock.listen(16)
        threading.Thread(target=self._accept, name="bls-ready", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self._closed:
                    return
                log.exception("the BLS ready socket failed")
                continue
            threading.Thread(
                target=self._read, args=(conn,), name="bls-ready-read", daemon=True
            ).start()

    def _read(self, conn: socket.socket) -> None:
        with conn, conn.makefile("r", encoding="ascii", errors="replace") as lines:
            for line in lines:
                key, _, mark = line.strip().partition(" ")
                self._word(key, mark == FINAL_MARK)

    def _word(self, key: str, final: bool) -> None:
        with self._lock:
            waiting = self._keys.get(key)
        if waiting is None:  # a request already read to its end (or not ours)
            return
        with waiting.cond:
            waiting.told += 1
            waiting.final = waiting.final or final
            waiting.cond.notify()

    def responses(self, key: str, replies) -> Iterator:
        """``replies`` (the iterator ``exec(decoupled=True)`` returned for request ``key``),
        each response read only once it is there. Register the key with :meth:`expect` before
        ``exec``.

        The first response is there when ``exec`` returns, and may come from Triton rather
        than the engine (a full queue, a queue timeout), with no word. An error response is
        always the last (the engine answers a caller once: backend/engine_answers.py, Reply),
        so after one the iterator is finished. Any other response ``k`` is read once the
        engine told of ``k`` responses; once it told of its final one and all were read, the
        iterator is finished: ``next()`` then ends it without waiting."""
        with self._lock:
            waiting = self._keys.setdefault(key, _Waiting())
        read, after_error = 0, False
        try:
            while True:
                if read and not after_error:
                    self._wait(key, waiting, read)
                try:
                    reply = next(replies)
                except StopIteration:
                    break
                read += 1
                after_error = reply.has_error()
                yield reply
        finally:
            self.forget(key)

    def _wait(self, key: str, waiting: _Waiting, read: int) -> None:
        """Until response ``read + 1`` is there, or the last one was read."""
        with waiting.cond:
            told = waiting.cond.wait_for(
                lambda: waiting.told > read or waiting.final, timeout=WORD_TIMEOUT_S
            )
        if not told:
            log.warning(
                "no word of a response to %s in %.0f s: reading anyway", key, WORD_TIMEOUT_S
            )

    def expect(self, key: str) -> None:
        """Count the engine's word on ``key`` from now on (before its request is sent)."""
        with self._lock:
            self._keys.setdefault(key, _Waiting())

    def forget(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class ReadyTeller:
    """The engine's end: one connection per caller stub, a line per response handed over."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}

    def tell(self, key: str, final: bool) -> None:
        pid = owner_pid(key)
        if pid is None:  # a direct client of the engine model: it reads as it likes
            return
        line = f"{key} {FINAL_MARK if final else '-'}\n".encode("ascii", errors="replace")
        with self._lock:
            for attempt in range(2):  # a stale connection (the caller restarted) is redone
                try:
                    self._conn(pid).sendall(line)
                    return
                except OSError as exc:
                    self._drop(pid)
                    if attempt:
                        log.error("could not tell caller %d of a response: %r", pid, exc)

    def _conn(self, pid: int) -> socket.socket:
        conn = self._conns.get(pid)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(self.timeout_s)
            conn.connect(ready_address(pid))
            self._conns[pid] = conn
        return conn

    def _drop(self, pid: int) -> None:
        conn = self._conns.pop(pid, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            for pid in list(self._conns):
                self._drop(pid)


class TellingSender:
    """A response sender that tells the caller, after each response was handed over."""

    def __init__(self, sender, key: str, teller: ReadyTeller) -> None:
        self.sender, self.key, self.teller = sender, key, teller

    def send(self, response=None, flags: int = 0) -> None:
        if response is None:
            self.sender.send(flags=flags)
        else:
            self.sender.send(response, flags=flags)
        self.teller.tell(self.key, final=bool(flags))

    def is_cancelled(self) -> bool:
        """Always False: a BLS request cannot be cancelled in r24.10, its caller cancels through
        the cancel channel (backend/cancel.py), and asking the server is a round trip on the
        engine's thread that could only answer no."""
        return False
