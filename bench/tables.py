"""The sections' tables (title, context, headers, rows) from the measured rows.

Pure functions of the results dictionary, so they are unit-tested without running a model, and
a ``results.json`` from an earlier run can be re-rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.format import Table, context, fmt, model_text, rate, ratio, verdict

# The bench's targets; each check row says which it is held to.
STEP_COST_MAX = 1.15  # sampled-step time over greedy-step time, engine, batch 16 and 64
SERVED_OVER_BARE_MIN = 0.9  # served tokens/s over bare, every output length
CONTINUOUS_OVER_STATIC_MIN = 1.0  # continuous arrivals at least as fast as static batches
MIXED_SLOWDOWN_MAX = 2.0  # short requests' median latency next to long ones over alone
SERVED_OVERHEAD_MAX_MS = 15.0  # one request alone, served minus bare
# 16 clients at output 128: 4x the engine's tokens/s when this target was set (about 615)
THROUGHPUT_TARGET_LENGTH, THROUGHPUT_TARGET = 128, 4 * 615.0

KERNEL_SYSTEMS = ("engine", "openvino", "transformers", "ct2")

# -- derived rows ------------------------------------------------------------------------------


def kernel_comparison(kernels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, dtype, batch, mode): the three systems' tokens/s and the ratios."""
    keyed: dict[tuple, dict[str, Any]] = {}
    for row in kernels:
        key = (row["model"], row["dtype"], row["batch"], row["mode"])
        entry = keyed.setdefault(
            key,
            {
                "model": row["model"],
                "dtype": row["dtype"],
                "batch": row["batch"],
                "mode": row["mode"],
                "new_tokens": {},
                "wanted_tokens": {},
                "notes": {},
            },
        )
        entry[row["system"]] = row.get("tokens_per_s")
        entry["new_tokens"][row["system"]] = row.get("new_tokens")
        if row.get("wanted_tokens"):
            entry["wanted_tokens"][row["system"]] = row["wanted_tokens"]
        if row.get("note"):
            entry["notes"][row["system"]] = row["note"]
    out = []
    for entry in keyed.values():
        entry["engine_over_transformers"] = ratio(entry.get("engine"), entry.get("transformers"))
        entry["engine_over_ct2"] = ratio(entry.get("engine"), entry.get("ct2"))
        entry["openvino_over_engine"] = ratio(entry.get("openvino"), entry.get("engine"))
        out.append(entry)
    return out


def step_cost(
    kernels: Sequence[dict[str, Any]], batches: Sequence[int] = (16, 64)
) -> list[dict[str, Any]]:
    """The engine's sampled-step over greedy-step time at ``batches``: the same tokens, so the
    time ratio is greedy tokens/s over sampled tokens/s."""
    comparison = kernel_comparison(kernels)
    sampled_rows = {
        (e["model"], e["dtype"], e["batch"]): e for e in comparison if e["mode"] == "sampled"
    }
    rows = []
    for entry in comparison:
        if entry["mode"] != "greedy" or entry["batch"] not in batches:
            continue
        sampled = sampled_rows.get((entry["model"], entry["dtype"], entry["batch"]))
        greedy_rate = entry.get("engine")
        sampled_rate = sampled.get("engine") if sampled else None
        if greedy_rate is None or sampled_rate is None:
            continue
        value = ratio(greedy_rate, sampled_rate)
        rows.append(
            {
                "model": entry["model"],
                "dtype": entry["dtype"],
                "batch": entry["batch"],
                "greedy_tokens_per_s": greedy_rate,
                "sampled_tokens_per_s": sampled_rate,
                "sampled_over_greedy_time": value,
                "verdict": verdict(value, STEP_COST_MAX, at_most=True),
            }
        )
    return rows


