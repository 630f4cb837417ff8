"""One typist's request at a pause (:func:`type_pause`, what the profile's Locust users send),
and :class:`Typing`, typist threads for a bounded time, which only the soak's editor phase
drives. A request never outlives its pause, and no typist starts a pause after the end."""

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


@dataclass
class Typing:
    """``typists`` threads over ``files`` until ``until`` (monotonic), sending with ``sender``;
    ``begin()`` is called as a request is sent and its value goes to ``end(value, record)``."""

    files: Sequence[Path]
    typists: int
    sender: Sender
    clipper: Clipper
    suffix: SuffixMode
    seed: int
    style: TypingStyle
    begin: Callable[[], object] = lambda: None
    end: Callable[[object, EditorRecord], None] = lambda ticket, record: None

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
        try:
            for visit in Typist(index, self.files, self.seed, self.style).visits():
                self.stop.wait(visit.pause.typing_s)  # the keystrokes; the first one abandons
                if self.stop.is_set() or time.monotonic() >= until:
                    return
                ticket = self.begin()
                with self.lock:
                    self.in_flight += 1
                    seed = len(self.records)
                record = type_pause(self.sender, self.clipper, self.suffix.send, index,
                                    self.origin, visit, seed)  # fmt: skip
                with self.lock:
                    self.in_flight -= 1
                    self.records.append(record)
                self.end(ticket, record)
        except Exception as exc:  # reported with the run, never lost
            with self.lock:
                self.failures.append(f"typist {index}: {type(exc).__name__}: {exc}")

    def snapshot(self) -> tuple[list[EditorRecord], int]:
        with self.lock:
            return list(self.records), self.in_flight


def indent_at(text: str, cursor: int) -> int:
    """The cursor line's indentation in columns (llama.vim's ``n_indent``)."""
    line = text[text.rfind("\n", 0, cursor) + 1 : cursor]
    return len(line) - len(line.lstrip(" \t"))


def type_pause(
    sender: Sender,
    clipper: Clipper,
    with_suffix: bool,
    index: int,
    origin: float,
    visit: Visit,
    seed: int,
) -> EditorRecord:
    """One pause's request: sent, read until answered or the next keystroke, then abandoned."""
    pause = visit.pause
    window = clipper.clip(visit.text, pause.cursor, with_suffix, pause.suffix_at)
    sent = time.monotonic()
    exchange: Exchange | None = None
    try:
        indent = indent_at(visit.text, pause.cursor)
        exchange = sender.open(window.prefix, window.suffix, seed=seed, n_indent=indent)
        if not exchange.wait(sent + pause.pause_s):
            exchange.abandon()  # the next keystroke
    except Exception as exc:
        exchange = exchange or Exchange()
        if not exchange.over:
            exchange.abandon()
        exchange.error = exchange.error or f"{type(exc).__name__}: {exc}"
    outcome = ERROR if exchange.error else ANSWERED if exchange.finished else ABANDONED
    first = exchange.first_token_s
    latency = exchange.latency_s if outcome == ANSWERED else None
    return EditorRecord(
        typist=index, t_s=round(sent - origin, 3), outcome=outcome, pause_s=round(pause.pause_s, 3),
        prefix_tokens=window.prefix_tokens, suffix_tokens=window.suffix_tokens,
        first_token_ms=None if first is None else round(first * 1000, 1),
        latency_ms=None if latency is None else round(latency * 1000, 1),
        pieces=exchange.pieces, tokens_read=exchange.tokens_read,
        completion_tokens=exchange.completion_tokens if outcome == ANSWERED else None,
        error=exchange.error,
    )  # fmt: skip


def progress_line(typing: Typing, label: str, elapsed: float, duration: float) -> str:
    """One progress line of the soak's typists: requests by outcome, recent first-token p50."""
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
