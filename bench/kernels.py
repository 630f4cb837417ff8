"""Section ``kernels``: static batches through the torch engine, the openvino backend and
transformers, each model, dtype and system loaded once for every batch size, greedy and sampled.
A short probe (which also warms up) estimates a cell's time; a cell that would overrun its
budget (bf16 without bf16 instructions, say) makes fewer tokens, and its row says how many."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import systems
from bench.format import rate
from bench.models import ModelInfo, random_prompts
from bench.settings import KernelPlan, Plan, Progress
from bench.systems import Runner, TransformersRunner, generate, unsupported
from engine import in_passing_thread
from modelbuild.openvino_export import ensure_export
from reporting.machine import bf16_native

PROBE_TOKENS = 2
MAX_REPEATS = 5
MODES = ("greedy", "sampled")
REFERENCE_BUDGET_S = 30.0  # transformers' reference: fewer tokens past this (its row says so)


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
    """tokens/s of one cell: probe, then timed runs until ``min_cell_s`` (at most 5). A probe
    that alone takes the whole budget is the measurement (its row says so): a cell never costs
    much more than its budget, however slow the system."""

    def timed(new: int, seed: int) -> tuple[int, float]:
        started = time.perf_counter()
        counts = generate(runner, prompts, new, sampled, seed)
        if any(c != new for c in counts):  # a system that stops early is not faster
            raise RuntimeError(
                f"{runner.system} generated {sorted(set(counts))} tokens instead "
                f"of {new}: the end token was not banned"
            )
        return sum(counts), time.perf_counter() - started

    wanted = kplan.new_tokens
    generated, seconds = timed(PROBE_TOKENS, seed)
    row = {
        "new_tokens": PROBE_TOKENS,
        "wanted_tokens": wanted,
        "repeats": 1,
        "note": f"{PROBE_TOKENS} of {wanted} tokens (time budget; probe only, prefill included)",
    }
    if seconds < kplan.cell_budget_s:
        new = fit_tokens(seconds, PROBE_TOKENS, kplan.cell_budget_s, wanted, kplan.min_tokens)
        generated, seconds, repeats = 0, 0.0, 0
        while repeats == 0 or (seconds < kplan.min_cell_s and repeats < MAX_REPEATS):
            made, took = timed(new, seed + 1000 * (repeats + 1))
            generated, seconds, repeats = generated + made, seconds + took, repeats + 1
        note = f"{new} of {wanted} tokens (time budget)" if new < wanted else ""
        row = {"new_tokens": new, "wanted_tokens": wanted, "repeats": repeats, "note": note}
    return {**row, "seconds": seconds, "tokens_per_s": generated / seconds}


Rows = list[dict[str, Any]]


def run_kernels(
    plan: Plan, models: list[ModelInfo], progress: Progress, on_rows: Callable[[Rows], None]
) -> Rows:
    """Every (model, dtype, system, batch, mode) cell; unsupported ones are rows with a note."""
    rows: Rows = []

    def one_system(model: ModelInfo, prompts: list[list[int]], dtype: str, system: str) -> None:
        """Load one system, run its cells, close it: all in a thread that then ends, so the
        next system does not share the CPU with its OpenMP pool (engine/threads.py)."""
        kplan, runner, said = plan.kernels[model.key], None, []
        base = {"model": model.name, "plan_key": model.key, "dtype": dtype, "system": system}
        cells = [{**base, "batch": b, "mode": mode} for b in kplan.batches for mode in MODES]
        if (reason := unsupported(system, dtype, plan.device)) is None:
            try:
                if system == "openvino":  # its export (the 350M shape's) is made once
                    ensure_export(model.path)
                if system == "transformers":
                    runner = TransformersRunner(model.path, dtype, plan.device)
                else:
                    make = systems.OpenVINORunner if system == "openvino" else systems.EngineRunner
                    runner = make(
                        model.path, dtype, plan.device, max(kplan.batches), kplan.prompt_tokens
                    )
            except Exception as exc:  # a load failure is a result, not the end of the run
                reason = f"failed to load: {type(exc).__name__}: {exc}"[:200]
        for cell in cells:
            if runner is None:
                cell["note"] = reason
                continue
            try:
                cell.update(
                    measure(
                        runner,
                        prompts[: cell["batch"]],
                        kplan,
                        cell["mode"] == "sampled",
                        plan.seed,
                    )
                )
                said.append(f"b{cell['batch']} {cell['mode']} {rate(cell['tokens_per_s'])}")
            except Exception as exc:  # recorded; the other cells still run
                cell["note"] = f"failed: {type(exc).__name__}: {exc}"[:200]
        if runner is not None:
            runner.close()
            reason = f"{runner.detail}: {', '.join(said)} tok/s"
        rows.extend(cells)
        progress(f"kernels {model.name} {dtype} {system}: {reason}")
        on_rows(rows)

    for model in models:
        kplan = plan.kernels[model.key]
        prompts = random_prompts(
            max(kplan.batches), kplan.prompt_tokens, model.vocab_size, model.banned, plan.seed
        )
        for dtype, system in ((d, s) for d in plan.dtypes for s in plan.systems):
            in_passing_thread(lambda m=model, p=prompts, d=dtype, s=system: one_system(m, p, d, s))
    return rows


def transformers_reference(
    model: ModelInfo, plan: Plan, length: int, row: dict[str, Any], progress: Progress
) -> None:
    """What the served system is held against at the target length: transformers'
    static-batch ``generate``, alone, after the torch backend (the faster of float32 and,
    where native, bfloat16), with fewer tokens where they would overrun a time budget."""
    prompts = random_prompts(plan.clients, 32, model.vocab_size, model.banned, plan.seed)
    kplan = KernelPlan((plan.clients,), length, cell_budget_s=REFERENCE_BUDGET_S, min_cell_s=0)
    for dtype in ("float32", "bfloat16") if bf16_native() else ("float32",):

        def once(dtype: str = dtype) -> dict[str, Any]:
            runner = TransformersRunner(model.path, dtype, plan.device)
            try:
                return measure(runner, prompts, kplan, sampled=True, seed=plan.seed)
            finally:
                runner.close()

        cell = in_passing_thread(once)
        tokens_per_s, new = cell["tokens_per_s"], cell["new_tokens"]
        row.update(
            {
                f"transformers_{dtype}_tokens_per_s": tokens_per_s,
                f"transformers_{dtype}_new_tokens": new,
            }
        )
        progress(
            f"transformers generate {dtype}, {plan.clients} x {new} of {length} tokens: "
            f"{tokens_per_s:,.0f} tok/s"
        )
        if tokens_per_s > (row.get("transformers_static_tokens_per_s") or 0):
            row.update(transformers_static_tokens_per_s=tokens_per_s)
            row.update(transformers_static_dtype=dtype, transformers_static_new_tokens=new)
