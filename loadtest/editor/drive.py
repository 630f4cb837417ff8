"""One typist's request at a pause (:func:`type_pause`, what the profile's Locust users send):
a request never outlives its pause."""

from __future__ import annotations

import time

from loadtest.editor.figures import ABANDONED, ANSWERED, ERROR, EditorRecord
from loadtest.editor.protocols import Exchange, Sender
from loadtest.editor.typist import Visit
from loadtest.editor.window import Clipper


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
