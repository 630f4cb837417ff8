"""Sections ``arrivals``, ``mixed`` and ``single``: traffic against each backend bare and
served.

For each backend (the torch engine, then the openvino backend) the bare backend starts in this
process, configured as the served one (``model_repository/engine/config.pbtxt``: batch size,
prefill and KV-cache budgets; dtype: the config's for torch, bfloat16 for openvino where the CPU
has it natively), and Triton on a copy of the repository serving that backend. Both are up; only
one runs at a time, so no two systems share the CPU. Arrivals alternate between them, each
system measured in two half windows in mirrored order (bare, served, served, bare; with the
OpenVINO pipeline's own ``generate`` in the middle at the target length): a machine whose speed
drifts during the run (shared cores swung by a third within minutes) weighs on all alike, where
measuring one system after the other put the drift into the ratio. Mixed and single run bare,
then served. Row keys: ``bare_*`` / ``served_*`` are the torch engine's, ``openvino_bare_*`` /
``openvino_served_*`` the openvino backend's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.format import ratio
from bench.kernels import transformers_reference
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
from bench.ov import PipelineGenerate, served_dtype, stand_in_end_id, start_backend
from bench.server import running_server, served_engine_settings
from bench.settings import Plan
from bench.systems import TORCH_DTYPES
from contract.model_tokens import prompt_head
from contract.prompts import code_prompts
from engine import CausalLM, TorchEngine, in_passing_thread, load_model

Progress = Callable[[str], None]
TRAFFIC_SECTIONS = ("arrivals", "mixed", "single")
TARGET_LENGTH = 128  # the output length the throughput targets are held at


def key(backend: str, path: str) -> str:
    """The result key prefix of a backend's path: ``bare`` / ``served`` for the torch engine
    (the keys earlier runs wrote), ``openvino_bare`` / ``openvino_served`` for openvino."""
    return path if backend == "torch" else f"{backend}_{path}"


def target_length(lengths: tuple[int, ...]) -> int:
    """The arrivals length the reference generates run at: 128, or the longest in a run that
    has no 128 (a quick run: its targets say which length they were held at)."""
    return TARGET_LENGTH if TARGET_LENGTH in lengths else max(lengths)


def mirrored(systems: list[Any]) -> list[Any]:
    """Each system twice, the second pass in reverse (A B C C B A): a linear drift in the
    machine's speed adds the same to every system's mean."""
    return systems + systems[::-1]


class PipelineWindow:
    """The OpenVINO pipeline's own ``generate`` as one of the alternating arrivals systems."""

    name = "pipeline"

    def __init__(self, pipe: PipelineGenerate, ids: list[list[int]], seed: int) -> None:
        self.pipe, self.ids, self.seed = pipe, ids, seed

    def rate(self, length: int, seconds: float) -> float:
        return self.pipe.rate_over(self.ids, length, True, self.seed, seconds)


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
    weights: CausalLM,
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


def _arrivals(
    targets: list[BareTarget | ServedTarget],
    plan: Plan,
    arrivals: dict[int, dict[str, Any]],
    progress: Progress,
    pipeline: PipelineWindow | None = None,
) -> None:
    """Closed-loop arrivals at each length, the systems alternating in mirrored half windows
    (module docstring); a system's rate is the mean of its two windows'."""
    half = (plan.window_s / 2, plan.max_window_s / 2, plan.warmup_cap_s)
    for length in plan.lengths:
        row = arrivals.setdefault(length, {"length": length})
        systems: list[Any] = list(targets)
        if pipeline is not None and length == target_length(plan.lengths):
            systems.append(pipeline)
        rates: dict[str, list[float]] = {}
        for system in mirrored(systems):
            path = system.name
            if isinstance(system, PipelineWindow):
                rate = system.rate(length, half[0])
                progress(f"arrivals {path} generate {length} tokens: {rate:,.0f} tok/s")
            else:
                m = closed_loop(system, [length] * plan.clients, *half)
                rate = m.rate()
                short = m.short_of()
                row[f"{path}_requests"] = row.get(f"{path}_requests", 0) + len(m.records)
                row[f"{path}_short"] = row.get(f"{path}_short", 0) + short
                row[f"{path}_window_s"] = round(row.get(f"{path}_window_s", 0) + m.window_s)
                progress(
                    f"arrivals {path} {length} tokens: {rate:,.0f} tok/s over "
                    f"{m.window_s:.1f}s ({len(m.records)} requests"
                    f"{f', {short} SHORT' if short else ''})"
                )
            rates.setdefault(path, []).append(rate)
        for path, values in rates.items():
            row[f"{path}_tokens_per_s"] = sum(values) / len(values)
            row[f"{path}_window_rates"] = [round(v) for v in values]
        bare = targets[0]
        if bare.name == "bare":  # the torch engine fed whole batches
            rate, rounds, short = static_batches(bare, plan.clients, length, plan.window_s)
            row["static_tokens_per_s"] = rate
            row["static_rounds"] = rounds
            row["static_short"] = short
            progress(
                f"arrivals static {length} tokens: {rate:,.0f} tok/s ({rounds} rounds of "
                f"{plan.clients}{f', {short} SHORT' if short else ''})"
            )


