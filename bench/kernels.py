"""Section ``kernels``: static batches through the torch engine, the openvino backend,
transformers and CTranslate2.

For each model, dtype and system the model is loaded once, then every batch size runs greedy
and sampled on the same prompts. A short probe (which also warms the system up) estimates the
cell's time; a cell that would overrun its budget (bf16 on a CPU without bf16 instructions is
the usual one) generates fewer tokens, and its row says how many. Also transformers' static
``generate`` as the served arrivals' reference (:func:`transformers_reference`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.format import rate
from bench.models import CACHE, ModelInfo, convert_ct2, random_prompts
from bench.settings import KernelPlan, Plan
from bench.systems import (
    CT2Runner,
    EngineRunner,
    OpenVINORunner,
    Runner,
    TransformersRunner,
    generate,
    unsupported,
)
from engine import in_passing_thread
from reporting.machine import bf16_native

Progress = Callable[[str], None]
PROBE_TOKENS = 2
MAX_REPEATS = 5
MODES = ("greedy", "sampled")
# transformers' reference generate makes fewer tokens than asked where they would take longer
# than this (a loaded machine); its row says how many (a shorter context flatters it, if any)
REFERENCE_BUDGET_S = 30.0


def fit_tokens(
    probe_s: float, probe_tokens: int, budget_s: float, wanted: int, minimum: int
) -> int:
    """New tokens for a cell whose ``probe_tokens``-token probe took ``probe_s``: ``wanted`` if
    that fits ``budget_s`` at the probe's pace, else as many as fit, never below ``minimum``.
    The probe's pace includes its prefill, so the estimate errs on the slow side."""
    per_token = probe_s / max(1, probe_tokens)
    if per_token * wanted <= budget_s:
        return wanted
    return max(minimum, min(wanted, int(budget_s / per_token)))


def measure(
    runner: Runner, prompts: list[list[int]], kplan: KernelPlan, sampled: bool, seed: int
) -> dict[str, Any]:
    """tokens/s of one cell: probe, then timed runs until ``min_cell_s`` (at most 5).

    A probe that alone takes the whole budget is the measurement (its row says so): a cell
    never costs much more than its budget, however slow the system.
    """
    started = time.perf_counter()
    counts = generate(runner, prompts, PROBE_TOKENS, sampled, seed)
    probe_s = time.perf_counter() - started
    _check(runner, counts, PROBE_TOKENS)
    if probe_s >= kplan.cell_budget_s:
        return {
            "new_tokens": PROBE_TOKENS,
            "wanted_tokens": kplan.new_tokens,
            "seconds": probe_s,
            "repeats": 1,
            "tokens_per_s": sum(counts) / probe_s,
            "note": f"{PROBE_TOKENS} of {kplan.new_tokens} tokens (time budget; probe only, "
            "prefill included)",
        }
    new = fit_tokens(probe_s, PROBE_TOKENS, kplan.cell_budget_s, kplan.new_tokens, kplan.min_tokens)
    generated, seconds, repeats = 0, 0.0, 0
    while repeats == 0 or (seconds < kplan.min_cell_s and repeats < MAX_REPEATS):
        started = time.perf_counter()
        counts = generate(runner, prompts, new, sampled, seed + 1000 * (repeats + 1))
        seconds += time.perf_counter() - started
        _check(runner, counts, new)
        generated += sum(counts)
        repeats += 1
    return {
        "new_tokens": new,
        "wanted_tokens": kplan.new_tokens,
        "seconds": seconds,
        "repeats": repeats,
        "tokens_per_s": generated / seconds,
        "note": f"{new} of {kplan.new_tokens} tokens (time budget)"
        if new < kplan.new_tokens
        else "",
    }


def _check(runner: Runner, counts: list[int], new: int) -> None:
    """Every sequence made exactly ``new`` tokens (a system that stops early is not faster)."""
    if any(c != new for c in counts):
        raise RuntimeError(
            f"{runner.system} generated {sorted(set(counts))} tokens instead of {new}: "
            "the end token was not banned"
        )


def _runner(system: str, model: ModelInfo, dtype: str, plan: Plan, progress: Progress) -> Runner:
    kplan = plan.kernels[model.key]
    if system == "engine":
        return EngineRunner(model.path, dtype, plan.device, max(kplan.batches), kplan.prompt_tokens)
    if system == "openvino":
        from modelbuild.openvino_export import ensure_export

        ensure_export(model.path)  # the 350M shape's export is made once, in .venv-export
        return OpenVINORunner(
            model.path, dtype, plan.device, max(kplan.batches), kplan.prompt_tokens
        )
    if system == "transformers":
        return TransformersRunner(model.path, dtype, plan.device)
    converted = convert_ct2(model.path, CACHE / "ct2" / f"{model.key}-{dtype}", dtype, progress)
    return CT2Runner(converted, dtype, plan.device)


