"""What a run produces, as types: a :class:`LengthResult` per output length and the
:class:`RunInfo` around them, with their stored forms (``summary.json`` and the request log).

This module is the schema of ``summary.json``: its keys are these dataclasses' field names, so
a renamed field fails where it is read (type checkers, the report's unit test), not when a
report is drawn. It imports nothing else of the load test: :mod:`loadtest.metrics` and
:mod:`loadtest.prom` fill these types, :mod:`loadtest.sweep.driver` assembles them, and the report
reads them (:meth:`RunResult.load` redraws one from a run folder).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reporting.machine import describe

Increases = dict[str, dict[str, float]]  # counter sample name -> model -> increase
PERCENTILES = ("p50", "p90", "p95", "p99")


# --- Locust's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Client-side response times (ms) over a window; None when nothing completed."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class ClientFigures:
    """One Locust request name over a window."""

    requests: int
    failures: int
    rps: float | None
    latency_ms: Latency


@dataclass(frozen=True)
class LocustWindow(ClientFigures):
    """The unary requests of the measured window as Locust counted them."""

    window_s: float = 0.0  # from Locust's statistics reset to their reading
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamFigures:
    """The streaming phase: time to first token, each inter-token gap, whole requests."""

    users: int
    seconds: float
    ttft: ClientFigures
    inter_token: ClientFigures
    total: ClientFigures


# --- the server's side (Prometheus when one runs, else Triton's metrics port) -----------


@dataclass(frozen=True)
class WindowFigures:
    """One window's figures from counter increases alone; how each is computed is in
    :func:`loadtest.metrics.window_figures`. Keyed by model name where there is one per model;
    ``compute_us`` and ``stage_share`` by stage with ``model`` for the model stage."""

    window_s: float
    requests: float
    rps: float | None
    failures: float
    mean_request_ms: float | None
    tokens_per_s: float | None
    generated_tokens: float
    prompt_tokens: float
    tokens_per_request: float | None
    counts: dict[str, float]
    engine_requests: float
    batch_size: dict[str, float | None]
    engine_batch_size: float | None
    compute_us: dict[str, float]
    triton_model_compute_infer_us: float  # kept for reference, not used: contract/metrics.py
    stage_share: dict[str, float | None]
    queue_us: dict[str, float]
    request_us: float
    queue_share: float | None
    engine_busy: float | None


@dataclass(frozen=True)
class Timeline:
    """The window's ends in seconds since the users started (the request log's clock)."""

    window_start_s: float
    window_end_s: float


# The headline figures, written first in each summary.json row: which source each comes from
# is the corresponding LengthResult property.
HEADLINE = (
    "window_s",
    "rps",
    "latency_ms",
    "failures",
    "requests",
    "tokens_per_s",
    "tokens_per_request",
    "batch_size",
    "engine_batch_size",
    "stage_share",
    "queue_share",
)


def _headline(side: str, name: str) -> Any:
    """A read-only attribute that is ``name`` of the result's ``side`` (locust or triton)."""
    return property(lambda self: getattr(getattr(self, side), name), doc=f"{side}.{name}")


