"""What the sweep loads and what watches it: one :class:`Target` per ``--protocol`` (the Locust
user that speaks it and the server that answers it), and the Prometheus to compare with.

Servers are found, waited for or started with the launcher's own process management
(:class:`serving.triton.TritonServer`, :class:`serving.process.ManagedServer` and its probes,
:class:`loadtest.run_prometheus.PrometheusServer`); nothing here polls or signals by itself.
Both are context managers: what a run started, it stops on the way out.

Adding a protocol is one more entry in :data:`TARGETS`: the user class's name in
``loadtest/sweep/locustfile.py`` and a factory for a :class:`Server`. An OpenAI-compatible API
in front of Triton, say, would be a class that enters a :class:`TritonTarget` (the metrics,
statistics and readiness the sweep reads stay Triton's), then finds or starts the API server (a
``ManagedServer`` whose ``ready_url`` is its health route), and returns that server's URL as
:attr:`Server.users_url`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from contract.tensors import ENGINE_MODEL
from loadtest.api_process import ApiProcess
from loadtest.prom import PromSource
from loadtest.results import CheckpointInfo, ModelInfo
from loadtest.run_prometheus import INSTALL_HINT, PrometheusServer, find_binary
from serving.paths import checkpoint_dir
from serving.process import free_port, http_ready, port_in_use
from serving.triton import Ports, TritonServer

log = logging.getLogger(__name__)
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


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
            host=host,
            grpc=grpc or f"{hostname}:{int(port) + 1}",
            metrics_url=metrics_url or f"http://{hostname}:{int(port) + 2}/metrics",
        )

    @property
    def http_url(self) -> str:
        return f"http://{self.host}"

    @property
    def is_local(self) -> bool:
        return self.host.rpartition(":")[0] in LOCAL_HOSTS

    @property
    def ports(self) -> Ports:
        metrics = urllib.parse.urlsplit(self.metrics_url).port
        return Ports(
            int(self.host.rpartition(":")[2]), int(self.grpc.rpartition(":")[2]), metrics or 80
        )

    @property
    def metrics_target(self) -> str:
        """The metrics endpoint as a Prometheus scrape target (``host:port``)."""
        split = urllib.parse.urlsplit(self.metrics_url)
        hostname = "127.0.0.1" if split.hostname in LOCAL_HOSTS else split.hostname
        return f"{hostname}:{split.port}"


class Server(Protocol):
    """What the sweep needs of whatever answers the load; entered before the sweep (found,
    waited for or started) and exited after it (stopped if this run started it)."""

    endpoints: Endpoints

    @property
    def users_url(self) -> str:
        """The base URL the target's Locust users send to (Locust's ``host``)."""
        ...

    def model_ready(self, model: str) -> bool: ...

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics API (``/v2/models/stats``), for the per-execution busy time."""
        ...

    def describe(self) -> ModelInfo: ...

    def __enter__(self) -> Server: ...

    def __exit__(self, *exc: object) -> None: ...


ServerFactory = Callable[[Endpoints, Path, Path], Server]  # endpoints, model repo, run folder


@dataclass(frozen=True)
class Target:
    """One ``--protocol``: who sends the load and what answers it."""

    protocol: str
    user_class: str  # a Locust user class, "module:Class"
    server: ServerFactory
    description: str  # for --help

    def load_user_class(self) -> type:
        module, _, name = self.user_class.partition(":")
        return getattr(importlib.import_module(module), name)


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


