"""Sections ``arrivals``, ``mixed`` and ``single``: each backend (openvino, then torch) bare
in this process, configured as the served one (``engine/config.pbtxt``'s budgets; dtype: the
config's for torch, bfloat16 for openvino where native), and served by Triton on a copy of the
repository; both up, one running at a time. Arrivals alternate between them in mirrored half
windows (bare, served, served, bare; the OpenVINO pipeline's own ``generate`` in the middle at
the target length), so a machine whose speed drifts weighs on all alike. Row keys: ``bare_*`` /
``served_*`` are torch's, ``openvino_*`` openvino's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import load, systems
from bench.format import ratio
from bench.kernels import transformers_reference
from bench.models import CACHE, ModelInfo
from bench.settings import Plan, Progress
from contract.model_tokens import prompt_head
from contract.prompts import code_prompts
from engine import TorchEngine, in_passing_thread, load_model

TRAFFIC_SECTIONS = ("arrivals", "mixed", "single")
TARGET_LENGTH = 128  # the output length the throughput targets are held at
PATHS = ("served", "bare")


def key(backend: str, path: str) -> str:
    """``bare`` / ``served`` for torch (the keys earlier runs wrote), else ``openvino_bare`` ..."""
    return path if backend == "torch" else f"{backend}_{path}"


def target_length(lengths: tuple[int, ...]) -> int:
    """128, or the longest length in a run without it (its targets say which)."""
    return TARGET_LENGTH if TARGET_LENGTH in lengths else max(lengths)


def mirrored(systems: list[Any]) -> list[Any]:
    """A B C C B A: a linear drift in the machine's speed adds the same to every mean."""
    return systems + systems[::-1]


