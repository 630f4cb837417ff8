"""The bench's targets, each a ratio (or a time) from this one run, with PASS / FAIL; one
whose measurement is not in the run (a section left out, a quick run's shorter lengths) says so
rather than passing."""

from __future__ import annotations

from typing import Any

from bench.format import Table, context, fmt, prose, ratio
from bench.peer import ONE_LINE_AT_MOST, TOKENS_AT_LEAST, peer_ratio
from bench.systems import OPENVINO_DTYPES

OPENVINO_OVER_TORCH_STATIC = 1.5  # static batches 16 and 64, default model, greedy
OPENVINO_OVER_TORCH_SERVED = 1.5  # 16 clients at output 128, both served
SERVED_OVER_TRANSFORMERS = 2.0  # openvino served over transformers' static-batch generate
SERVED_OVER_BARE = 0.9  # at output 128 and 512
SERVED_OVER_PIPELINE = 0.8  # the server against the pipeline's own generate, same batch
RESENT_FIRST_TOKEN_MS = 100.0  # 350M shape served, a 1,000-token prompt resent
RESENT_ANSWER_MS = 400.0  # ... its 16-token answer
RESENT_SPEEDUP = 2.5  # default model, unary, 650-token prompt + 3 characters, cold/resent
MIXED_SLOWDOWN = 2.0  # 8-token median next to 512-token ones over all 16 asking for 8
SERVED_LENGTH, BARE_LENGTHS = 128, (128, 512)


def held_at(lengths: list[int], wanted: int) -> int | None:
    """``wanted``, or in a run without it the longest length measured; None without any."""
    return None if not lengths else wanted if wanted in lengths else max(lengths)


def _row(
    name: str, value: float | None, limit: float, at_most: bool, how: str, unit: str = "x"
) -> dict[str, Any]:
    met = value is not None and (value <= limit if at_most else value >= limit)
    return {
        "target": name,
        "value": value,
        "limit": limit,
        "at_most": at_most,
        "unit": unit,
        "verdict": "not measured" if value is None else "PASS" if met else "FAIL",
        "how": how,
    }


def _length_note(at: int | None, wanted: int) -> str:
    if at is None:
        return f"output {wanted}: no arrivals in this run"
    return f"output {at}" + ("" if at == wanted else f" (this run has no {wanted})")


def static_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """openvino over the torch engine, static batches of 16 and 64, default model, greedy."""
    kernels = [k for k in results.get("kernels") or [] if k.get("plan_key") == "default"]
    rates = {
        (k["system"], k["dtype"], k["batch"]): k.get("tokens_per_s")
        for k in kernels
        if k["mode"] == "greedy"
    }
    dtypes = [d for d in OPENVINO_DTYPES if any(k["dtype"] == d for k in kernels)]
    return [
        _row(
            f"openvino >= {OPENVINO_OVER_TORCH_STATIC}x torch, static batch {batch}",
            ratio(rates.get(("openvino", dtype, batch)), rates.get(("engine", dtype, batch))),
            OPENVINO_OVER_TORCH_STATIC,
            False,
            f"default model, {dtype} both, greedy, static batch {batch}",
        )
        for batch in (16, 64)
        for dtype in dtypes or ["float32"]
    ]