class TritonTarget:
    """The Triton at ``endpoints``: used when it is ready; waited for when one is starting on
    this machine; otherwise, on this machine, started on the model repository."""

    start_timeout = 600.0  # the default model loads in well under a minute; a cold disk less so

    def __init__(self, endpoints: Endpoints, model_repository: Path, out: Path) -> None:
        self.endpoints = endpoints
        self.model_repository = Path(model_repository)
        self.server = TritonServer(
            self.model_repository, endpoints.ports, log_file=out / "tritonserver.log"
        )
        self.started = False

    @property
    def users_url(self) -> str:
        return self.endpoints.http_url

    def __enter__(self) -> TritonTarget:
        host = self.endpoints.host
        if http_ready(f"{self.endpoints.http_url}/v2/health/ready"):
            log.info(f"using the Triton server at {host}")
            return self
        if not self.endpoints.is_local:
            raise SystemExit(f"no Triton server answers at {host}")
        if port_in_use(self.endpoints.ports.http):
            log.info(f"a server is starting at {host}; waiting for it to be ready")
            try:
                self.server.wait_ready(self.start_timeout)  # not ours: only polls
            except TimeoutError as exc:
                raise SystemExit(f"the server at {host} did not become ready: {exc}") from exc
            return self
        checkpoint = checkpoint_dir(self.model_repository) / "config.json"
        if not checkpoint.exists():
            raise SystemExit(f"no model at {checkpoint.parent}: run `make model` first")
        log.info(f"starting Triton on {self.model_repository} (log: {self.server.log_file}) ...")
        self.server.start()
        try:
            self.server.wait_ready(self.start_timeout)
        except BaseException:
            self.server.stop()
            raise
        self.started = True
        log.info("Triton is ready")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            log.info("stopping the Triton server this sweep started")
            self.server.stop()
            self.started = False

    def model_ready(self, model: str) -> bool:
        return http_ready(f"{self.endpoints.http_url}/v2/models/{model}/ready")

    def statistics(self) -> dict[str, Any]:
        return _get_json(f"{self.endpoints.http_url}/v2/models/stats")

    def describe(self) -> ModelInfo:
        """Triton's version and the model stage's configuration, from the server; the
        checkpoint, from the build.json that ``make model`` writes beside it."""
        server: dict[str, Any] = {}
        try:
            server["triton_version"] = _get_json(f"{self.endpoints.http_url}/v2")["version"]
            config = _get_json(f"{self.endpoints.http_url}/v2/models/{ENGINE_MODEL}/config")
            parameters = config.get("parameters", {})
            server["stage_parameters"] = {k: v.get("string_value") for k, v in parameters.items()}
            server["dynamic_batching"] = config.get("dynamic_batching")
            server["instances"] = config.get("instance_group")
        except Exception as exc:
            server = {"error": str(exc)}
        return ModelInfo(**server, checkpoint=_checkpoint_info(self.model_repository))