class Traffic:
    """The traffic sections' rows for one model, filled one backend at a time."""

    def __init__(self, plan: Plan, model: ModelInfo, out: Path, progress: Progress) -> None:
        from transformers import PreTrainedTokenizerFast

        self.plan, self.model, self.out, self.progress = plan, model, out, progress
        self.settings = {**load.served_engine_settings(), "openvino_dtype": systems.served_dtype()}
        self.end_id = systems.stand_in_end_id(model.vocab_size, model.eos_token_id)  # openvino's
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model.path))
        head = prompt_head(tokenizer)  # what the server puts before every prompt (a BOS, or none)
        longest = max((*plan.lengths, plan.mixed_long, plan.single_tokens))
        self.texts, self.ids = [], []
        for text in code_prompts(300, seed=plan.seed):
            tokens = head + tokenizer.encode(text, add_special_tokens=False)
            if len(tokens) > len(head) and len(tokens) + longest <= model.n_positions:
                self.texts.append(text)
                self.ids.append(tokens)
        self.arrivals: dict[int, dict[str, Any]] = {}
        self.mixed: list[dict[str, Any]] = []
        self.single: dict[str, Any] = {}

    def row(self, length: int) -> dict[str, Any]:
        return self.arrivals.setdefault(length, {"length": length})

    def dtype(self, backend: str) -> str:
        return str(self.settings["dtype" if backend == "torch" else "openvino_dtype"])

    @contextmanager
    def bare(self, backend: str) -> Iterator[tuple[load.BareTarget, Any]]:
        """One backend in this process, configured as the served one; stopped on exit. Yields
        the target and (torch) the weights, for the forward ceilings once the engine is gone."""
        started, dtype, weights = time.perf_counter(), self.dtype(backend), None
        budgets = ("max_batch_size", "max_prefill_tokens", "kv_cache_tokens")
        batch, prefill, cache = (int(self.settings[k]) for k in budgets)
        if backend == "torch":
            weights = in_passing_thread(  # the engine's thread is then the only OpenMP pool
                lambda: load_model(self.model.path, systems.TORCH_DTYPES[dtype], self.plan.device)
            )
            engine: Any = TorchEngine(
                weights,
                max_batch_size=batch,
                max_prefill_tokens=prefill,
                max_cache_tokens=cache or None,
            ).start()
            target = load.BareTarget(engine, self.ids, self.model.banned)
        else:
            engine = systems.start_backend(
                self.model.path, dtype, batch, prefill, max_cache_tokens=cache
            )
            target = load.BareTarget(engine, self.ids, None, self.end_id, key(backend, "bare"))
        self.progress(f"bare {backend} ready ({dtype}, {time.perf_counter() - started:.1f}s)")
        try:
            yield target, weights
        finally:
            engine.stop()

    @contextmanager
    def served(self, backend: str) -> Iterator[load.ServedTarget]:
        """Triton on a copy of the repository serving ``backend``; stopped on exit."""
        dtype, log = self.dtype(backend), self.out / f"tritonserver-{backend}.log"
        self.progress(f"starting Triton ({backend} backend, {dtype}) on a copy of the repository")
        server = load.running_server(
            self.model.path,
            CACHE / "serving",
            log,
            self.plan.device,
            backend=backend,
            parameters={"dtype": dtype},
        )
        with server as srv:
            end_id = None if backend == "torch" else self.end_id
            target = load.ServedTarget(
                srv.grpc_url,
                self.texts,
                [len(i) for i in self.ids],
                end_id,
                key(backend, "served"),
                self.model.end_words(),
            )
            try:
                if (got := target.request(0, 16)) != 16:
                    raise RuntimeError(f"the server made {got} tokens of 16: end token kept in")
                yield target
            finally:
                target.close()

    def run_arrivals(self, targets: list[Any], pipeline: systems.PipelineGenerate | None) -> None:
        """Closed-loop arrivals at each length, the systems alternating in mirrored half windows
        (module docstring); a system's rate is the mean of its two windows'."""
        plan = self.plan
        half = (plan.window_s / 2, plan.max_window_s / 2, plan.warmup_cap_s)
        for length in plan.lengths:
            row, rates = self.row(length), {}
            at_target = pipeline and length == target_length(plan.lengths)
            for system in mirrored([*targets, *([pipeline] if at_target else [])]):
                if isinstance(system, systems.PipelineGenerate):
                    path, prompts = "pipeline", self.ids[: plan.clients]
                    rate = system.rate_over(prompts, length, True, plan.seed, half[0])
                else:
                    path, m = system.name, load.closed_loop(system, [length] * plan.clients, *half)
                    rate = m.rate()
                    for name, value in (
                        ("requests", len(m.frame)),
                        ("short", m.short_of()),
                        ("window_s", m.window_s),
                    ):
                        row[f"{path}_{name}"] = row.get(f"{path}_{name}", 0) + value
                    row[f"{path}_window_s"] = round(row[f"{path}_window_s"])
                rates.setdefault(path, []).append(rate)
            for path, values in rates.items():
                row[f"{path}_tokens_per_s"] = sum(values) / len(values)
                row[f"{path}_window_rates"] = [round(v) for v in values]
            if targets[0].name == "bare":  # the torch engine fed whole batches
                rate, rounds, short = load.static_batches(
                    targets[0], plan.clients, length, plan.window_s
                )
                row.update(static_tokens_per_s=rate, static_rounds=rounds, static_short=short)
            self.progress(
                f"arrivals {length} tokens: "
                + ", ".join(
                    f"{k[: -len('_tokens_per_s')]} {v:,.0f}"
                    for k, v in row.items()
                    if k.endswith("_tokens_per_s")
                )
                + " tok/s"
            )

    def drive(self, target: load.BareTarget | load.ServedTarget) -> None:
        """The mixed and single sections against one target."""
        plan, path = self.plan, target.name
        windows = (plan.window_s, plan.max_window_s, plan.warmup_cap_s)
        if "mixed" in plan.sections:
            short, long, n = plan.mixed_short, plan.mixed_long, plan.mixed_clients
            # the baseline: every client asking for short answers (the same load, none long)
            alone = load.closed_loop(target, [short] * (2 * n), *windows).latencies(short)
            both = load.closed_loop(target, [short] * n + [long] * n, *windows, cancel_at_end=True)
            mixed = both.latencies(short)
            row = {
                "path": path,
                "alone_median_ms": load.median_ms(alone),
                "mixed_median_ms": load.median_ms(mixed),
            }
            row.update(
                slowdown=ratio(row["mixed_median_ms"], row["alone_median_ms"]),
                alone_samples=len(alone),
                mixed_samples=len(mixed),
            )
            self.mixed.append(row)
            self.progress(f"mixed {path}: short requests' median {row['slowdown'] or 0:.2f}x alone")
        if "single" in plan.sections:
            seconds = load.timed(lambda: target.request(0, plan.single_tokens), plan.single_repeats)
            self.single[f"{path}_median_ms"] = load.median_ms(seconds)
            self.single[f"{path}_all_ms"] = [round(s * 1000, 2) for s in seconds]
            self.progress(f"single {path}: median {self.single[f'{path}_median_ms']:.1f} ms")

    def backend(self, backend: str) -> None:
        """One backend bare and served (and, for openvino, the pipeline's own ``generate``), all
        up at once and measured one at a time; then, torch alone, its references."""
        plan = self.plan
        with ExitStack() as stack:
            bare, weights = stack.enter_context(self.bare(backend))
            targets = [bare, stack.enter_context(self.served(backend))]
            if "arrivals" in plan.sections:
                pipeline = None
                if backend != "torch":
                    pipeline = systems.PipelineGenerate(
                        self.model.path, self.dtype(backend), plan.clients
                    )
                    stack.callback(pipeline.close)
                self.run_arrivals(targets, pipeline)
            for target in targets:
                self.drive(target)
        if backend == "torch" and "arrivals" in plan.sections:
            lengths = [len(i) for i in self.ids]
            for length in plan.lengths:  # once the engine has stopped: one torch pool at a time
                ceiling = in_passing_thread(
                    lambda n=length: load.forward_ceiling(weights, lengths, plan.clients, n)
                )
                self.row(length)["forward_ceiling_tokens_per_s"] = ceiling
            length = target_length(plan.lengths)
            transformers_reference(self.model, plan, length, self.row(length), self.progress)

    def publish(self, results: dict[str, Any]) -> None:
        """The rows so far, with their ratios, into ``results``."""
        sections, single = self.plan.sections, self.single
        for row in self.arrivals.values():
            for backend in self.plan.backends:
                served, bare = (row.get(f"{key(backend, p)}_tokens_per_s") for p in PATHS)
                row[f"{key(backend, 'served')}_over_bare"] = ratio(served, bare)
            row["continuous_over_static"] = ratio(
                row.get("bare_tokens_per_s"), row.get("static_tokens_per_s")
            )
            row["windows"] = "/".join(str(row[k]) for k in row if k.endswith("_window_s"))
        for backend in self.plan.backends:
            served, bare = (single.get(f"{key(backend, p)}_median_ms") for p in PATHS)
            overhead = "overhead_ms" if backend == "torch" else f"{backend}_served_overhead_ms"
            single[overhead] = served - bare if served is not None and bare is not None else None
        single["repeats"] = self.plan.single_repeats
        found = {
            "arrivals": [self.arrivals[k] for k in sorted(self.arrivals)],
            "mixed": self.mixed,
            "single": single,
        }
        results.update({name: rows for name, rows in found.items() if name in sections})


def run_traffic(
    plan: Plan,
    model: ModelInfo,
    results: dict[str, Any],
    out: Path,
    progress: Progress,
    save: Callable[[], None],
) -> None:
    """Fill ``results`` with ``load_settings`` and the rows of the chosen traffic sections."""
    traffic = Traffic(plan, model, out, progress)
    ids = traffic.ids
    results["load_settings"] = {
        "model": model.name,
        **traffic.settings,
        "backends": list(plan.backends),
        "openvino_end_id": traffic.end_id,
        "prompts": len(ids),
        "prompt_tokens_median": sorted(map(len, ids))[len(ids) // 2],
    }
    for backend in plan.backends:  # one system at a time: never two on the CPU at once
        traffic.backend(backend)
        traffic.publish(results)
        save()
