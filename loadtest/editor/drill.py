"""The abandonment drill: long completions, one at a time, each abandoned at its first piece;
the server's generated-token counter around each, less what the client read, is what it
generated after the client left (an upper bound: tokens in transit count too). And the resend
probe: the warm path of a keystroke, one request at a time; and the check after the run."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from loadtest.editor.protocols import Exchange, Sender
from loadtest.editor.systems import System
from loadtest.editor.typist import line_starts, read_text
from reporting.events import EventLog

RESENT = "resent"  # the resend probe's event name and window, apart from the typists'
DRILL_TOKENS = 200  # long enough that no answer can arrive before its first piece is read
CHAT_DRILL = "chat"  # the drill again through /v1/chat/completions, for a model that chats


@dataclass(frozen=True)
class DrillOutcome:
    outcome: str  # ok (answered), abandoned, error
    tokens_read: int  # abandoned: read before leaving; answered: the whole completion
    error: str = ""
    generated: float | None = None  # the engine's tokens for this request; None: not read


def abandon_at_first_piece(exchange: Exchange, limit_s: float = 60.0) -> DrillOutcome:
    """Read until the first piece of text (or the end, or a failure), then leave."""
    deadline = time.monotonic() + limit_s
    if exchange.stream is not None:  # over HTTP the stream's own reader leaves, no hand-off
        exchange.stream.leave_after = 1
    while exchange.first_token_s is None and not exchange.over:
        if time.monotonic() >= deadline:
            exchange.abandon()
            return DrillOutcome("error", 0, f"no first piece within {limit_s:.0f} s")
        exchange.wait(time.monotonic() + 0.001)  # the client's reaction time
    if not exchange.over:
        exchange.abandon()
    read = exchange.completion_tokens or exchange.tokens_read  # answered: the whole completion
    return DrillOutcome(exchange.outcome, read, exchange.error)


def points(files: Sequence[Path], share: float, count: int, min_lines: int = 0) -> list:
    """``count`` (text, cursor) at the line start ``share`` down each file, the files in turn."""
    texts = filter(None, map(read_text, files))
    found = (
        (text, starts[int(len(starts) * share)])
        for text in texts
        if len(starts := line_starts(text)) > min_lines
    )
    return list(itertools.islice(itertools.cycle(found), count))


def drill_figures(outcomes: Sequence[DrillOutcome]) -> dict:
    """``unread_per_abandoned``: (generated - read) / abandoned; None: a count went unread."""
    gone = [o for o in outcomes if o.outcome == "abandoned"]
    read = sum(o.tokens_read for o in outcomes)
    counted = all(o.generated is not None for o in outcomes)
    generated = sum(o.generated or 0.0 for o in outcomes) if counted else None
    each = [o.generated - o.tokens_read for o in gone if o.generated is not None]
    return {
        "requests": len(outcomes),
        "abandoned": len(gone),
        "max_tokens": DRILL_TOKENS,
        "answered": sum(o.outcome == "ok" for o in outcomes),
        "errors": sum(o.outcome == "error" for o in outcomes),
        "tokens_read": read,
        "generated": generated,
        "unread_each": each,
        "unread_per_abandoned": (generated - read) / len(gone) if counted and gone else None,
        "spread": f" (median {median(each):.1f}, most {max(each):.0f})." if each else ".",
        "error_messages": [o.error for o in outcomes if o.error],
    }


def run_drill(system: System, prompts: Sequence[str]) -> dict:
    """One request at a time, between two readings of the counters (:meth:`System.settled`)."""
    sender = replace(system.sender, max_tokens=DRILL_TOKENS, one_line=False, t_max_predict_ms=0)
    outcomes = []
    for seed, prompt in enumerate(prompts):
        try:
            before: dict[str, float] | None = system.counters()
        except OSError:
            before = None
        outcome = abandon_at_first_piece(sender.open(prompt, "", seed=seed))
        after = before and system.settled(before, 5.0 if outcome.outcome == "error" else 60.0)
        generated = after["generated"] - before["generated"] if before and after else None
        outcomes.append(replace(outcome, generated=generated))
    return drill_figures(outcomes)


def chats(address: str) -> bool:
    """Whether the OpenAI API at ``address`` says its first model has a chat template."""
    import httpx

    try:
        models = httpx.get(f"http://{address}/v1/models", timeout=10).json()["data"]
        return bool(models and models[0].get("chat"))
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False


def run_chat_drill(system: System, prompts: Sequence[str]) -> dict | None:
    """The drill through ``/v1/chat/completions`` (each prompt one user message), for the
    project's API in front of a model that chats; None otherwise."""
    sender = system.sender
    if not system.engine or sender.protocol != "openai" or not chats(sender.address):
        return None
    return run_drill(replace(system, sender=replace(sender, chat=True)), prompts)


def run_resend(system: System, pairs: Sequence[tuple[str, str]], events: EventLog) -> None:
    """Each (prompt, the same prompt 3 characters on) one at a time: the first fills the cache,
    the second is recorded (event :data:`RESENT`): a keystroke's warm path, without the load."""
    for seed, (cold, warm) in enumerate(pairs):
        for prompt in (cold, warm):
            exchange = system.sender.open(prompt, "", seed=seed)
            if not exchange.wait(time.monotonic() + 60.0):
                exchange.abandon()
                exchange.error = exchange.error or "no answer within 60 s"
        first = exchange.first_token_s
        events.record(
            system=system.label,
            window=RESENT,
            kind=system.sender.protocol,
            name=RESENT,
            latency_ms=1000 * (exchange.latency_s or time.monotonic() - exchange.sent),  # failed
            first_token_ms=None if first is None else 1000 * first,
            outcome=exchange.outcome,
            tokens=exchange.completion_tokens or exchange.tokens_read,
            error=exchange.error,
        )


def after_check(sender: Sender) -> str:
    """One short prefix-only request, given 30 s: does the server answer normally now?"""
    exchange = sender.open("import os\n", "", seed=0)
    exchange.wait(time.monotonic() + 30.0)
    if exchange.finished:
        return f"answered a plain request in {1000 * (exchange.latency_s or 0):.0f} ms"
    if not exchange.over:
        exchange.abandon()
        return "NO ANSWER to a plain request within 30 s"
    return f"a plain request FAILED: {exchange.error}"
