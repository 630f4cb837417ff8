"""Triton's counters over a measured window and the figures derived from them: increases from
one source, two readings of ``/metrics`` or a Prometheus' first and last scrape inside it, both
through :func:`snapshot_deltas`. The model stage's time is the engine's busy time, not Triton's
``compute_infer`` for ``gptj`` (:mod:`contract.metrics` says why)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, MODEL_STAGE, STAGES
from reporting.triton import Snapshot, sample_name

PREPROCESSING, POSTPROCESSING = STAGES[0], STAGES[-1]
MODELS = (ENSEMBLE_MODEL, *STAGES)  # the unary pipeline's four Triton models
Increases = dict[str, dict[str, float]]  # counter sample name -> model -> increase


def counter_increase(start: float | None, end: float) -> float:
    """A counter's increase between two readings: a series born during the window counts from
    0; one that went down was reset (the server restarted), so ``end`` is the increase."""
    if start is None:
        return end
    return end - start if end >= start else end


@dataclass(frozen=True)
class Deltas:
    """Counter increases over a window by (metric, model), summed over other labels."""

    values: Mapping[tuple[str, str], float]
    window_s: float

    def get(self, metric: str, model: str) -> float:
        return self.values.get((sample_name(metric), model), 0.0)

    def as_dict(self) -> Increases:
        out: Increases = {}
        for (metric, model), value in sorted(self.values.items()):
            out.setdefault(metric, {})[model] = value
        return out

    @classmethod
    def from_dict(cls, increases: Increases, window_s: float) -> Deltas:
        values = {(m, model): v for m, models in increases.items() for model, v in models.items()}
        return cls(values, window_s)


def snapshot_deltas(start: Snapshot, end: Snapshot) -> Deltas:
    """Per-series increases from ``start`` to ``end``, summed by model; gauges skipped."""
    totals: dict[tuple[str, str], float] = {}
    for (name, labels), value in end.series.items():
        if name.endswith("_total"):  # counters only: gauges have no _total
            key = (name, dict(labels).get("model", ""))
            increase = counter_increase(start.series.get((name, labels)), value)
            totals[key] = totals.get(key, 0.0) + increase
    return Deltas(totals, end.taken_at - start.taken_at)


def execution_busy_us(statistics: Mapping[str, Any]) -> dict[str, float]:
    """Each model's execution time (us) from Triton's statistics API, every execution counted
    once (the metrics port's ``compute_infer`` charges each request of a batch with all of it)."""
    busy: dict[str, float] = {}
    for model in statistics.get("model_stats", []):
        ns = sum(b["compute_infer"]["ns"] for b in model.get("batch_stats", []))
        busy[model["name"]] = busy.get(model["name"], 0.0) + ns / 1000
    return busy


def busy_shares(
    start: Mapping[str, float], end: Mapping[str, float], engine_compute_us: float
) -> dict[str, float | None]:
    """Pre- and postprocessing execution time over the window as a fraction of the engine's busy
    time: the like-for-like stage shares."""
    return {
        stage: _ratio(counter_increase(start.get(stage), end.get(stage, 0.0)), engine_compute_us)
        for stage in (PREPROCESSING, POSTPROCESSING)
    }


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def window_figures(d: Deltas) -> dict[str, float | None]:
    """One window's figures, the columns of a report's per-window row (docs/loadtest.md and the
    report's "How the figures are computed" say what each is)."""
    window, engine = d.window_s, ENGINE_MODEL
    requests = d.get(names.INFERENCE_COUNT, ENSEMBLE_MODEL)
    compute = {
        PREPROCESSING: d.get(names.COMPUTE_INFER_DURATION_US, PREPROCESSING),
        "model": d.get(names.ENGINE_COMPUTE_DURATION_US, engine),
        POSTPROCESSING: d.get(names.COMPUTE_INFER_DURATION_US, POSTPROCESSING),
    }
    queued = sum(d.get(names.QUEUE_DURATION_US, stage) for stage in STAGES)
    # the engine model's Triton queue (while the engine is full) and its wait before prefill
    queued += d.get(names.QUEUE_DURATION_US, engine) + d.get(names.ENGINE_QUEUE_DURATION_US, engine)
    request_us = d.get(names.REQUEST_DURATION_US, ENSEMBLE_MODEL)
    generated = d.get(names.ENGINE_GENERATED_TOKENS, engine)
    engine_requests = d.get(names.ENGINE_REQUESTS, engine)
    figures: dict[str, float | None] = {
        "window_s": window,
        "triton_requests": requests,
        "triton_rps": _ratio(requests, window),
        "triton_failures": d.get(names.REQUEST_FAILURE, ENSEMBLE_MODEL),
        "triton_mean_ms": _ratio(request_us / 1000, requests),
        "tokens_per_s": _ratio(generated, window),
        "generated_tokens": generated,
        "prompt_tokens": d.get(names.ENGINE_PROMPT_TOKENS, engine),
        "tokens_per_request": _ratio(generated, engine_requests),
        "engine_requests": engine_requests,
        "engine_batch": _ratio(
            d.get(names.ENGINE_STEP_ROWS, engine), d.get(names.ENGINE_STEPS, engine)
        ),
        "triton_model_compute_infer_us": d.get(names.COMPUTE_INFER_DURATION_US, MODEL_STAGE),
        "queue_share": _ratio(queued, request_us),
        "engine_busy": _ratio(compute["model"] / 1e6, window),
    }
    for model in MODELS:
        count = d.get(names.INFERENCE_COUNT, model)
        figures[f"count_{model}"] = count
        figures[f"batch_{model}"] = _ratio(count, d.get(names.EXEC_COUNT, model))
    for stage, us in compute.items():
        figures[f"compute_{stage}_us"] = us
        figures[f"share_{stage}"] = _ratio(us, compute["model"])
    return figures


def reuse_share(received: float, reused: float | None) -> float | None:
    """Prompt tokens the prefix cache held over those the engine received; an upper bound (the
    backend's own index of blocks, which the pipeline may have evicted meanwhile)."""
    return None if reused is None or not received else reused / received


def reuse_line(received: float, reused: float) -> str:
    share = reuse_share(received, reused)
    return (
        f"Prefix-cache reuse: {reused:,.0f} of {received:,.0f} prompt tokens received "
        f"({'-' if share is None else f'{share:.1%}'}; `{names.ENGINE_PROMPT_TOKENS_REUSED}`, "
        "an upper bound)"
    )
