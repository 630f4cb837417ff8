"""Run the ``tritonserver`` binary that ships inside the ``nvidia-pytriton`` wheel.

No PyTriton Python API is involved: the wheel is only where the server, its python backend and
the backend stubs come from. Two things make the python backend use this project's environment:
the stub for the running interpreter's version is put next to the backend, and this
interpreter's ``bin`` goes first on PATH, which is how the embedded interpreter finds (and
activates) the virtual environment that has torch, transformers and this project installed.

    python -m serving.triton --model-repository model_repository --http-port 8000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from serving.paths import MODEL_REPOSITORY, TRITON_WORKDIR, checkpoint_dir
from serving.process import ManagedServer, port_in_use, spawn_tied


def _distribution() -> tuple[Path, Path]:
    """(tritonserver folder, bundled shared libraries) inside the nvidia-pytriton wheel."""
    try:
        from pytriton.utils.distribution import get_libs_path, get_root_module_path
    except ImportError:
        sys.exit("nvidia-pytriton is not installed: run `make setup` first")
    return get_root_module_path() / "tritonserver", Path(get_libs_path())


def prepare_runtime(workdir: Path) -> Path:
    """A copy of the server with the python backend stub for this interpreter (made once)."""
    dist, _ = _distribution()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    runtime = workdir / f"tritonserver-py{version}"
    stub = runtime / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.copytree(dist, runtime, ignore=shutil.ignore_patterns("python_backend_stubs"))
        source = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not source.exists():
            sys.exit(f"the Triton wheel has no python backend stub for Python {version}")
        shutil.copy2(source, stub)
    return runtime


def server_environment() -> dict[str, str]:
    _, libs = _distribution()
    env = dict(os.environ)
    lib_dirs = [sysconfig.get_config_var("LIBDIR") or "", str(libs)]
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(d for d in lib_dirs if d)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


class TritonServer(ManagedServer):
    """A tritonserver child process: start, wait until ready, stop. Also a context manager."""

    name = "tritonserver"
    stop_signal = signal.SIGINT  # Triton's own graceful shutdown
    ready_timeout = 300.0

    def __init__(
        self,
        model_repository: Path,
        ports: Ports | None = None,
        workdir: Path | None = None,
        log_file: Path | None = None,
        extra_args: list[str] | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.ports = ports or Ports()
        self.address = address  # where the server listens; 0.0.0.0 for every interface
        self.workdir = Path(workdir or TRITON_WORKDIR)
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        """The address a client on this machine reaches the server at."""
        return "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def command(self) -> list[str]:
        runtime = prepare_runtime(self.workdir)
        return [
            str(runtime / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={runtime / 'backends'}",
            f"--cache-directory={runtime / 'caches'}",
            f"--http-address={self.address}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={self.address}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.address}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--metrics-interval-ms=1000",
            "--exit-on-error=true",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        if not (self.model_repository / "ensemble").is_dir():
            raise FileNotFoundError(
                f"{self.model_repository} is not this project's model repository"
            )
        busy = [port for port in vars(self.ports).values() if port_in_use(port, self.host)]
        if busy:
            raise RuntimeError(
                f"port(s) {busy} already in use: another server is running; stop it or choose "
                "other ports (HTTP_PORT=, GRPC_PORT=, METRICS_PORT=)"
            )
        stdout = open(self.log_file, "ab") if self.log_file else None  # noqa: SIM115
        self.process = spawn_tied(self.command(), stdout, env=server_environment())
        return self

    @property
    def ready_url(self) -> str:
        return f"http://{self.host}:{self.ports.http}/v2/health/ready"

    @property
    def log_hint(self) -> str:
        return f"; see {self.log_file}" if self.log_file else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--address",
        default=os.environ.get("TRITON_ADDRESS", "127.0.0.1"),
        help="interface to listen on: 127.0.0.1 (default, this machine only) or 0.0.0.0 (all; "
        "what the images and Kubernetes use); $TRITON_ADDRESS",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for ready")
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help=f"make the server's runtime copy ({TRITON_WORKDIR}; $CODEGEN_RUNTIME_DIR) and exit, "
        "e.g. while building an image whose root filesystem is read-only at run time",
    )
    parser.add_argument("extra", nargs="*", help="more tritonserver flags, after --")
    args = parser.parse_args(argv)
    if args.prepare_only:
        print(f"tritonserver runtime ready at {prepare_runtime(TRITON_WORKDIR)}")
        return 0

    checkpoint = checkpoint_dir(args.model_repository) / "config.json"
    if not checkpoint.exists():
        print(f"no model at {checkpoint.parent}: run `make model` first", file=sys.stderr)
        return 2
    server = TritonServer(
        args.model_repository,
        Ports(args.http_port, args.grpc_port, args.metrics_port),
        extra_args=args.extra,
        address=args.address,
    )
    print(f"starting tritonserver on {args.model_repository} ...", flush=True)
    try:
        server.start()
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 1

    stopping: list[float] = []  # when the first signal came

    def shutdown(signum: int, _frame: object) -> None:
        """Only signal the child here; the main loop below waits for it (no wait() in here)."""
        if not stopping:
            print(f"\n{signal.Signals(signum).name}: stopping tritonserver ...", flush=True)
            stopping.append(time.monotonic())
            server.process.send_signal(signal.SIGINT)  # Triton's graceful shutdown
        else:
            print("second signal: killing tritonserver", flush=True)
            server.process.kill()

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    try:
        server.wait_ready(args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        if stopping:
            return _wait_for_exit(server, stopping)
        print(f"tritonserver failed to start: {exc}", file=sys.stderr)
        server.stop()
        return 1
    print(
        "\nTriton is ready (Ctrl-C stops it):\n"
        f"  HTTP     http://{server.http_url}   (e.g. /v2/models/ensemble)\n"
        f"  gRPC     {server.grpc_url}\n"
        f"  metrics  {server.metrics_url}\n"
        + (
            "  listening on every interface (--address 0.0.0.0)\n"
            if args.address == "0.0.0.0"
            else ""
        ),
        flush=True,
    )
    return _wait_for_exit(server, stopping, stubs=model_stubs(server.process.pid))


STUB_EXIT_CODE = 3  # the launcher's exit code when a model's stub died
STUB_DEATH_GRACE = 10.0  # seconds a server with a dead stub gets to stop before it is killed


def model_stubs(server_pid: int) -> dict[int, str]:
    """The python-backend stub processes of a running tritonserver: pid -> model name.

    A stub's command line holds its model's path (``<repository>/<model>/<version>/model.py``).
    """
    stubs = {}
    for child in psutil.Process(server_pid).children():
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if command and command[0].endswith("triton_python_backend_stub") and len(command) > 1:
            stubs[child.pid] = Path(command[1]).parent.parent.name
    return stubs


def _dead_stub(stubs: dict[int, str]) -> str | None:
    for pid, model in stubs.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            pass
        return model
    return None


def _wait_for_exit(
    server: TritonServer,
    stopping: list[float],
    grace: float = 60.0,
    stubs: dict[int, str] | None = None,
) -> int:
    """Poll (rather than block in wait(), which a signal handler could deadlock) until the
    server exits; kill it if it outlives ``grace`` seconds after a stop signal.

    Triton 2.51 neither restarts a model's python-backend stub that died nor stops saying
    ready, so the launcher watches the stubs: when one dies (a crash, the OOM killer, an engine
    that failed for good and exited), it stops the server and exits with STUB_EXIT_CODE, so that
    a supervisor (Kubernetes, compose's restart policy, systemd) starts a healthy one.
    """
    died = None
    while server.process.poll() is None:
        time.sleep(0.2)
        if stubs and not stopping and (died := _dead_stub(stubs)):
            print(
                f"the {died!r} model's python-backend stub died: stopping tritonserver so that "
                "a supervisor restarts it (see the log above for why it died)",
                file=sys.stderr,
                flush=True,
            )
            stopping.append(time.monotonic())
            server.process.send_signal(signal.SIGINT)
        # a server with a dead stub cannot finish its in-flight requests: do not wait for them
        limit = STUB_DEATH_GRACE if died else grace
        if stopping and time.monotonic() - stopping[0] > limit:
            print(f"tritonserver still running {limit:.0f}s after the signal: killing it")
            server.process.kill()
    if died:
        return STUB_EXIT_CODE
    code = server.process.returncode
    return 0 if stopping and code in (0, -signal.SIGINT, -signal.SIGKILL) else code


if __name__ == "__main__":
    sys.exit(main())