def _drive(
    target: BareTarget | ServedTarget,
    plan: Plan,
    mixed: list[dict[str, Any]],
    single: dict[str, Any],
    progress: Progress,
) -> None:
    """Run the mixed and single sections against one target, filling the result rows."""
    path = target.name
    windows = (plan.window_s, plan.max_window_s, plan.warmup_cap_s)
    if "mixed" in plan.sections:
        short, long = plan.mixed_short, plan.mixed_long
        progress(
            f"mixed {path}: {2 * plan.mixed_clients} x {short} tokens, then {plan.mixed_clients} "
            f"of them next to {plan.mixed_clients} x {long} tokens ..."
        )
        # the baseline: every client asking for short answers (the same load, none long)
        alone = closed_loop(target, [short] * (2 * plan.mixed_clients), *windows)
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


@contextmanager
def _bare(
    backend: str,
    model: ModelInfo,
    ids: list[list[int]],
    plan: Plan,
    settings: dict[str, Any],
    progress: Progress,
) -> Iterator[tuple[BareTarget, CausalLM | None]]:
    """One backend in this process, configured as the served one; stopped on exit. Yields
    the target and (torch) the weights, for the forward ceilings once the engine is gone."""
    started = time.perf_counter()
    weights = None
    if backend == "torch":
        dtype = str(settings["dtype"])
        weights = in_passing_thread(  # the engine's thread is then the only OpenMP pool
            lambda: load_model(model.path, dtype=TORCH_DTYPES[dtype], device=plan.device)
        )
        engine: Any = TorchEngine(
            weights,
            max_batch_size=int(settings["max_batch_size"]),
            max_prefill_tokens=int(settings["max_prefill_tokens"]),
            max_cache_tokens=int(settings["kv_cache_tokens"]) or None,
        ).start()
        target = BareTarget(engine, ids, model.banned)
    else:
        dtype = str(settings["openvino_dtype"])
        engine = start_backend(
            model.path, dtype, int(settings["max_batch_size"]),
            int(settings["max_prefill_tokens"]), max_cache_tokens=int(settings["kv_cache_tokens"]),
        )  # fmt: skip
        end_id = stand_in_end_id(model.vocab_size, model.eos_token_id)
        target = BareTarget(engine, ids, None, end_id=end_id, name=key(backend, "bare"))
    progress(f"bare {backend} ready ({dtype}, {time.perf_counter() - started:.1f}s)")
    try:
        yield target, weights
    finally:
        engine.stop()
        del engine


@contextmanager
def _served(
    backend: str,
    model: ModelInfo,
    texts: list[str],
    ids: list[list[int]],
    settings: dict[str, Any],
    out: Path,
    device: str,
    progress: Progress,
) -> Iterator[ServedTarget]:
    """Triton on a copy of the repository serving ``backend``; stopped on exit."""
    started = time.perf_counter()
    dtype = str(settings["dtype"] if backend == "torch" else settings["openvino_dtype"])
    progress(f"starting Triton ({backend} backend, {dtype}) on a copy of the repository ...")
    end_id = None if backend == "torch" else stand_in_end_id(model.vocab_size, model.eos_token_id)
    with running_server(
        model.path, CACHE / "serving", out / f"tritonserver-{backend}.log", device,
        backend=backend, parameters={"dtype": dtype},
    ) as srv:  # fmt: skip
        progress(f"Triton ready on gRPC {srv.grpc_url} ({time.perf_counter() - started:.0f}s)")
        target = ServedTarget(
            srv.grpc_url, texts, [len(i) for i in ids], end_id, key(backend, "served"),
            end_words=model.end_words(),
        )  # fmt: skip
        try:
            got = target.request(0, 16)
            if got != 16:
                raise RuntimeError(f"the server made {got} tokens of 16: end token not kept out")
            yield target
        finally:
            target.close()


