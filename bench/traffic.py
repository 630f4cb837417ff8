"""Sections ``arrivals``, ``mixed`` and ``single``: traffic against the bare engine, then the
server.

Everything bare runs first, in this process, with the engine configured as the served one
(``model_repository/engine/config.pbtxt``: dtype, batch size, prefill budget); the engine is then
stopped and Triton started on a copy of the repository, so the two never share the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.load import (
    BareTarget,
    Measurement,
    ServedTarget,
    closed_loop,
    forward_ceiling,
    latencies,
    median_ms,
    short_latencies,
    static_batches,
)
from bench.models import CACHE, ModelInfo
from bench.report import ratio
from bench.server import running_server, served_engine_settings
from bench.settings import Plan
from bench.systems import TORCH_DTYPES
from engine import GPTJ, TorchEngine, in_passing_thread
from loadtest.prompts import code_prompts

Progress = Callable[[str], None]
TRAFFIC_SECTIONS = ("arrivals", "mixed", "single")


def _window(m: Measurement, what: str, progress: Progress, length: int) -> str:
    rate = m.rate()
    short = m.short_of()
    progress(
        f"{what} {length} tokens: {rate:,.0f} tok/s over {m.window_s:.1f}s "
        f"({len(m.records)} requests{f', {short} SHORT' if short else ''})"
    )
    return f"{m.window_s:.0f}"


def _mixed_row(
    path: str, alone: Measurement, mixed: Measurement, short: int, progress: Progress
) -> dict[str, Any]:
    alone_ms = median_ms(short_latencies(alone, short))
    mixed_ms = median_ms(short_latencies(mixed, short))
    row = {
        "path": path,
        "alone_median_ms": alone_ms,
        "mixed_median_ms": mixed_ms,
        "slowdown": ratio(mixed_ms, alone_ms),
        "alone_samples": len(short_latencies(alone, short)),
        "mixed_samples": len(short_latencies(mixed, short)),
    }
    progress(
        f"mixed {path}: short requests {alone_ms or 0:.1f} ms alone, {mixed_ms or 0:.1f} ms "
        f"next to long ones ({row['slowdown'] or 0:.2f}x)"
    )
    return row


def _forward_ceilings(
    weights: GPTJ,
    prompt_lengths: list[int],
    plan: Plan,
    arrivals: dict[int, dict[str, Any]],
    progress: Progress,
) -> None:
    """Each arrivals row's forward-pass ceiling, measured once the engine has stopped (a second
    thread running torch beside the engine's would slow both; see engine/threads.py)."""
    for length in plan.lengths:
        ceiling = in_passing_thread(
            lambda length=length: forward_ceiling(weights, prompt_lengths, plan.clients, length)
        )
        arrivals.setdefault(length, {"length": length})["forward_ceiling_tokens_per_s"] = ceiling
        progress(f"arrivals forward ceiling {length} tokens: {ceiling:,.0f} tok/s")


def _drive(
    target: BareTarget | ServedTarget,
    plan: Plan,
    arrivals: dict[int, dict[str, Any]],
    mixed: list[dict[str, Any]],
    single: dict[str, Any],
    progress: Progress,
) -> None:
    """Run the chosen traffic sections against one target, filling the result rows."""
    path = target.name
    windows = (plan.window_s, plan.max_window_s, plan.warmup_cap_s)
    if "arrivals" in plan.sections:
        for length in plan.lengths:
            progress(f"arrivals {path} {length} tokens: {plan.clients} clients ...")
            m = closed_loop(target, [length] * plan.clients, *windows)
            row = arrivals.setdefault(length, {"length": length})
            row[f"{path}_tokens_per_s"] = m.rate()
            row[f"{path}_requests"] = len(m.records)
            row[f"{path}_short"] = m.short_of()
            row[f"{path}_window_s"] = _window(m, f"arrivals {path}", progress, length)
            if isinstance(target, BareTarget):
                rate, rounds, short = static_batches(target, plan.clients, length, plan.window_s)
                row["static_tokens_per_s"] = rate
                row["static_rounds"] = rounds
                row["static_short"] = short
                progress(
                    f"arrivals static {length} tokens: {rate:,.0f} tok/s ({rounds} rounds of "
                    f"{plan.clients}{f', {short} SHORT' if short else ''})"
                )
    if "mixed" in plan.sections:
        short, long = plan.mixed_short, plan.mixed_long
        progress(
            f"mixed {path}: {plan.mixed_clients} x {short} tokens alone, then next to "
            f"{plan.mixed_clients} x {long} tokens ..."
        )
        alone = closed_loop(target, [short] * plan.mixed_clients, *windows)
        both = closed_loop(
            target,
            [short] * plan.mixed_clients + [long] * plan.mixed_clients,
            *windows,
            cancel_at_end=True,
        )
        mixed.append(_mixed_row(path, alone, both, short, progress))
    if "single" in plan.sections:
        seconds = latencies(target, plan.single_tokens, plan.single_repeats)
        single[f"{path}_median_ms"] = median_ms(seconds)
        single[f"{path}_all_ms"] = [round(s * 1000, 2) for s in seconds]
        progress(
            f"single {path}: {plan.single_tokens} tokens, median "
            f"{single[f'{path}_median_ms']:.1f} ms over {len(seconds)}"
        )


