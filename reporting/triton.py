"""The Triton every tool measures: where it answers (:class:`Endpoints`), found or started
through the production launcher (:func:`open_triton`, so its signals and watchdog are part of
what a run observes; a server found running is never stopped), what it serves, its metrics
(:class:`Snapshot`) and the wait until it has drained (:func:`wait_for_drain`)."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from serving.paths import REPO_ROOT, checkpoint_dir
from serving.process import ManagedServer, http_ready, port_in_use, spawn_tied
from serving.triton import Ports

log = logging.getLogger(__name__)
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
START_TIMEOUT_S = 600.0  # the default model loads in well under a minute; a cold disk less so


@dataclass(frozen=True)
class Endpoints:
    """Where Triton answers: HTTP (health, statistics API, the HTTP users), gRPC, metrics."""

    host: str  # host:port of the HTTP endpoint
    grpc: str  # host:port
    metrics_url: str

    @classmethod
    def from_host(
        cls, host: str, grpc: str | None = None, metrics_url: str | None = None
    ) -> Endpoints:
        """From Triton's HTTP ``host:port``; gRPC and metrics default to its port + 1 and + 2,
        as ``make triton`` lays them out."""
        host = host.removeprefix("http://").removeprefix("https://").rstrip("/")
        hostname, _, port = host.rpartition(":")
        if not hostname or not port.isdigit():
            raise ValueError(f"--host must be host:port, got {host!r}")
        return cls(
            host,
            grpc or f"{hostname}:{int(port) + 1}",
            metrics_url or f"http://{hostname}:{int(port) + 2}/metrics",
        )

    @classmethod
    def local(cls, ports: Ports) -> Endpoints:
        return cls.from_host(
            f"127.0.0.1:{ports.http}",
            f"127.0.0.1:{ports.grpc}",
            f"http://127.0.0.1:{ports.metrics}/metrics",
        )

    @property
    def http_url(self) -> str:
        return f"http://{self.host}"

    @property
    def is_local(self) -> bool:
        return self.host.rpartition(":")[0] in LOCAL_HOSTS

    @property
    def ports(self) -> Ports:
        metrics = urllib.parse.urlsplit(self.metrics_url).port or 80
        return Ports(int(self.host.rpartition(":")[2]), int(self.grpc.rpartition(":")[2]), metrics)

    @property
    def metrics_target(self) -> str:
        """The metrics endpoint as a Prometheus scrape target (``host:port``)."""
        split = urllib.parse.urlsplit(self.metrics_url)
        hostname = "127.0.0.1" if split.hostname in LOCAL_HOSTS else split.hostname
        return f"{hostname}:{split.port}"


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


class ChildServer(ManagedServer):
    """A server a tool runs as its child on 127.0.0.1:``port``, tied to the tool's life."""

    ready_path = "/"

    def __init__(self, port: int, log_file: Path) -> None:
        self.port, self.log_file = port, log_file
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        return self.url + self.ready_path

    @property
    def log_hint(self) -> str:
        return f"; see {self.log_file}"

    def spawn(self, command: list[str], **popen: Any) -> Self:  # its output in log_file
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            self.process = spawn_tied(command, out, **popen)
        return self


class LauncherServer(ChildServer):
    """``python -m serving.triton`` as a child: the production entry point."""

    name = "serving.triton launcher"
    stop_signal = signal.SIGTERM  # the launcher stops tritonserver gracefully, then exits
    ready_timeout = START_TIMEOUT_S
    stop_timeout = 90.0  # the launcher itself waits up to 60 s for tritonserver

    def __init__(self, model_repository: Path, endpoints: Endpoints, log_file: Path) -> None:
        super().__init__(endpoints.ports.http, log_file)
        self.model_repository = Path(model_repository).resolve()
        self.endpoints = endpoints

    @property
    def ready_url(self) -> str:  # a server someone else starts may answer at localhost
        return f"{self.endpoints.http_url}/v2/health/ready"

    def start(self) -> LauncherServer:
        ports = self.endpoints.ports
        return self.spawn(
            [
                sys.executable,
                "-m",
                "serving.triton",
                "--model-repository",
                str(self.model_repository),
                "--address",
                "127.0.0.1",
                "--http-port",
                str(ports.http),
                "--grpc-port",
                str(ports.grpc),
                "--metrics-port",
                str(ports.metrics),
            ],
            cwd=REPO_ROOT,
        )


