"""Every section's table (title, context, headers, rows): pure functions of the results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.format import Table, columns, context, fmt, model_text, prose, rate, ratio, verdict

# The bench's targets; each check row says which it is held to.
STEP_COST_MAX = 1.15  # sampled-step time over greedy-step time, engine, batch 16 and 64
SERVED_OVER_BARE_MIN = 0.9  # served tokens/s over bare, every output length
CONTINUOUS_OVER_STATIC_MIN = 1.0  # continuous arrivals at least as fast as static batches
MIXED_SLOWDOWN_MAX = 2.0  # short requests' median latency next to long ones over alone
SERVED_OVERHEAD_MAX_MS = 15.0  # one request alone, served minus bare
# 16 clients at output 128: 4x the engine's tokens/s when this target was set (about 615)
THROUGHPUT_TARGET_LENGTH, THROUGHPUT_TARGET = 128, 4 * 615.0
KERNEL_SYSTEMS = ("engine", "openvino", "transformers")
MORE = 3  # tokens (or characters) a resent prompt adds


def kernel_comparison(kernels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, dtype, batch, mode): the systems' tokens/s and the ratios."""
    keyed: dict[tuple, dict[str, Any]] = {}
    for row in kernels:
        cell = {k: row[k] for k in ("model", "dtype", "batch", "mode")}
        fresh = {**cell, "new_tokens": {}, "wanted_tokens": {}, "notes": {}}
        entry = keyed.setdefault(tuple(cell.values()), fresh)
        system = row["system"]
        entry[system] = row.get("tokens_per_s")
        entry["new_tokens"][system] = row.get("new_tokens")
        for field, key in (("wanted_tokens", "wanted_tokens"), ("notes", "note")):
            if row.get(key):
                entry[field][system] = row[key]
    for e in keyed.values():
        e["engine_over_transformers"] = ratio(e.get("engine"), e.get("transformers"))
        e["openvino_over_engine"] = ratio(e.get("openvino"), e.get("engine"))
    return list(keyed.values())


def step_cost(
    kernels: Sequence[dict[str, Any]], batches: Sequence[int] = (16, 64)
) -> list[dict[str, Any]]:
    """The engine's sampled-step over greedy-step time at ``batches``: the same tokens, so the
    time ratio is greedy tokens/s over sampled tokens/s."""
    comparison = kernel_comparison(kernels)
    sampled = {
        (e["model"], e["dtype"], e["batch"]): e.get("engine")
        for e in comparison
        if e["mode"] == "sampled"
    }
    rows = []
    for e in comparison:
        greedy = e.get("engine")
        if e["mode"] != "greedy" or e["batch"] not in batches or greedy is None:
            continue
        if (sampled_rate := sampled.get((e["model"], e["dtype"], e["batch"]))) is None:
            continue
        value = ratio(greedy, sampled_rate)
        rows.append(
            {
                "model": e["model"],
                "dtype": e["dtype"],
                "batch": e["batch"],
                "greedy_tokens_per_s": greedy,
                "sampled_tokens_per_s": sampled_rate,
                "sampled_over_greedy_time": value,
                "verdict": verdict(value, STEP_COST_MAX, True),
            }
        )
    return rows


def _kernel_row(e: dict[str, Any], reasons: dict[str, str]) -> list[str]:
    """One static-batch row; an unsupported system's reason goes to ``reasons`` (said once)."""
    cells = []
    for system in KERNEL_SYSTEMS:
        note = e["notes"].get(system, "")
        if e.get(system) is None and note and "tokens (time budget)" not in note:
            reasons[f"{system} {e['dtype']}"] = note
            cells.append("n/s" if note.startswith("not supported") else "failed")
        else:
            cells.append(rate(e.get(system)))
    counts = sorted({n for n in e["new_tokens"].values() if n})
    cut = [f"{s} {n}" for s, n in e["new_tokens"].items() if n and n < e["wanted_tokens"].get(s, n)]
    ratios = ("openvino_over_engine", "engine_over_transformers")
    return [
        e["dtype"],
        str(e["batch"]),
        e["mode"],
        *cells,
        *(fmt(e[k], 2, "x") for k in ratios),
        "/".join(str(n) for n in counts) or "—",
        ", ".join(cut),
    ]


