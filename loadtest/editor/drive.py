"""Typists at work: one thread per typist, each sending a request at every pause and abandoning
it at the next keystroke, for a bounded time.

Every request is bounded by its pause (the typist waits on it no longer, see
:mod:`loadtest.editor.protocols`), and no typist starts a pause after the run's end, so a run
takes at most its duration plus one typing burst and one pause. :class:`Typing` is what the
profile's run (:mod:`loadtest.editor.run`) and the soak's editor phase share; each gives it a
``record`` callback for the requests as they end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.editor.figures import ABANDONED, ANSWERED, ERROR, EditorRecord, Percentiles
from loadtest.editor.protocols import Exchange, Sender
from loadtest.editor.suffix import SuffixMode
from loadtest.editor.typist import TypingStyle, Typist, Visit
from loadtest.editor.window import Clipper

Record = Callable[[EditorRecord], None]
Begin = Callable[[], object]  # called as a request is sent; its value goes back to End
End = Callable[[object, EditorRecord], None]


@dataclass
class Typing:
    """``typists`` typists over ``files`` until ``until`` (monotonic), sending with ``sender``."""

    files: Sequence[Path]
    typists: int
    sender: Sender
    clipper: Clipper
    suffix: SuffixMode
    seed: int
    style: TypingStyle
    begin: Begin = lambda: None
    end: End = lambda ticket, record: None

    def __post_init__(self) -> None:
        self.origin = time.monotonic()
        self.records: list[EditorRecord] = []
        self.in_flight = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failures: list[str] = []  # a typist thread that died, and why

    def start(self, until: float) -> Typing:
        self.origin = time.monotonic()
        for index in range(self.typists):
            thread = threading.Thread(target=self._type, args=(index, until), daemon=True)
            thread.name = f"typist-{index}"
            self.threads.append(thread)
            thread.start()
        return self

    def join(self, timeout: float) -> int:
        """Wait for the typists to finish their last pause; how many are still busy."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self.threads)

    def _type(self, index: int, until: float) -> None:
        typist = Typist(index, self.files, self.seed, self.style)
        try:
            for visit in typist.visits():
                self._sleep(visit.pause.typing_s)  # the keystrokes; the first one abandoned
                if self.stop.is_set() or time.monotonic() >= until:
                    return
                self._request(index, visit)
        except Exception as exc:  # reported with the run, never lost
            with self.lock:
                self.failures.append(f"typist {index}: {type(exc).__name__}: {exc}")

    def _sleep(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def _request(self, index: int, visit: Visit) -> None:
        pause = visit.pause
        window = self.clipper.clip(visit.text, pause.cursor, self.suffix.send, pause.suffix_at)
        ticket = self.begin()
        sent = time.monotonic()
        with self.lock:
            self.in_flight += 1
        exchange: Exchange | None = None
        try:
            exchange = self.sender.open(window.prefix, window.suffix, seed=len(self.records))
            over = exchange.wait(sent + pause.pause_s)
            if not over:
                exchange.abandon()  # the next keystroke
        except Exception as exc:
            exchange = exchange or Exchange()
            if not exchange.over:
                exchange.abandon()
            exchange.error = exchange.error or f"{type(exc).__name__}: {exc}"
        record = _record(index, sent - self.origin, pause.pause_s, window, exchange)
        with self.lock:
            self.in_flight -= 1
            self.records.append(record)
        self.end(ticket, record)

    def snapshot(self) -> tuple[list[EditorRecord], int]:
        with self.lock:
            return list(self.records), self.in_flight


def _record(index: int, t_s: float, pause_s: float, window, exchange: Exchange) -> EditorRecord:
    outcome = ERROR if exchange.error else ANSWERED if exchange.finished else ABANDONED

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    return EditorRecord(
        typist=index,
        t_s=round(t_s, 3),
        outcome=outcome,
        pause_s=round(pause_s, 3),
        prefix_tokens=window.prefix_tokens,
        suffix_tokens=window.suffix_tokens,
        first_token_ms=ms(exchange.first_token_s),
        latency_ms=ms(exchange.latency_s) if outcome == ANSWERED else None,
        pieces=exchange.pieces,
        tokens_read=exchange.tokens_read,
        completion_tokens=exchange.completion_tokens if outcome == ANSWERED else None,
        error=exchange.error,
    )


def progress_line(typing: Typing, label: str, elapsed: float, duration: float) -> str:
    """One progress line: time, requests by outcome, first-token p50 of the recent answers."""
    records, in_flight = typing.snapshot()
    counts = {o: sum(r.outcome == o for r in records) for o in (ANSWERED, ABANDONED, ERROR)}
    recent = [r.first_token_ms for r in records[-100:] if r.outcome == ANSWERED]
    ttft = Percentiles.of([t for t in recent if t is not None]).p50
    return (
        f"{label} {elapsed:4.0f}/{duration:.0f}s | {typing.typists} typists | sent "
        f"{len(records) + in_flight} answered {counts[ANSWERED]} abandoned {counts[ABANDONED]} "
        f"errors {counts[ERROR]} in flight {in_flight} | first token p50 "
        f"{'-' if ttft is None else f'{ttft:.0f} ms'}"
        + ("" if typing.suffix.send else " | PREFIX-ONLY (suffix refused)")
    )