@dataclass
class ServedTriton:
    """The Triton under test: where it answers and, when this run started it, its launcher.
    A context manager: what a run started, it stops on the way out."""

    endpoints: Endpoints
    launcher: LauncherServer | None = None
    description: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return self.launcher is not None

    @property
    def grpc_url(self) -> str:
        return self.endpoints.grpc

    def info(self) -> dict[str, Any]:
        """Triton's version and the engine model's parameters, batching and instances (read
        once); ``{"error": ...}`` when it could not say."""
        if not self.facts:
            url = self.endpoints.http_url
            try:
                config = get_json(f"{url}/v2/models/{ENGINE_MODEL}/config")
                self.facts.update(
                    triton_version=get_json(f"{url}/v2")["version"],
                    stage_parameters={
                        k: v.get("string_value") for k, v in config.get("parameters", {}).items()
                    },
                    dynamic_batching=config.get("dynamic_batching"),
                    instances=config.get("instance_group"),
                )
            except Exception as exc:
                self.facts = {"error": str(exc)}
        return self.facts

    def close(self, timeout: float | None = None) -> int | None:
        """Stop the server if this run started it (killed after ``timeout`` s): its exit code."""
        if self.launcher is None:
            return None
        log.info("stopping the Triton server this run started")
        launcher, self.launcher = self.launcher, None
        return launcher.stop(timeout)

    def __enter__(self) -> ServedTriton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_triton(endpoints: Endpoints, model_repository: Path, log_file: Path) -> ServedTriton:
    """The Triton ready (or starting) at ``endpoints``, else one started on this machine;
    SystemExit says what to do when neither works."""
    host = endpoints.host
    if http_ready(f"{endpoints.http_url}/v2/health/ready"):
        log.info(f"using the Triton server at {host}")
        return ServedTriton(endpoints, description=f"found at {host}")
    if not endpoints.is_local:
        raise SystemExit(
            f"no Triton server answers at {host}; a tool only starts one on this machine "
            "(give HOST=127.0.0.1:<port>)"
        )
    if port_in_use(endpoints.ports.http):
        log.info(f"a server is starting at {host}; waiting for it to be ready")
        try:
            LauncherServer(model_repository, endpoints, log_file).wait_ready()  # only polls
        except TimeoutError as exc:
            raise SystemExit(f"the server at {host} did not become ready: {exc}") from exc
        return ServedTriton(endpoints, description=f"found at {host}")
    checkpoint = checkpoint_dir(model_repository) / "config.json"
    if not checkpoint.exists():
        raise SystemExit(f"no model at {checkpoint.parent}: run `make model` first")
    busy = [p for p in vars(endpoints.ports).values() if port_in_use(p)]
    if busy:
        raise SystemExit(
            f"port(s) {busy} are taken by something that is not a ready Triton: free them "
            "or choose another HOST=127.0.0.1:<port> (gRPC and metrics use port+1, +2)"
        )
    launcher = LauncherServer(model_repository, endpoints, log_file)
    log.info(f"starting Triton through the launcher at {host} (log: {log_file}) ...")
    launcher.start()
    try:
        launcher.wait_ready()
    except BaseException as exc:
        launcher.stop()
        if isinstance(exc, RuntimeError | TimeoutError):
            raise SystemExit(f"the server did not start: {exc}") from exc
        raise
    log.info("Triton is ready")
    return ServedTriton(endpoints, launcher, f"started at {host} (python -m serving.triton)")


def model_context(model_repository: Path, default: int = 2048) -> int:
    """The served checkpoint's context (n_positions), for prompts sized to it."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        config = json.loads((checkpoint_dir(model_repository) / "config.json").read_text())
        return int(config.get("n_positions") or config["max_position_embeddings"])
    return default


def sample_name(metric: str) -> str:
    """A counter's name once parsed: prometheus_client (OpenMetrics) adds ``_total`` to Triton's
    ``nv_inference_count``; the engine's counters already end so."""
    gauges = {names.PENDING_REQUEST_COUNT, names.ENGINE_RUNNING}
    return metric if metric in gauges or metric.endswith("_total") else metric + "_total"


@dataclass(frozen=True)
class Snapshot:
    """Every sample of one ``/metrics`` reading, and when it was taken (Unix seconds)."""

    taken_at: float
    series: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, labels): value
    text: str = field(default="", repr=False)

    def value(self, metric: str, **labels: str) -> float:
        """Sum of the samples of ``metric`` whose labels include ``labels`` (0 when none)."""
        wanted = sample_name(metric)
        return sum(
            v
            for (name, series_labels), v in self.series.items()
            if name == wanted and all((k, val) in series_labels for k, val in labels.items())
        )

    def gauge(self, metric: str) -> float | None:
        """Sum of a gauge's samples over every model (None when not exported)."""
        values = [v for (name, _), v in self.series.items() if name == metric]
        return sum(values) if values else None


def parse_metrics(text: str, taken_at: float = 0.0) -> Snapshot:
    """Parse Prometheus text exposition (Triton's ``/metrics``) into a :class:`Snapshot`."""
    # OpenMetrics' *_created companions are timestamps, not counts
    series = {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
    return Snapshot(taken_at, series, text)


def read_snapshot(url: str, timeout: float = 10.0) -> Snapshot:
    """One reading of a metrics endpoint, stamped with the midpoint of the HTTP exchange."""
    started = time.time()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return parse_metrics(text, (started + time.time()) / 2)


@dataclass(frozen=True)
class EngineState:
    running: float | None  # codegen_engine_running_sequences, every engine summed
    pending: float | None  # Triton's nv_inference_pending_request_count, every model summed
    kv_cache_bytes: float | None  # None: not exported
    cancelled: float | None  # codegen_engine_cancelled_total, every engine summed

    @property
    def idle(self) -> bool:
        return not self.running and not self.pending


def engine_state(metrics_url: str) -> EngineState:
    gauges = (
        names.ENGINE_RUNNING,
        names.PENDING_REQUEST_COUNT,
        names.ENGINE_KV_CACHE_BYTES,
        names.ENGINE_CANCELLED,
    )
    return EngineState(*map(read_snapshot(metrics_url).gauge, gauges))


def wait_for_drain(metrics_url: str, timeout: float) -> tuple[EngineState | None, float]:
    """Poll the metrics until nothing runs or waits (or ``timeout``): the last state read and
    how long it took."""
    began, state = time.monotonic(), None
    while True:
        with contextlib.suppress(OSError, ValueError):
            state = engine_state(metrics_url)
        if (state is not None and state.idle) or time.monotonic() - began > timeout:
            return state, time.monotonic() - began
        time.sleep(0.5)
