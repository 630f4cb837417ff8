"""The sections' tables (title, context, headers, rows) from the measured rows.

Pure functions of the results dictionary, so they are unit-tested without running a model, and
a ``results.json`` from an earlier run can be re-rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.format import Table, context, fmt, model_text, rate, ratio, verdict

# Targets from issue 11; each check row says which it is held to.
STEP_COST_MAX = 1.15  # sampled-step time over greedy-step time, engine, batch 16 and 64
SERVED_OVER_BARE_MIN = 0.9  # served tokens/s over bare, every output length
CONTINUOUS_OVER_STATIC_MIN = 1.0  # continuous arrivals at least as fast as static batches
MIXED_SLOWDOWN_MAX = 2.0  # short requests' median latency next to long ones over alone
SERVED_OVERHEAD_MAX_MS = 15.0  # one request alone, served minus bare
# 16 clients at output 128: 4x the engine's tokens/s before the work of issue 11 (about 615)
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


def _load_context(results: dict[str, Any], extra: str) -> str:
    load = results.get("load_settings", {})
    model = load.get("model", "default")
    return context(
        results,
        model_text(results, model),
        f"torch dtype {load.get('dtype', '?')}, openvino dtype {load.get('openvino_dtype', '—')}",
        f"device {results['plan']['device']}",
        f"engine max_batch_size {load.get('max_batch_size', '?')}",
        "sampling top-k 40 / top-p 0.95 / temperature 0.8, code prompts, end token banned "
        f"(openvino: end_id {load.get('openvino_end_id', '?')} stands in for it)",
        extra,
    )


def throughput_verdict(row: dict[str, Any]) -> str:
    """The bare engine's tokens/s against the throughput target, at the target's length."""
    if row["length"] != THROUGHPUT_TARGET_LENGTH:
        return "—"
    return verdict(row.get("bare_tokens_per_s"), THROUGHPUT_TARGET, at_most=False)


def arrival_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("arrivals") or []
    if not rows:
        return []
    clients = results["plan"]["clients"]
    body = []
    for r in rows:
        body.append(
            [
                str(r["length"]),
                rate(r.get("forward_ceiling_tokens_per_s")),
                rate(r.get("bare_tokens_per_s")),
                throughput_verdict(r),
                rate(r.get("served_tokens_per_s")),
                fmt(r.get("served_over_bare"), 2),
                verdict(r.get("served_over_bare"), SERVED_OVER_BARE_MIN, at_most=False),
                rate(r.get("static_tokens_per_s")),
                fmt(r.get("continuous_over_static"), 2),
                verdict(r.get("continuous_over_static"), CONTINUOUS_OVER_STATIC_MIN, False),
                r.get("windows", ""),
            ]
        )
    return [
        (
            f"Continuous arrivals: {clients} closed-loop clients",
            _load_context(
                results,
                f"bare = threads submitting to an in-process Engine; served = CodegenClient over "
                f"gRPC to Triton's ensemble; static = {clients} submitted at once, wait for all, "
                f"repeat; bare and served alternate in mirrored half windows (bare, served, "
                f"served, bare), each rate the mean of its two; forward ceiling = {clients} rows "
                f"/ one decode forward pass at the "
                f"positions the clients hold (no sampling, prefill or serving: no scheduler "
                f"beats it); targets bare >= {THROUGHPUT_TARGET:,.0f} tok/s at output "
                f"{THROUGHPUT_TARGET_LENGTH}, served/bare >= {SERVED_OVER_BARE_MIN}, "
                f"continuous/static >= {CONTINUOUS_OVER_STATIC_MIN}",
            ),
            [
                " output tokens",
                " forward ceiling tok/s",
                " bare tok/s",
                "target",
                " served tok/s",
                " served/bare",
                "target",
                " static tok/s",
                " continuous/static",
                "target ",
                "windows (s)",
            ],
            body,
        ),
        *openvino_arrival_tables(results),
    ]


def openvino_arrival_tables(results: dict[str, Any]) -> list[Table]:
    """The openvino backend next to the torch engine at every length, bare and served, with
    the reference generates at the target length (bench/traffic.py)."""
    rows = [r for r in results.get("arrivals") or [] if "openvino_bare_tokens_per_s" in r]
    if not rows:
        return []
    clients = results["plan"]["clients"]
    body = [
        [
            str(r["length"]),
            rate(r.get("bare_tokens_per_s")),
            rate(r.get("served_tokens_per_s")),
            rate(r.get("openvino_bare_tokens_per_s")),
            rate(r.get("openvino_served_tokens_per_s")),
            fmt(r.get("openvino_served_over_bare"), 2),
            fmt(ratio(r.get("openvino_served_tokens_per_s"), r.get("served_tokens_per_s")), 2),
            rate(r.get("pipeline_tokens_per_s")),
            rate(r.get("transformers_static_tokens_per_s")),
            str(r.get("openvino_short", 0) + r.get("openvino_served_short", 0)),
        ]
        for r in rows
    ]
    return [
        (
            f"Continuous arrivals: openvino backend vs torch engine, {clients} clients",
            _load_context(
                results,
                "each system alone (bare: in this process; served: Triton with the engine "
                "model's backend set to it); pipeline = OpenVINO GenAI's own "
                f"ContinuousBatchingPipeline.generate on {clients} of the same code prompts "
                "(min_new_tokens), batches back to back; bare, served and pipeline alternate in "
                "mirrored half windows (A B C C B A); transformers = AutoModelForCausalLM"
                f".generate, a static batch of {clients} 32-token prompts, the faster of its "
                "dtypes; both sampled as above",
            ),
            [
                " output tokens",
                " torch bare tok/s",
                " torch served tok/s",
                " openvino bare tok/s",
                " openvino served tok/s",
                " openvino served/bare",
                " openvino/torch served",
                " pipeline generate tok/s",
                " transformers generate tok/s",
                " openvino short requests",
            ],
            body,
        )
    ]


def mixed_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("mixed") or []
    if not rows:
        return []
    plan = results["plan"]
    body = [
        [
            r["path"].replace("_", " "),
            fmt(r.get("alone_median_ms"), 1),
            fmt(r.get("mixed_median_ms"), 1),
            fmt(r.get("slowdown"), 2, "x"),
            verdict(r.get("slowdown"), MIXED_SLOWDOWN_MAX, at_most=True),
            f"{r.get('alone_samples', 0)}/{r.get('mixed_samples', 0)}",
        ]
        for r in rows
    ]
    return [
        (
            f"Mixed lengths: {plan['mixed_clients']} clients x {plan['mixed_short']} tokens next "
            f"to {plan['mixed_clients']} x {plan['mixed_long']} tokens",
            _load_context(
                results,
                f"alone = all {2 * plan['mixed_clients']} clients ask for {plan['mixed_short']} "
                "tokens; the short requests' median latency mixed over alone; target <= "
                f"{MIXED_SLOWDOWN_MAX}x",
            ),
            [
                "path",
                f" {plan['mixed_short']}-token alone ms",
                f" {plan['mixed_short']}-token mixed ms",
                " slowdown",
                "target",
                " samples alone/mixed",
            ],
            body,
        )
    ]


def single_tables(results: dict[str, Any]) -> list[Table]:
    single = results.get("single")
    if not single:
        return []
    plan = results["plan"]
    body = []
    for backend, prefix, overhead_key in (
        ("torch", "", "overhead_ms"),
        ("openvino", "openvino_", "openvino_served_overhead_ms"),
    ):
        bare, served = (
            single.get(f"{prefix}bare_median_ms"),
            single.get(f"{prefix}served_median_ms"),
        )
        if bare is None and served is None:
            continue
        overhead = single.get(overhead_key)
        body.append(
            [
                backend,
                fmt(bare, 1),
                fmt(served, 1),
                fmt(overhead, 1),
                verdict(overhead, SERVED_OVERHEAD_MAX_MS, at_most=True),
            ]
        )
    return [
        (
            f"One request alone: {plan['single_tokens']} tokens",
            _load_context(
                results,
                f"medians over {single.get('repeats')} repeats; target served - bare <= "
                f"{SERVED_OVERHEAD_MAX_MS:g} ms",
            ),
            ["backend", " bare ms", " served ms", " served - bare ms", "target"],
            body,
        )
    ]


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