@dataclass(frozen=True)
class LengthResult:
    """Everything measured at one output length. The headline figures are properties over
    the two sides: the client's (``locust``) and Triton's metrics (``triton``, read from
    ``source``)."""

    output_len: int
    protocol: str
    users: int
    busy_share: dict[str, float | None]  # each execution counted once (metrics.busy_shares)
    locust: LocustWindow
    triton: WindowFigures
    triton_deltas: Increases
    timeline: Timeline
    stream: StreamFigures | None
    drained: bool
    files: list[str]
    source: str  # where the window's Triton figures were read: Prometheus, or /metrics

    # the headline figures: the client's own, then Triton's (HEADLINE lists them in order)
    window_s = _headline("triton", "window_s")
    rps = _headline("locust", "rps")
    latency_ms = _headline("locust", "latency_ms")
    failures = _headline("locust", "failures")
    requests = _headline("locust", "requests")
    tokens_per_s = _headline("triton", "tokens_per_s")
    tokens_per_request = _headline("triton", "tokens_per_request")
    batch_size = _headline("triton", "batch_size")
    engine_batch_size = _headline("triton", "engine_batch_size")
    stage_share = _headline("triton", "stage_share")
    queue_share = _headline("triton", "queue_share")

    def increase(self, sample: str, model: str) -> float:
        """A counter's increase over the window (``sample``: its parsed sample name)."""
        return self.triton_deltas.get(sample, {}).get(model, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """summary.json's row: identity, the headline figures, then the details."""
        details = dataclasses.asdict(self)
        row = {key: details.pop(key) for key in ("output_len", "protocol", "users")}
        row |= {key: _plain(getattr(self, key)) for key in HEADLINE}
        return row | details


# --- the run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """What the sweep was asked to do (as it ran: no streaming phase is recorded as 0)."""

    lengths: list[int]
    users: int
    duration_s: float
    warmup_s: float
    protocol: str
    host: str
    metrics_url: str
    stream_users: int
    stream_duration_s: float
    prompts: int
    prompt_seed: int
    sampling: dict[str, Any]


@dataclass(frozen=True)
class MachineInfo:
    cpu: str
    cores: int | None
    memory_gib: float | None
    gpu: str
    os: str
    python: str
    torch: str | None
    locust: str | None
    tritonclient: str | None
    cpu_flags: list[str] = field(default_factory=list)

    @classmethod
    def here(cls) -> MachineInfo:
        """This machine now (:func:`reporting.machine.describe`)."""
        info = describe()
        return cls(**{f.name: info[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class CheckpointInfo:
    """From the served checkpoint's build.json, or its config.json (loadtest/targets.py)."""

    path: str
    name: str | None = None
    parameters: int | None = None
    layers: int | None = None
    width: int | None = None
    heads: int | None = None
    context: int | None = None
    vocab: int | None = None
    held_out_loss: float | None = None
    family: str | None = None  # config.json's model_type: gptj, llama, ...


@dataclass(frozen=True)
class ModelInfo:
    """What the server says it serves; ``error`` when it could not be asked."""

    triton_version: str | None = None
    stage_parameters: dict[str, str | None] | None = None
    dynamic_batching: dict[str, Any] | None = None
    instances: list[Any] | None = None
    error: str | None = None
    checkpoint: CheckpointInfo | None = None


@dataclass(frozen=True)
class RunInfo:
    name: str
    started: str  # ISO time
    seconds: float
    command: str
    settings: RunSettings
    prometheus: str  # which Prometheus was used, in a sentence
    machine: MachineInfo
    model: ModelInfo


@dataclass(frozen=True)
class RunResult:
    """``summary.json``: ``{"run": RunInfo, "rows": [LengthResult, ...]}``."""

    run: RunInfo
    rows: list[LengthResult]

    def to_dict(self) -> dict[str, Any]:
        return {"run": dataclasses.asdict(self.run), "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        return _load(cls, data)

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> RunResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _load(kind: Any, data: Any) -> Any:
    """``data`` (parsed JSON) as ``kind``, following the type hints: dataclasses, lists, dicts,
    optionals, and a union of dataclasses told apart by their keys. Keys that are no field
    (a row's headline figures, which are properties) are left out."""
    if data is None:
        return None
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(
            **{
                f.name: _load(hints[f.name], data[f.name])
                for f in dataclasses.fields(kind)
                if f.name in data
            }
        )
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        for option in options:
            if dataclasses.is_dataclass(option):
                if set(data) <= {f.name for f in dataclasses.fields(option)}:
                    return _load(option, data)
            elif len(options) == 1:
                return _load(option, data)
        if any(dataclasses.is_dataclass(o) for o in options):
            raise ValueError(f"{sorted(data)} matches none of {options}")
        return data
    if origin is list:
        return [_load(args[0], item) for item in data]
    if origin is dict:
        return {key: _load(args[1], value) for key, value in data.items()}
    return data


# --- the run folder's other files ----------------------------------------------------------


def length_file(length: int, suffix: str) -> str:
    """A per-length file's name in the run folder, e.g. ``len_0032_stats.csv``."""
    return f"len_{length:04d}{suffix}"


# The charts (drawn by loadtest.sweep.charts, linked from report.md by loadtest.sweep.markdown).
RPS_LATENCY_CHART = "rps_latency.png"
STAGE_SHARES_CHART = "stage_shares.png"


def timeseries_chart(length: int) -> str:
    return f"timeseries_len_{length:04d}.png"


class RequestRecord(NamedTuple):
    """One request of the request log (``len_NNNN_requests.csv``)."""

    t_s: float  # completion time, seconds since the users started
    name: str  # Locust's request name
    response_time_ms: float
    response_length: int
    failed: bool


def write_request_log(path: Path, records: Iterable[RequestRecord]) -> None:
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(RequestRecord._fields)
        out.writerows(
            (f"{r.t_s:.3f}", r.name, f"{r.response_time_ms:.1f}", r.response_length, int(r.failed))
            for r in records
        )


def read_request_log(path: Path) -> list[RequestRecord]:
    with open(path, newline="") as handle:
        return [
            RequestRecord(
                float(r["t_s"]),
                r["name"],
                float(r["response_time_ms"]),
                int(r["response_length"]),
                r["failed"] == "1",
            )
            for r in csv.DictReader(handle)
        ]