# the same figure under GPT-J's config.json names, then the Llama family's
_CONFIG_KEYS = {
    "layers": ("n_layer", "num_hidden_layers"),
    "width": ("n_embd", "hidden_size"),
    "heads": ("n_head", "num_attention_heads"),
    "context": ("n_positions", "max_position_embeddings"),
    "vocab": ("vocab_size",),
}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _safetensors_parameters(folder: Path) -> int | None:
    """Parameters counted from the safetensors headers (no weight is read)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with file.open("rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        except (OSError, ValueError):
            return None
        for name, entry in header.items():
            if name != "__metadata__" and not name.endswith((".attn.bias", ".masked_bias")):
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total or None


def _checkpoint_info(model_repository: Path) -> CheckpointInfo | None:
    """The served checkpoint: the build.json that `make model` writes for a trained GPT-J,
    else (a pretrained or imported model of any family) its config.json, pretrained.json and
    safetensors headers."""
    folder = checkpoint_dir(model_repository)
    data = _read_json(folder / "build.json")
    config = _read_json(folder / "config.json")
    if not data and not config:
        return None
    spec = data.get("build", {})

    def figure(name: str) -> int | None:
        for source in (spec, config):
            for key in _CONFIG_KEYS[name]:
                if source.get(key) is not None:
                    return source[key]
        return None

    name = data.get("name") or _read_json(folder / "pretrained.json").get("name")
    return CheckpointInfo(
        path=str(folder),
        name=name or config.get("_model_name_or_path"),
        parameters=data.get("parameters") or _safetensors_parameters(folder),
        layers=figure("layers"),
        width=figure("width"),
        heads=figure("heads"),
        context=figure("context"),
        vocab=figure("vocab"),
        held_out_loss=data.get("held_out_loss"),
        family=config.get("model_type", "gptj") if config else "gptj",
    )


class OpenAITarget:
    """Triton, found or started as :class:`TritonTarget` does (its metrics and statistics are
    what the sweep reads), with the OpenAI-compatible API started in front of it."""

    def __init__(self, endpoints: Endpoints, model_repository: Path, out: Path) -> None:
        self.triton = TritonTarget(endpoints, model_repository, out)
        self.api = ApiProcess(endpoints.grpc, out / "openai_api.log")

    @property
    def users_url(self) -> str:
        return self.api.url

    def __enter__(self) -> OpenAITarget:
        self.triton.__enter__()
        try:
            self.api.start()
            self.api.wait_ready()
        except BaseException:
            self.api.stop()
            self.triton.__exit__()
            raise
        log.info(
            f"OpenAI-compatible API at {self.api.url} in front of {self.triton.endpoints.grpc}"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.stop()
        self.triton.__exit__(*exc)

    def model_ready(self, model: str) -> bool:
        return self.triton.model_ready(model)

    def statistics(self) -> dict[str, Any]:
        return self.triton.statistics()

    def describe(self) -> ModelInfo:
        return self.triton.describe()


TARGETS: dict[str, Target] = {
    "http": Target(
        "http",
        "loadtest.sweep.locustfile:HttpEnsembleUser",
        TritonTarget,
        "KServe v2 over HTTP (Locust's FastHttpUser)",
    ),
    "grpc": Target(
        "grpc",
        "loadtest.sweep.locustfile:GrpcEnsembleUser",
        TritonTarget,
        "tritonclient.grpc in a Locust user",
    ),
    "openai": Target(
        "openai",
        "loadtest.sweep.openai_protocol:OpenAIUser",
        OpenAITarget,
        "POST /v1/completions through the OpenAI-compatible API (its overhead over gRPC)",
    ),
}


# --- Prometheus ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusChoice:
    source: PromSource | None  # None: no comparison
    note: str  # which one, in a sentence for the log and the report


@contextmanager
def prometheus_for(choice: str, endpoints: Endpoints) -> Iterator[PrometheusChoice]:
    """The Prometheus to compare with. ``off``: none. A URL: that one, which must scrape this
    Triton. ``auto``: ``$PROMETHEUS_URL`` or http://127.0.0.1:9090 when it scrapes this Triton;
    else a private one for this run (stopped and deleted on exit) when Prometheus is installed;
    else none."""
    if choice == "off":
        yield PrometheusChoice(None, "Prometheus: off (--prometheus off)")
        return
    url = choice
    if url == "auto":
        url = os.environ.get("PROMETHEUS_URL") or "http://127.0.0.1:9090"
    source = PromSource(url)
    if source.reachable():
        instance = source.find_instance(endpoints.metrics_url)
        if instance:
            source.instance = instance
            yield PrometheusChoice(source, f"Prometheus at {url} (target {instance})")
            return
        note = f"the Prometheus at {url} does not scrape {endpoints.metrics_url}"
        if choice != "auto":
            raise SystemExit(note)
        log.info(note + "; starting a private one")
    elif choice != "auto":
        raise SystemExit(f"no Prometheus answers at {url}")
    if find_binary() is None:
        yield PrometheusChoice(None, f"Prometheus: not installed, skipped ({INSTALL_HINT})")
        return
    target = endpoints.metrics_target
    directory = Path(tempfile.mkdtemp(prefix="loadtest-prometheus-"))
    try:
        with PrometheusServer(target, free_port(), directory, interval="1s") as server:
            source = PromSource(server.url, instance=target)
            source.wait_for_scrapes()  # windows are aligned to its scrapes: have a few first
            yield PrometheusChoice(
                source, f"private Prometheus at {server.url} scraping {target} every 1s"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
