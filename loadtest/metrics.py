"""Triton's metrics over a measured window: snapshots, counter deltas and the derived figures.

Every Triton and engine figure is a cumulative counter, so a load test reads the metrics port at
the start and the end of its window and works with the differences. This module does that
arithmetic once, for both sources: the direct reading (two snapshots of ``/metrics``) and
Prometheus (:mod:`loadtest.prom` feeds the same :func:`window_figures` with ``increase()``).
The model stage's time is the engine's busy time, not Triton's ``compute_infer`` for ``gptj``:
why is explained once, in :mod:`contract.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, MODEL_STAGE, STAGES
from loadtest.results import Increases, WindowFigures
from reporting.triton import Snapshot, sample_name

PREPROCESSING, POSTPROCESSING = STAGES[0], STAGES[-1]
MODELS = (ENSEMBLE_MODEL, *STAGES)  # the unary pipeline's four Triton models


def counter_increase(start: float | None, end: float) -> float:
    """A counter's increase between two readings, as Prometheus' ``increase()`` counts it
    without extrapolation: a series born during the window counts from 0, and a value that went
    down means the counter was reset (the server restarted), so everything after the reset,
    ``end``, is the increase (the part before the reset is lost, as in Prometheus)."""
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


def snapshot_deltas(start: Snapshot, end: Snapshot) -> Deltas:
    """Per-series increases from ``start`` to ``end`` (resets handled per series), then summed
    by model. Gauges are skipped: a difference of gauges means nothing."""
    gauges = {names.PENDING_REQUEST_COUNT, names.ENGINE_RUNNING}
    totals: dict[tuple[str, str], float] = {}
    for key, value in end.series.items():
        name, labels = key
        if name in gauges or not name.endswith("_total"):
            continue
        model = dict(labels).get("model", "")
        totals[(name, model)] = totals.get((name, model), 0.0) + counter_increase(
            start.series.get(key), value
        )
    return Deltas(totals, end.taken_at - start.taken_at)


def execution_busy_us(statistics: Mapping[str, Any]) -> dict[str, float]:
    """Each model's execution time (us) from Triton's statistics API (``/v2/models/stats``):
    the sum over its ``batch_stats`` of ``compute_infer``, i.e. every execution counted once.
    The metrics port's ``nv_inference_compute_infer_duration_us`` charges each request of a
    batched execution with the whole execution, so it is this times the batch size."""
    busy: dict[str, float] = {}
    for model in statistics.get("model_stats", []):
        ns = sum(b["compute_infer"]["ns"] for b in model.get("batch_stats", []))
        busy[model["name"]] = busy.get(model["name"], 0.0) + ns / 1000
    return busy


def busy_shares(
    start: Mapping[str, float], end: Mapping[str, float], engine_compute_us: float
) -> dict[str, float | None]:
    """Pre- and postprocessing execution time over the window as a fraction of the engine's
    busy time: the like-for-like version of the stage shares (see execution_busy_us)."""
    return {
        stage: _ratio(counter_increase(start.get(stage), end.get(stage, 0.0)), engine_compute_us)
        for stage in (PREPROCESSING, POSTPROCESSING)
    }


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def window_figures(d: Deltas, models: Iterable[str] = MODELS) -> WindowFigures:
    """The figures of one window, from counter increases alone (so any source can feed it).

    - requests, rps: the ensemble's completed inferences over the window.
    - batch_size per model: count / exec_count (Triton's grouping; for ``gptj`` that is its
      dynamic batcher, not the engine), and engine_batch_size = step rows / steps (the running
      batch of the continuous-batching engine).
    - stage_share: as the original load test reports it, each stage's compute time over the
      model stage's; the model stage's is the engine's busy time (see the module docstring), so
      ``model`` is 1 by definition and the others are fractions of it. Triton's own figure for
      the model stage is kept as ``triton_model_compute_infer_us``, not used.
    - queue_share: time requests spent queued (Triton's queues of the three stages plus the
      engine's wait before prefill) over the ensemble's end-to-end request time.
    """
    window = d.window_s
    ensemble = ENSEMBLE_MODEL
    requests = d.get(names.INFERENCE_COUNT, ensemble)
    engine_compute = d.get(names.ENGINE_COMPUTE_DURATION_US, ENGINE_MODEL)
    compute = {
        PREPROCESSING: d.get(names.COMPUTE_INFER_DURATION_US, PREPROCESSING),
        "model": engine_compute,
        POSTPROCESSING: d.get(names.COMPUTE_INFER_DURATION_US, POSTPROCESSING),
    }
    queue = {stage: d.get(names.QUEUE_DURATION_US, stage) for stage in STAGES} | {
        # the engine model's Triton queue (where requests wait while the engine is full)
        # and the engine's own wait before prefill
        "engine": d.get(names.QUEUE_DURATION_US, ENGINE_MODEL)
        + d.get(names.ENGINE_QUEUE_DURATION_US, ENGINE_MODEL)
    }
    request_us = d.get(names.REQUEST_DURATION_US, ensemble)
    generated = d.get(names.ENGINE_GENERATED_TOKENS, ENGINE_MODEL)
    engine_requests = d.get(names.ENGINE_REQUESTS, ENGINE_MODEL)
    return WindowFigures(
        window_s=window,
        requests=requests,
        rps=_ratio(requests, window),
        failures=d.get(names.REQUEST_FAILURE, ensemble),
        mean_request_ms=_ratio(request_us / 1000, requests),
        tokens_per_s=_ratio(generated, window),
        generated_tokens=generated,
        prompt_tokens=d.get(names.ENGINE_PROMPT_TOKENS, ENGINE_MODEL),
        tokens_per_request=_ratio(generated, engine_requests),
        counts={m: d.get(names.INFERENCE_COUNT, m) for m in models},
        engine_requests=engine_requests,
        batch_size={
            m: _ratio(d.get(names.INFERENCE_COUNT, m), d.get(names.EXEC_COUNT, m)) for m in models
        },
        engine_batch_size=_ratio(
            d.get(names.ENGINE_STEP_ROWS, ENGINE_MODEL), d.get(names.ENGINE_STEPS, ENGINE_MODEL)
        ),
        compute_us=compute,
        triton_model_compute_infer_us=d.get(names.COMPUTE_INFER_DURATION_US, MODEL_STAGE),
        stage_share={stage: _ratio(us, engine_compute) for stage, us in compute.items()},
        queue_us=queue,
        request_us=request_us,
        queue_share=_ratio(sum(queue.values()), request_us),
        engine_busy=_ratio(engine_compute / 1e6, window),
    )


# --- the prefix cache: shared by the sweep's and the editor profile's reports ------------


def reuse_share(received: float, reused: float | None) -> float | None:
    """Prompt tokens the prefix cache held over prompt tokens the engine received (its
    prompt-token counter counts every admitted prompt whole, reused blocks included). An upper
    bound: the reuse counter is the backend's own index of blocks, which the pipeline may have
    evicted meanwhile."""
    if reused is None or not received:
        return None
    return reused / received


def reuse_line(received: float, reused: float) -> str:
    """One line for a report that has the two engine counters (the seed sweep's)."""
    share = reuse_share(received, reused)
    return (
        f"Prefix-cache reuse: {reused:,.0f} of {received:,.0f} prompt tokens received "
        f"({'-' if share is None else f'{share:.1%}'}; `{names.ENGINE_PROMPT_TOKENS_REUSED}`, "
        "an upper bound)"
    )
