"""The server side of the soak: find the Triton at ``--host`` or start one through the
project's launcher, watch its memory and its engine, and run the stub-kill drill on a server
the soak started itself.

A server is started the way production starts it (``python -m serving.triton``, the image's
command), as a :class:`serving.process.ManagedServer` like every other child process of the
project, so the drill sees what Kubernetes would see: whether the launcher exits when a stub
dies. A server found running is never killed, signalled or drilled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.metrics import Snapshot, read_snapshot
from loadtest.soak.results import RssSample
from loadtest.targets import Endpoints
from serving.paths import REPO_ROOT, checkpoint_dir
from serving.process import ManagedServer, http_ready, port_in_use, spawn_tied

log = logging.getLogger("soak")

# Another engineer is adding this gauge to the engine; read it when exported.
KV_CACHE_BYTES = getattr(names, "ENGINE_KV_CACHE_BYTES", "codegen_engine_kv_cache_bytes")
STUB_BINARY = "triton_python_backend_stub"


class LauncherServer(ManagedServer):
    """``python -m serving.triton`` as a child: the production entry point, so its own
    behaviour (signals, a watchdog) is part of what the soak observes."""

    name = "serving.triton launcher"
    stop_signal = signal.SIGTERM  # the launcher stops tritonserver gracefully, then exits
    ready_timeout = 600.0
    stop_timeout = 90.0  # the launcher itself waits up to 60 s for tritonserver

    def __init__(self, model_repository: Path, endpoints: Endpoints, log_file: Path) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.endpoints = endpoints
        self.log_file = log_file
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        ports = self.endpoints.ports
        return [
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
        ]

    def start(self) -> LauncherServer:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            self.process = spawn_tied(self.command(), out, cwd=REPO_ROOT)
        return self

    @property
    def ready_url(self) -> str:
        return f"{self.endpoints.http_url}/v2/health/ready"

    @property
    def log_hint(self) -> str:
        return f"; see {self.log_file}"


@dataclass
class ServerHandle:
    """The Triton under test: where it answers, whether the soak started it, its processes."""

    endpoints: Endpoints
    started: bool
    launcher: LauncherServer | None = None
    description: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def tritonserver(self) -> psutil.Process | None:
        """tritonserver's process on this machine (None when not found)."""
        if self.launcher is not None and self.launcher.process is not None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.launcher.process.pid).children(recursive=True):
                    if child.name() == "tritonserver":
                        return child
            return None
        if not self.endpoints.is_local:
            return None
        flag = f"--http-port={self.endpoints.ports.http}"
        for proc in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["name"] == "tritonserver" and flag in (proc.info["cmdline"] or []):
                    return proc
        return None


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def open_server(endpoints: Endpoints, model_repository: Path, out: Path) -> ServerHandle:
    """The Triton at ``endpoints`` if one is ready (or starting) there; otherwise, on this
    machine, one started through the launcher on the model repository. Raises SystemExit with
    what to do when neither works."""
    host = endpoints.host
    if http_ready(f"{endpoints.http_url}/v2/health/ready"):
        handle = ServerHandle(endpoints, started=False, description=f"found at {host}")
    elif not endpoints.is_local:
        raise SystemExit(
            f"no Triton server answers at {host}; the soak only starts one on this machine "
            "(give HOST=127.0.0.1:<port>) and sends traffic only to 127.0.0.1"
        )
    elif port_in_use(endpoints.ports.http):
        log.info(f"a server is starting at {host}; waiting for it to be ready")
        waiter = LauncherServer(model_repository, endpoints, out / "unused.log")
        try:
            waiter.wait_ready(600)  # not ours: only polls
        except TimeoutError as exc:
            raise SystemExit(f"the server at {host} did not become ready: {exc}") from exc
        handle = ServerHandle(endpoints, started=False, description=f"found at {host}")
    else:
        checkpoint = checkpoint_dir(model_repository) / "config.json"
        if not checkpoint.exists():
            raise SystemExit(f"no model at {checkpoint.parent}: run `make model` first")
        busy = [p for p in vars(endpoints.ports).values() if port_in_use(p)]
        if busy:
            raise SystemExit(
                f"port(s) {busy} are taken by something that is not a ready Triton: free them "
                "or choose another HOST=127.0.0.1:<port> (gRPC and metrics use port+1, +2)"
            )
        launcher = LauncherServer(model_repository, endpoints, out / "tritonserver.log")
        log.info(f"starting Triton through the launcher at {host} (log: {launcher.log_file}) ...")
        launcher.start()
        try:
            launcher.wait_ready()
        except BaseException as exc:
            launcher.stop()
            if isinstance(exc, RuntimeError | TimeoutError):
                raise SystemExit(f"the server did not start: {exc}") from exc
            raise
        handle = ServerHandle(
            endpoints,
            started=True,
            launcher=launcher,
            description=f"started by the soak at {host} (python -m serving.triton)",
        )
    with contextlib.suppress(Exception):
        handle.info["triton_version"] = _get_json(f"{endpoints.http_url}/v2")["version"]
    with contextlib.suppress(Exception):
        config = _get_json(f"{endpoints.http_url}/v2/models/{ENGINE_MODEL}/config")
        handle.info["stage_parameters"] = {
            k: v.get("string_value") for k, v in config.get("parameters", {}).items()
        }
    return handle