def _backend_traffic(
    backend: str,
    model: ModelInfo,
    texts: list[str],
    ids: list[list[int]],
    plan: Plan,
    settings: dict[str, Any],
    tables: tuple[dict[int, dict[str, Any]], list[dict[str, Any]], dict[str, Any]],
    out: Path,
    progress: Progress,
) -> None:
    """One backend bare and served (and, for openvino, the pipeline's own ``generate``), all
    up at once and measured one at a time; then, torch alone, its references."""
    arrivals, mixed, single = tables
    with ExitStack() as stack:
        bare, weights = stack.enter_context(_bare(backend, model, ids, plan, settings, progress))
        targets: list[BareTarget | ServedTarget] = [bare]
        if plan.served:
            served = _served(backend, model, texts, ids, settings, out, plan.device, progress)
            targets.append(stack.enter_context(served))
        if "arrivals" in plan.sections:
            pipeline = None
            if backend != "torch":
                dtype = str(settings["openvino_dtype"])
                generate_pipe = PipelineGenerate(model.path, dtype, plan.clients)
                stack.callback(generate_pipe.close)
                pipeline = PipelineWindow(generate_pipe, ids[: plan.clients], plan.seed)
            _arrivals(targets, plan, arrivals, progress, pipeline)
        for target in targets:
            _drive(target, plan, mixed, single, progress)
    if backend == "torch" and "arrivals" in plan.sections:
        assert weights is not None
        _forward_ceilings(weights, [len(i) for i in ids], plan, arrivals, progress)
        length = target_length(plan.lengths)
        row = arrivals.setdefault(length, {"length": length})
        transformers_reference(model, plan, length, row, progress)


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

    settings: dict[str, Any] = dict(served_engine_settings())
    settings["openvino_dtype"] = served_dtype()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model.path))
    head = prompt_head(tokenizer)  # what the server puts before every prompt (a BOS, or none)
    longest = max((*plan.lengths, plan.mixed_long, plan.single_tokens))
    texts, ids = [], []
    for text in code_prompts(300, seed=plan.seed):
        tokens = head + tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) > len(head) and len(tokens) + longest <= model.n_positions:
            texts.append(text)
            ids.append(tokens)
    results["load_settings"] = {
        "model": model.name,
        **settings,
        "backends": list(plan.backends),
        "openvino_end_id": stand_in_end_id(model.vocab_size, model.eos_token_id),
        "prompts": len(texts),
        "prompt_tokens_median": sorted(len(i) for i in ids)[len(ids) // 2],
    }
    arrivals: dict[int, dict[str, Any]] = {}
    mixed: list[dict[str, Any]] = []
    single: dict[str, Any] = {}
    tables = (arrivals, mixed, single)

    def publish() -> None:
        for row in arrivals.values():
            for backend in plan.backends:
                bare, served = key(backend, "bare"), key(backend, "served")
                row[f"{served}_over_bare"] = ratio(
                    row.get(f"{served}_tokens_per_s"), row.get(f"{bare}_tokens_per_s")
                )
            row["continuous_over_static"] = ratio(
                row.get("bare_tokens_per_s"), row.get("static_tokens_per_s")
            )
            row["windows"] = "/".join(str(row[k]) for k in row if k.endswith("_window_s"))
        if "arrivals" in plan.sections:
            results["arrivals"] = [arrivals[k] for k in sorted(arrivals)]
        if "mixed" in plan.sections:
            results["mixed"] = mixed
        if "single" in plan.sections:
            single["repeats"] = plan.single_repeats
            for backend in plan.backends:
                bare, served = key(backend, "bare"), key(backend, "served")
                overhead = f"{served}_overhead_ms" if backend != "torch" else "overhead_ms"
                single[overhead] = (
                    single[f"{served}_median_ms"] - single[f"{bare}_median_ms"]
                    if f"{served}_median_ms" in single and f"{bare}_median_ms" in single
                    else None
                )
            results["single"] = single
        save()

    for backend in plan.backends:  # one system at a time: never two on the CPU at once
        _backend_traffic(backend, model, texts, ids, plan, settings, tables, out, progress)
        publish()