def run_kernels(
    plan: Plan,
    models: list[ModelInfo],
    progress: Progress,
    on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """Every (model, dtype, system, batch, mode) cell; unsupported ones are rows with a note."""
    rows: list[dict[str, Any]] = []
    total = sum(
        len(plan.dtypes) * len(plan.systems) * len(plan.kernels[m.key].batches) * len(MODES)
        for m in models
    )
    done = 0

    def one_system(model: ModelInfo, prompts: list[list[int]], dtype: str, system: str) -> None:
        """Load one system, run its cells, close it: all in a thread that then ends, so the
        next system does not share the CPU with its OpenMP pool (engine/threads.py)."""
        nonlocal done
        kplan, runner = plan.kernels[model.key], None
        base = {"model": model.name, "plan_key": model.key, "dtype": dtype, "system": system}
        cells = [(batch, mode) for batch in kplan.batches for mode in MODES]
        what = f"{model.name} {dtype} {system}"
        if (reason := unsupported(system, dtype, plan.device)) is None:
            started = time.perf_counter()
            try:
                runner = _runner(system, model, dtype, plan, progress)
            except Exception as exc:  # a load failure is a result, not the end of the run
                reason = f"failed to load: {type(exc).__name__}: {exc}"[:200]
            else:
                loaded = time.perf_counter() - started
                progress(f"{what}: loaded in {loaded:.1f}s ({runner.detail})")
        if runner is None:
            rows.extend(
                {**base, "batch": batch, "mode": mode, "note": reason} for batch, mode in cells
            )
            done += len(cells)
            progress(f"[kernels {done}/{total}] {what}: {reason}")
            return
        try:
            for batch, mode in cells:
                try:
                    cell = measure(runner, prompts[:batch], kplan, mode == "sampled", plan.seed)
                    said = (f"{rate(cell['tokens_per_s'])} tok/s ({cell['new_tokens']} tokens x "
                            f"{cell['repeats']}, {cell['seconds']:.2f}s)")  # fmt: skip
                except Exception as exc:  # recorded; the other cells still run
                    cell = {"note": f"failed: {type(exc).__name__}: {exc}"[:200]}
                    said = cell["note"]
                rows.append({**base, "batch": batch, "mode": mode, **cell})
                done += 1
                progress(f"[kernels {done}/{total}] {what} batch {batch} {mode}: {said}")
        finally:
            runner.close()
        on_rows(rows)

    for model in models:
        kplan = plan.kernels[model.key]
        prompts = random_prompts(
            max(kplan.batches), kplan.prompt_tokens, model.vocab_size, model.banned, plan.seed
        )
        for dtype in plan.dtypes:
            for system in plan.systems:
                in_passing_thread(
                    lambda m=model, p=prompts, d=dtype, s=system: one_system(m, p, d, s)
                )
    return rows


def transformers_reference(
    model: ModelInfo, plan: Plan, length: int, row: dict[str, Any], progress: Progress
) -> None:
    """What the served system is held against at the target length: transformers'
    static-batch ``generate``, alone, after the torch backend (the faster of float32 and,
    where native, bfloat16)."""
    prompts = random_prompts(plan.clients, 32, model.vocab_size, model.banned, plan.seed)
    dtypes = ("float32", "bfloat16") if bf16_native() else ("float32",)
    for dtype in dtypes:

        def once(dtype: str = dtype) -> tuple[float, int]:
            runner = TransformersRunner(model.path, dtype, plan.device)
            try:
                generate(runner, prompts[:2], 2, True, plan.seed)  # warm-up
                started = time.perf_counter()  # a probe sets how many tokens fit
                generate(runner, prompts, PROBE_TOKENS, True, plan.seed)
                probe_s = time.perf_counter() - started
                new = fit_tokens(probe_s, PROBE_TOKENS, REFERENCE_BUDGET_S, length, 8)
                started = time.perf_counter()
                made = sum(generate(runner, prompts, new, True, plan.seed))
                return made / (time.perf_counter() - started), new
            finally:
                runner.close()

        rate, new = in_passing_thread(once)
        row[f"transformers_{dtype}_tokens_per_s"] = rate
        row[f"transformers_{dtype}_new_tokens"] = new
        progress(
            f"transformers generate {dtype}, {plan.clients} x {new} of {length} tokens: "
            f"{rate:,.0f} tok/s"
        )
        if rate > (row.get("transformers_static_tokens_per_s") or 0):
            row["transformers_static_tokens_per_s"] = rate
            row["transformers_static_dtype"] = dtype
            row["transformers_static_new_tokens"] = new