def kernel_tables(results: dict[str, Any]) -> list[Table]:
    if not (rows := results.get("kernels") or []):
        return []
    plan, tables = results["plan"], []
    comparison = kernel_comparison(rows)
    for model in dict.fromkeys(r["model"] for r in comparison):
        reasons: dict[str, str] = {}
        body = [_kernel_row(e, reasons) for e in comparison if e["model"] == model]
        key = next((r.get("plan_key") for r in rows if r["model"] == model), None)
        kplan = plan["kernels"].get(key, {}) if key else {}
        tokens = {k: kplan.get(k, "?") for k in ("prompt_tokens", "new_tokens")}
        settings = prose("kernels", device=plan["device"], **tokens)
        footnote = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        headers = [
            "dtype",
            " batch",
            "mode",
            *(f" {s} tok/s" for s in KERNEL_SYSTEMS),
            " openvino/engine",
            " engine/transformers",
            " new tokens",
            "fewer tokens (time budget)",
        ]
        tables.append(
            (
                f"Static batches: engine vs openvino vs transformers — {model}",
                context(results, model_text(results, model), settings, footnote),
                headers,
                body,
            )
        )
    steps = step_cost(rows, plan.get("step_batches", (16, 64)))
    if steps:
        headers, body = columns(
            [
                ("model", lambda s: s["model"]),
                ("dtype", lambda s: s["dtype"]),
                (" batch", lambda s: str(s["batch"])),
                (" greedy tok/s", _rate("greedy_tokens_per_s")),
                (" sampled tok/s", _rate("sampled_tokens_per_s")),
                (" sampled/greedy time", _fmt("sampled_over_greedy_time", 2)),
                ("target", lambda s: s["verdict"]),
            ],
            steps,
        )
        how = "same static batches as above; time ratio = greedy tok/s / sampled tok/s"
        how = context(results, how, f"target <= {STEP_COST_MAX}")
        tables.append(("Engine: sampled step vs greedy step", how, headers, body))
    return tables


def beam_tables(results: dict[str, Any]) -> list[Table]:
    if not (rows := results.get("beams")):
        return []
    headers, body = columns(
        [
            (" width", lambda r: str(r["width"])),
            (" engine tok/s", _rate("engine_tokens_per_s")),
            (" every beam tok/s", _rate("engine_beam_tokens_per_s")),
            (" transformers tok/s", _rate("transformers_tokens_per_s")),
            (" engine / transformers", _fmt("engine_over_transformers", 2, "x")),
            (" KV cache peak MiB", _fmt("kv_cache_peak_mib", 1)),
            (" best beams equal", lambda r: f"{r['best_beams_agree']}/{r['prompts']}"),
        ],
        rows,
    )
    first, tokens = rows[0], results["plan"]["beam_prompt_tokens"]
    how = prose(
        "beams", prompts=first["prompts"], new_tokens=first["new_tokens"], prompt_tokens=tokens
    )
    how = context(results, how)
    return [("Beam search: widths side by side with transformers", how, headers, body)]


def _load_context(results: dict[str, Any], extra: str) -> str:
    load = results.get("load_settings", {})
    return context(
        results,
        model_text(results, load.get("model", "default")),
        prose(
            "load",
            dtype=load.get("dtype", "?"),
            openvino_dtype=load.get("openvino_dtype", "—"),
            device=results["plan"]["device"],
            batch=load.get("max_batch_size", "?"),
            end_id=load.get("openvino_end_id", "?"),
        ),
        extra,
    )


def throughput_verdict(row: dict[str, Any]) -> str:
    """The bare engine's tokens/s against the throughput target, at the target's length."""
    if row["length"] != THROUGHPUT_TARGET_LENGTH:
        return "—"
    return verdict(row.get("bare_tokens_per_s"), THROUGHPUT_TARGET, at_most=False)


def _rate(key: str) -> Any:
    return lambda r: rate(r.get(key))


def _fmt(key: str, digits: int, suffix: str = "") -> Any:
    return lambda r: fmt(r.get(key), digits, suffix)


def _length(r: dict[str, Any]) -> str:
    return str(r["length"])


def arrival_tables(results: dict[str, Any]) -> list[Table]:
    if not (rows := results.get("arrivals") or []):
        return []
    n = results["plan"]["clients"]
    headers, body = columns(
        [
            (" output tokens", _length),
            (" forward ceiling tok/s", _rate("forward_ceiling_tokens_per_s")),
            (" bare tok/s", _rate("bare_tokens_per_s")),
            ("target", throughput_verdict),
            (" served tok/s", _rate("served_tokens_per_s")),
            (" served/bare", _fmt("served_over_bare", 2)),
            ("target", lambda r: verdict(r.get("served_over_bare"), SERVED_OVER_BARE_MIN, False)),
            (" static tok/s", _rate("static_tokens_per_s")),
            (" continuous/static", _fmt("continuous_over_static", 2)),
            (
                "target ",
                lambda r: verdict(
                    r.get("continuous_over_static"), CONTINUOUS_OVER_STATIC_MIN, False
                ),
            ),
            ("windows (s)", lambda r: r.get("windows", "")),
        ],
        rows,
    )
    how = prose(
        "arrivals",
        n=n,
        throughput=f"{THROUGHPUT_TARGET:,.0f}",
        length=THROUGHPUT_TARGET_LENGTH,
        served_over_bare=SERVED_OVER_BARE_MIN,
        continuous_over_static=CONTINUOUS_OVER_STATIC_MIN,
    )
    how = _load_context(results, how)
    table = (f"Continuous arrivals: {n} closed-loop clients", how, headers, body)
    return [table, *openvino_arrival_tables(results)]