def run_traffic(
    plan: Plan,
    model: ModelInfo,
    results: dict[str, Any],
    out: Path,
    progress: Progress,
    save: Callable[[], None],
) -> None:
    """Fill ``results`` with ``load_settings`` and the rows of the chosen traffic sections."""
    from transformers import PreTrainedTokenizerFast

    settings = served_engine_settings()
    dtype = str(settings["dtype"])
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model.path))
    longest = max((*plan.lengths, plan.mixed_long, plan.single_tokens))
    texts, ids = [], []
    for text in code_prompts(300, seed=plan.seed):
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if tokens and len(tokens) + longest <= model.n_positions:
            texts.append(text)
            ids.append(tokens)
    results["load_settings"] = {
        "model": model.name,
        "dtype": dtype,
        "max_batch_size": settings["max_batch_size"],
        "max_prefill_tokens": settings["max_prefill_tokens"],
        "prompts": len(texts),
        "prompt_tokens_median": sorted(len(i) for i in ids)[len(ids) // 2],
    }
    arrivals: dict[int, dict[str, Any]] = {}
    mixed: list[dict[str, Any]] = []
    single: dict[str, Any] = {}

    def publish() -> None:
        for row in arrivals.values():
            row["served_over_bare"] = ratio(
                row.get("served_tokens_per_s"), row.get("bare_tokens_per_s")
            )
            row["continuous_over_static"] = ratio(
                row.get("bare_tokens_per_s"), row.get("static_tokens_per_s")
            )
            row["windows"] = "/".join(
                str(row[k]) for k in ("bare_window_s", "served_window_s") if k in row
            )
        if "arrivals" in plan.sections:
            results["arrivals"] = [arrivals[k] for k in sorted(arrivals)]
        if "mixed" in plan.sections:
            results["mixed"] = mixed
        if "single" in plan.sections:
            single["repeats"] = plan.single_repeats
            single["overhead_ms"] = (
                single["served_median_ms"] - single["bare_median_ms"]
                if "served_median_ms" in single and "bare_median_ms" in single
                else None
            )
            results["single"] = single
        save()

    started = time.perf_counter()
    weights = in_passing_thread(  # the engine's thread is then the only OpenMP pool
        lambda: GPTJ.from_checkpoint(model.path, dtype=TORCH_DTYPES[dtype], device=plan.device)
    )
    engine = TorchEngine(
        weights,
        max_batch_size=int(settings["max_batch_size"]),
        max_prefill_tokens=int(settings["max_prefill_tokens"]),
    ).start()
    progress(f"bare engine ready ({dtype}, {time.perf_counter() - started:.1f}s)")
    try:
        _drive(BareTarget(engine, ids, model.eos_token_id), plan, arrivals, mixed, single, progress)
    finally:
        engine.stop()
        del engine
    if "arrivals" in plan.sections:
        _forward_ceilings(weights, [len(i) for i in ids], plan, arrivals, progress)
    del weights
    publish()
    if not plan.served:
        return
    started = time.perf_counter()
    progress("starting Triton on a copy of the model repository ...")
    with running_server(
        model.path, CACHE / "serving", out / "tritonserver.log", plan.device
    ) as srv:
        progress(f"Triton ready on gRPC {srv.grpc_url} ({time.perf_counter() - started:.0f}s)")
        target = ServedTarget(srv.grpc_url, texts, [len(i) for i in ids])
        try:
            got = target.request(0, 16)
            if got != 16:
                raise RuntimeError(f"the server generated {got} tokens of 16: end token not banned")
            _drive(target, plan, arrivals, mixed, single, progress)
        finally:
            target.close()
    publish()
