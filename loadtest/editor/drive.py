"""One typist's request at a pause (:func:`type_pause`, what the profile's Locust users send):
a request never outlives its pause; and the request as a row of the event table."""

from __future__ import annotations

from loadtest.editor.protocols import Exchange, Sender
from loadtest.editor.typist import Visit
from loadtest.editor.window import Clipper, Window


def indent_at(text: str, cursor: int) -> int:
    """The cursor line's indentation in columns (llama.vim's ``n_indent``)."""
    line = text[text.rfind("\n", 0, cursor) + 1 : cursor]
    return len(line) - len(line.lstrip(" \t"))


def type_pause(sender: Sender, clipper: Clipper, with_suffix: bool, visit: Visit,
               seed: int) -> tuple[Exchange, Window]:  # fmt: skip
    """One pause's request: sent, read until answered or the next keystroke, then abandoned."""
    pause, exchange = visit.pause, Exchange()
    window = clipper.clip(visit.text, pause.cursor, with_suffix, pause.suffix_at)
    try:
        indent = indent_at(visit.text, pause.cursor)
        exchange = sender.open(window.prefix, window.suffix, seed=seed, n_indent=indent)
        if not exchange.wait(exchange.sent + pause.pause_s):
            exchange.abandon()  # the next keystroke
    except Exception as exc:
        if not exchange.over:
            exchange.abandon()
        exchange.error = exchange.error or f"{type(exc).__name__}: {exc}"
    return exchange, window


def request_event(exchange: Exchange, window: Window, pause_s: float, typist: int,
                  protocol: str, one_line: bool, wall: float) -> dict:  # fmt: skip
    """A request as the arguments of Locust's ``request`` event, the editor's columns in its
    context: outcome ``ok`` (answered within the pause), ``abandoned`` or ``error``."""
    outcome = "error" if exchange.error else "ok" if exchange.finished else "abandoned"
    first, latency = exchange.first_token_s, exchange.latency_s if outcome == "ok" else None
    delivered = exchange.tokens_read  # an abandoned request: the pieces read before leaving
    if outcome == "ok" and exchange.completion_tokens is not None:
        delivered = exchange.completion_tokens  # the server's count of the whole answer
    return dict(
        request_type=protocol, name="one-line" if one_line else "completion",
        response_time=pause_s * 1000 if latency is None else round(latency * 1000, 1),
        response_length=exchange.tokens_read, start_time=wall,
        exception=RuntimeError(exchange.error) if outcome == "error" else None,
        context={
            "outcome": outcome, "tokens": delivered, "typist": typist, "one_line": one_line,
            "first_token_ms": None if first is None else round(first * 1000, 1),
            "pause_s": round(pause_s, 3), "prefix_tokens": window.prefix_tokens,
            "suffix_tokens": window.suffix_tokens, "pieces": exchange.pieces,
            "tokens_read": exchange.tokens_read,
        },
    )  # fmt: skip