def served_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The served throughput targets at 16 clients (arrivals rows)."""
    arrivals = {r["length"]: r for r in results.get("arrivals") or []}
    load = results.get("load_settings", {})
    clients = results.get("plan", {}).get("clients", "?")
    at = held_at(sorted(arrivals), SERVED_LENGTH)
    row = arrivals.get(at, {}) if at is not None else {}
    ov_served = row.get("openvino_served_tokens_per_s")
    dtypes = f"openvino {load.get('openvino_dtype', '?')}, torch {load.get('dtype', '?')}"
    note = _length_note(at, SERVED_LENGTH)
    rows = [
        _row(
            f"openvino served >= {OPENVINO_OVER_TORCH_SERVED}x torch served",
            ratio(ov_served, row.get("served_tokens_per_s")),
            OPENVINO_OVER_TORCH_SERVED,
            False,
            f"{clients} clients, {note}, load-test sampling; {dtypes}",
        ),
        _row(
            f"openvino served >= {SERVED_OVER_TRANSFORMERS}x transformers static generate",
            ratio(ov_served, row.get("transformers_static_tokens_per_s")),
            SERVED_OVER_TRANSFORMERS,
            False,
            f"{clients} clients, {note}; transformers: a static batch of {clients}, "
            f"{row.get('transformers_static_dtype', '?')} (its faster dtype), "
            f"{row.get('transformers_static_new_tokens', '?')} new tokens (time budget)",
        ),
        _row(
            f"server >= {SERVED_OVER_PIPELINE}x the pipeline's own generate, same batch",
            ratio(ov_served, row.get("pipeline_tokens_per_s")),
            SERVED_OVER_PIPELINE,
            False,
            f"openvino served, {clients} clients vs ContinuousBatchingPipeline.generate on "
            f"{clients} of the same prompts, {note}",
        ),
    ]
    held: dict[int | None, int] = {}
    for wanted in BARE_LENGTHS:  # one row per length read (a quick run reads both at one)
        held.setdefault(held_at(sorted(arrivals), wanted), wanted)
    for at, wanted in held.items():
        row = arrivals.get(at, {}) if at is not None else {}
        for backend, prefix in (("openvino", "openvino_"), ("torch", "")):
            rows.append(
                _row(
                    f"served/bare >= {SERVED_OVER_BARE} ({backend})",
                    row.get(f"{prefix}served_over_bare"),
                    SERVED_OVER_BARE,
                    False,
                    f"{clients} clients, {_length_note(at, wanted)}",
                )
            )
    return rows


def prefix_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The served prefix targets (bench/prefix.py)."""
    served = {r["model"]: r for r in results.get("prefix_served") or []}
    stream, unary = served.get("350m", {}), served.get("default", {})

    def ms(name: str) -> float | None:
        return stream[name] * 1000 if name in stream else None

    how = "350M shape streamed from the engine, openvino, 1,000-token prompt resent + 3 tokens"
    return [
        _row(
            f"resent prompt: first token <= {RESENT_FIRST_TOKEN_MS:g} ms",
            ms("resent_first_s"),
            RESENT_FIRST_TOKEN_MS,
            True,
            how,
            " ms",
        ),
        _row(
            f"resent prompt: 16-token answer <= {RESENT_ANSWER_MS:g} ms",
            ms("resent_total_s"),
            RESENT_ANSWER_MS,
            True,
            how,
            " ms",
        ),
        _row(
            f"resent prompt answers >= {RESENT_SPEEDUP}x faster than cold",
            unary.get("cold_over_resent"),
            RESENT_SPEEDUP,
            False,
            "default model through the unary ensemble, openvino, 650-token prompt resent with "
            "3 more characters, 16 tokens",
        ),
    ]


def mixed_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    plan = results.get("plan", {})
    short, long = plan.get("mixed_short"), plan.get("mixed_long")
    how = (
        f"{short}-token requests' median next to {long}-token ones over all "
        f"{2 * plan.get('mixed_clients', 0)} clients asking for {short}"
    )
    rows = []
    for r in results.get("mixed") or []:
        path = r["path"].replace("_", " ")
        backend = path if path.startswith("openvino") else f"torch {path}"
        rows.append(
            _row(
                f"mixed lengths: short median <= {MIXED_SLOWDOWN:g}x alone ({backend})",
                r.get("slowdown"),
                MIXED_SLOWDOWN,
                True,
                how,
            )
        )
    return rows


def peer_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Against llama.cpp's server on the same weights (bench/peer.py)."""
    slots = (results.get("llama") or {}).get("llama_parallel", "?")
    how = prose("peer_target", slots=slots)
    return [
        _row(
            f"one-line p50 <= {ONE_LINE_AT_MOST:g}x llama.cpp's (4 clients)",
            peer_ratio(results, "latency_p50_ms", 4),
            ONE_LINE_AT_MOST,
            True,
            how,
        ),
        _row(
            f"tokens/s >= {TOKENS_AT_LEAST:g}x llama.cpp's (16 clients)",
            peer_ratio(results, "tokens_per_s", 16),
            TOKENS_AT_LEAST,
            False,
            how,
        ),
    ]


def target_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    peers = peer_rows(results) if results.get("llama") else []
    return [
        *static_rows(results),
        *served_rows(results),
        *prefix_rows(results),
        *mixed_rows(results),
        *peers,
    ]


def any_measured(results: dict[str, Any]) -> bool:
    """Whether the run measured anything a target is read from (else no targets table)."""
    return any(r["verdict"] != "not measured" for r in target_rows(results))


def targets_table(results: dict[str, Any]) -> Table:
    rows = target_rows(results)
    body = [
        [
            r["target"],
            fmt(r["value"], 0 if r["unit"] == " ms" else 2, r["unit"]),
            ("<= " if r["at_most"] else ">= ") + f"{r['limit']:g}{r['unit']}",
            r["verdict"],
            r["how"],
        ]
        for r in rows
    ]
    passed, failed = (sum(r["verdict"] == v for r in rows) for v in ("PASS", "FAIL"))
    how = context(results, prose("targets"))
    title = f"Targets: {passed} PASS, {failed} FAIL, {len(rows) - passed - failed} not measured"
    return title, how, ["target", " measured", " limit", "verdict", "how"], body
