"""The served-traffic sections' tables (arrivals, openvino arrivals, mixed lengths, one
request alone) from the measured rows: pure functions of the results dictionary, as
:mod:`bench.tables` is for the kernels and beams."""

from __future__ import annotations

from typing import Any

from bench.format import Table, context, fmt, model_text, rate, ratio, verdict
from bench.tables import (
    CONTINUOUS_OVER_STATIC_MIN,
    MIXED_SLOWDOWN_MAX,
    SERVED_OVER_BARE_MIN,
    SERVED_OVERHEAD_MAX_MS,
    THROUGHPUT_TARGET,
    THROUGHPUT_TARGET_LENGTH,
)


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