def close_server(handle: ServerHandle, timeout: float | None = None) -> int | None:
    """Stop the server if the soak started it (and it is still running): the launcher's exit
    code, or None. After ``timeout`` seconds the launcher is killed, and tritonserver with it
    (it dies with its parent)."""
    if handle.started and handle.launcher is not None:
        log.info("stopping the Triton server the soak started")
        return handle.launcher.stop(timeout)
    return None


def model_context(model_repository: Path, default: int = 2048) -> int:
    """The served checkpoint's context (n_positions), for the over-context prompt."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        config = json.loads((checkpoint_dir(model_repository) / "config.json").read_text())
        return int(config.get("n_positions") or config["max_position_embeddings"])
    return default


# --- memory --------------------------------------------------------------------------------


def tree_rss(root: psutil.Process) -> tuple[int, int]:
    """RSS of a process and all its descendants (tritonserver and its python-backend stubs),
    summed, and how many processes that was."""
    total, count = 0, 0
    with contextlib.suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
                count += 1
    return total, count


class RssSampler:
    """Samples the server tree's RSS every ``every`` seconds in a thread, labelled with the
    phase the soak is in."""

    def __init__(self, handle: ServerHandle, clock: Any, every: float) -> None:
        self.handle, self.clock, self.every = handle, clock, every
        self.samples: list[RssSample] = []
        self.phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._root: psutil.Process | None = None

    def start(self) -> RssSampler:
        self._root = self.handle.tritonserver()
        self._thread.start()
        return self

    @property
    def available(self) -> bool:
        return self._root is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._root is not None and self._root.is_running():
                rss, count = tree_rss(self._root)
                if count:
                    self.samples.append(RssSample(round(self.clock(), 2), self.phase, rss, count))
            self._stop.wait(self.every)

    def latest(self) -> RssSample | None:
        return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# --- the engine ----------------------------------------------------------------------------


def gauge(snapshot: Snapshot, metric: str) -> float | None:
    """Sum of a gauge's samples over every model (None when the server does not export it)."""
    values = [v for (name, _), v in snapshot.series.items() if name == metric]
    return sum(values) if values else None


@dataclass(frozen=True)
class EngineState:
    running: float | None  # codegen_engine_running_sequences, every engine summed
    pending: float | None  # Triton's nv_inference_pending_request_count, every model summed
    kv_cache_bytes: float | None  # None: not exported
    cancelled: float | None  # codegen_engine_cancelled_total, every engine summed


def engine_state(metrics_url: str) -> EngineState:
    snapshot = read_snapshot(metrics_url)
    return EngineState(
        running=gauge(snapshot, names.ENGINE_RUNNING),
        pending=gauge(snapshot, names.PENDING_REQUEST_COUNT),
        kv_cache_bytes=gauge(snapshot, KV_CACHE_BYTES),
        cancelled=gauge(snapshot, names.ENGINE_CANCELLED),
    )


def wait_for_drain(metrics_url: str, timeout: float) -> tuple[EngineState | None, float]:
    """Poll the metrics until nothing runs or waits (or ``timeout``): the last state read and
    how long it took."""
    began = time.monotonic()
    state: EngineState | None = None
    while True:
        with contextlib.suppress(OSError, ValueError):
            state = engine_state(metrics_url)
        idle = state is not None and not state.running and not state.pending
        elapsed = time.monotonic() - began
        if idle or elapsed > timeout:
            return state, elapsed
        time.sleep(0.5)


# --- the stub-kill drill -------------------------------------------------------------------


def find_stub(server: psutil.Process, model: str = ENGINE_MODEL) -> psutil.Process | None:
    """The python-backend stub serving ``model``: a child of tritonserver whose command line
    runs ``triton_python_backend_stub <repository>/<model>/<version>/model.py ... <model>_0_0``.
    """
    marker = f"/{model}/"
    for child in server.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if not cmdline or STUB_BINARY not in cmdline[0]:
                continue
            model_py = next((a for a in cmdline if a.endswith("model.py")), "")
            instance = any(a.startswith(f"{model}_") for a in cmdline[1:])
            if marker in model_py or instance:
                return child
    return None


def http_status(url: str, timeout: float = 2.0) -> str:
    """A readiness endpoint's answer as text: "200", "400 <body>", or "no answer (...)"."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.status)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        return f"{exc.code} {body}".strip()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer ({reason})"