def openvino_arrival_tables(results: dict[str, Any]) -> list[Table]:
    """The openvino backend next to the torch engine at every length, bare and served, with
    the reference generates at the target length (bench/traffic.py)."""
    rows = [r for r in results.get("arrivals") or [] if "openvino_bare_tokens_per_s" in r]
    if not rows:
        return []
    n = results["plan"]["clients"]
    headers, body = columns(
        [
            (" output tokens", _length),
            (" torch bare tok/s", _rate("bare_tokens_per_s")),
            (" torch served tok/s", _rate("served_tokens_per_s")),
            (" openvino bare tok/s", _rate("openvino_bare_tokens_per_s")),
            (" openvino served tok/s", _rate("openvino_served_tokens_per_s")),
            (" openvino served/bare", _fmt("openvino_served_over_bare", 2)),
            (
                " openvino/torch served",
                lambda r: fmt(
                    ratio(r.get("openvino_served_tokens_per_s"), r.get("served_tokens_per_s")), 2
                ),
            ),
            (" pipeline generate tok/s", _rate("pipeline_tokens_per_s")),
            (" transformers generate tok/s", _rate("transformers_static_tokens_per_s")),
            (
                " openvino short requests",
                lambda r: str(r.get("openvino_short", 0) + r.get("openvino_served_short", 0)),
            ),
        ],
        rows,
    )
    how = _load_context(results, prose("openvino_arrivals", n=n))
    return [
        (f"Continuous arrivals: openvino backend vs torch engine, {n} clients", how, headers, body)
    ]


def mixed_tables(results: dict[str, Any]) -> list[Table]:
    if not (rows := results.get("mixed") or []):
        return []
    plan = results["plan"]
    short, long, n = plan["mixed_short"], plan["mixed_long"], plan["mixed_clients"]
    headers, body = columns(
        [
            ("path", lambda r: r["path"].replace("_", " ")),
            (f" {short}-token alone ms", _fmt("alone_median_ms", 1)),
            (f" {short}-token mixed ms", _fmt("mixed_median_ms", 1)),
            (" slowdown", _fmt("slowdown", 2, "x")),
            ("target", lambda r: verdict(r.get("slowdown"), MIXED_SLOWDOWN_MAX, at_most=True)),
            (
                " samples alone/mixed",
                lambda r: f"{r.get('alone_samples', 0)}/{r.get('mixed_samples', 0)}",
            ),
        ],
        rows,
    )
    how = prose("mixed", clients=2 * n, short=short, limit=MIXED_SLOWDOWN_MAX)
    how = _load_context(results, how)
    return [
        (
            f"Mixed lengths: {n} clients x {short} tokens next to {n} x {long} tokens",
            how,
            headers,
            body,
        )
    ]


def single_tables(results: dict[str, Any]) -> list[Table]:
    if not (single := results.get("single")):
        return []
    body = []
    for backend, prefix in (("torch", ""), ("openvino", "openvino_")):
        overhead = f"{prefix}served_overhead_ms" if prefix else "overhead_ms"
        bare, served = (single.get(f"{prefix}{path}_median_ms") for path in ("bare", "served"))
        if bare is not None or served is not None:
            gap = single.get(overhead)
            body.append(
                [
                    backend,
                    fmt(bare, 1),
                    fmt(served, 1),
                    fmt(gap, 1),
                    verdict(gap, SERVED_OVERHEAD_MAX_MS, at_most=True),
                ]
            )
    how = (
        f"medians over {single.get('repeats')} repeats; target served - bare <= "
        f"{SERVED_OVERHEAD_MAX_MS:g} ms"
    )
    headers = ["backend", " bare ms", " served ms", " served - bare ms", "target"]
    return [
        (
            f"One request alone: {results['plan']['single_tokens']} tokens",
            _load_context(results, how),
            headers,
            body,
        )
    ]


def _ms(name: str):
    return lambda r: f"{r[name] * 1000:,.0f} ms" if name in r else "—"


PREFIX_TIMES = ("cold_first_s", "cold_total_s", "resent_first_s", "resent_total_s")


def prefix_table(rows: list[dict[str, Any]], served: bool = False) -> Table:
    """The bare prefix rows or (``served``) the rows through the server (bench/prefix.py)."""
    pad = " " if served else ""  # the served table right-aligns its figures
    labels = ("path", "dtype", " cold/resent") if served else ("system", "resent speed-up")
    headers, body = columns(
        [
            ("model", lambda r: r["model"]),
            *((k, lambda r, k=k: r[k]) for k in labels[:-1]),
            (f"{pad}prompt", lambda r: str(r["prompt_tokens"])),
            *((pad + name[:-2].replace("_", " "), _ms(name)) for name in PREFIX_TIMES),
            (labels[-1], lambda r: f"{r['cold_total_s'] / r['resent_total_s']:.1f}x"),
        ],
        rows,
    )
    how = prose("prefix_served" if served else "prefix", more=MORE, new=rows[0]["new"])
    where = "through the server" if served else ""
    return f"Prefix {where}: a long prompt resent".replace(" :", ":"), how, headers, body
