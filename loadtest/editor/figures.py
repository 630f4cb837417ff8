"""The editor profile's figures, per system, from the event table (:mod:`reporting.events`, the
editor's columns in it) and one row per window of each system's own counters and CPU. Pure.

Answered (``ok``): the whole completion arrived within the pause; first token and latency
percentiles are of these. Tokens generated for abandoned requests: the server's generated-tokens
counter minus the tokens readers got (an answered request's whole completion, an abandoned one's
pieces read), per abandoned request; over SSE a piece counts as one token: an upper bound.
"""

from __future__ import annotations

import pandas as pd

from loadtest.metrics import reuse_share
from reporting.events import summarize

RESENT = "resent"  # the resend probe's rows (loadtest.editor.drill), apart from the typists'


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b or pd.isna(a) or pd.isna(b) else a / b


def _by_system(events: pd.DataFrame) -> dict[str, dict]:
    """:func:`reporting.events.summarize` per system, missing figures as None."""
    if not len(events):
        return {}
    table = summarize(events, by=["system"]).set_index("system").astype(object)
    return table.where(table.notna(), None).to_dict("index")


def system_figures(events: pd.DataFrame, windows: pd.DataFrame) -> dict[str, dict]:
    """Per system (in the order the systems first typed): the figures the report prints."""
    figures: dict[str, dict] = {}
    resent, events = events[events["name"] == RESENT], events[events["name"] != RESENT]
    typed, warm = _by_system(events), _by_system(resent)
    for system in dict.fromkeys([*windows["system"], *events["system"]]):
        rows, ours = events[events["system"] == system], windows[windows["system"] == system]
        s, w = typed.get(system, {}), warm.get(system, {})
        ok, abandoned = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "abandoned"]
        c = ours.dropna(axis=1).sum(numeric_only=True)  # a counter unread in a window: None
        seconds, generated = float(ours["seconds"].sum()), c.get("generated")
        delivered = float(pd.to_numeric(rows["tokens"], errors="coerce").fillna(0).sum())
        cpu = None if ours["cpu_s"].isna().any() else float(ours["cpu_s"].sum())
        wasted = None if generated is None else generated - delivered
        prompt = rows.get("prefix_tokens", pd.Series()) + rows.get("suffix_tokens", 0)
        figures[system] = {
            "requests": len(rows), "answered": len(ok), "abandoned": len(abandoned),
            "errors": int((rows["outcome"] == "error").sum()),
            "abandoned share": _ratio(len(abandoned), len(ok) + len(abandoned)),
            "abandoned while streaming": int(abandoned["first_token_ms"].notna().sum()),
            **{f"{f} {p} ms": s.get(f"{f.replace(' ', '_')}_{p}_ms") for f in
               ("first token", "latency") for p in ("p50", "p95")},
            "prompt tokens sent / request": float(prompt.mean()) if len(prompt) else None,
            "seconds of typing": seconds,
            "tokens delivered / s": delivered / seconds if seconds else None,
            "CPU seconds": cpu,
            "CPU ms / answered request": _ratio(None if cpu is None else 1000 * cpu, len(ok)),
            "tokens generated": generated,
            "tokens delivered": delivered,
            "generated for abandoned, unread (at most)": wasted,
            "... per abandoned request (at most)": _ratio(wasted, len(abandoned)),
            "sequences": c.get("sequences"),
            "of them cancelled": c.get("cancelled"),
            "prompt tokens received / request": _ratio(c.get("prompt"), len(rows)),
            "prompt-cache reuse share (at most)":
                reuse_share(c.get("prompt", 0.0), c.get("reused")),
            "editor stops": c.get("editor_stops"),
            "tokens generated past a stop": c.get("past_stop"),
            **{f"resent +3 chars: {f} ms": w.get(f"{f.replace(' ', '_')}_ms") for f in
               ("first token p50", "latency p50", "latency p95")},
        }  # fmt: skip
    return figures