def kernel_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("kernels") or []
    if not rows:
        return []
    plan = results["plan"]
    tables: list[Table] = []
    comparison = kernel_comparison(rows)
    for model in dict.fromkeys(r["model"] for r in comparison):
        entries = [e for e in comparison if e["model"] == model]
        body = []
        reasons: dict[str, str] = {}  # "not supported" explanations, said once per table
        for e in entries:
            counts = sorted({n for n in e["new_tokens"].values() if n})
            cut = [
                f"{s} {n}"
                for s, n in e["new_tokens"].items()
                if n and n < e["wanted_tokens"].get(s, n)
            ]
            cells = []
            for system in KERNEL_SYSTEMS:
                note = e["notes"].get(system, "")
                if e.get(system) is None and note and "tokens (time budget)" not in note:
                    mark = "n/s" if note.startswith("not supported") else "failed"
                    reasons[f"{system} {e['dtype']}"] = note
                    cells.append(mark)
                else:
                    cells.append(rate(e.get(system)))
            body.append(
                [
                    e["dtype"],
                    str(e["batch"]),
                    e["mode"],
                    *cells,
                    fmt(e["openvino_over_engine"], 2, "x"),
                    fmt(e["engine_over_transformers"], 2, "x"),
                    fmt(e["engine_over_ct2"], 2, "x"),
                    "/".join(str(n) for n in counts) or "—",
                    ", ".join(cut),
                ]
            )
        key = next((r.get("plan_key") for r in rows if r["model"] == model), None)
        kplan = plan["kernels"].get(key, {}) if key else {}
        settings = (
            f"static batches, {kplan.get('prompt_tokens', '?')}-token prompts, "
            f"{kplan.get('new_tokens', '?')} new tokens (fewer where a row says so), end token "
            f"banned; sampled = top-k {40} / top-p 0.95 / temperature 0.8; device {plan['device']}"
        )
        footnote = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        tables.append(
            (
                f"Static batches: engine vs openvino vs transformers vs CTranslate2 — {model}",
                context(results, model_text(results, model), settings, footnote),
                [
                    "dtype",
                    " batch",
                    "mode",
                    " engine tok/s",
                    " openvino tok/s",
                    " transformers tok/s",
                    " ct2 tok/s",
                    " openvino/engine",
                    " engine/transformers",
                    " engine/ct2",
                    " new tokens",
                    "fewer tokens (time budget)",
                ],
                body,
            )
        )
    steps = step_cost(rows, plan.get("step_batches", (16, 64)))
    if steps:
        tables.append(
            (
                "Engine: sampled step vs greedy step",
                context(
                    results,
                    "same static batches as above; time ratio = greedy tok/s / sampled tok/s",
                    f"target <= {STEP_COST_MAX}",
                ),
                [
                    "model",
                    "dtype",
                    " batch",
                    " greedy tok/s",
                    " sampled tok/s",
                    " sampled/greedy time",
                    "target",
                ],
                [
                    [
                        s["model"],
                        s["dtype"],
                        str(s["batch"]),
                        rate(s["greedy_tokens_per_s"]),
                        rate(s["sampled_tokens_per_s"]),
                        fmt(s["sampled_over_greedy_time"], 2),
                        s["verdict"],
                    ]
                    for s in steps
                ],
            )
        )
    return tables


def beam_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("beams")
    if not rows:
        return []
    first = rows[0]
    return [
        (
            "Beam search: widths side by side with transformers",
            context(
                results,
                f"default model, float32; {first['prompts']} prompts of "
                f"{results['plan']['beam_prompt_tokens']} tokens at once, {first['new_tokens']} "
                "new tokens each (end token banned); transformers: generate(num_beams=width) "
                "on the same batch",
            ),
            [
                " width",
                " engine tok/s",
                " every beam tok/s",
                " transformers tok/s",
                " engine / transformers",
                " KV cache peak MiB",
                " best beams equal",
            ],
            [
                [
                    str(row["width"]),
                    rate(row["engine_tokens_per_s"]),
                    rate(row["engine_beam_tokens_per_s"]),
                    rate(row["transformers_tokens_per_s"]),
                    fmt(row["engine_over_transformers"], 2, "x"),
                    fmt(row["kv_cache_peak_mib"], 1),
                    f"{row['best_beams_agree']}/{row['prompts']}",
                ]
                for row in rows
            ],
        )
    ]
