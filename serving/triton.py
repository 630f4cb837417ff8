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

from serving.paths import MODEL_REPOSITORY, TRITON_WORKDIR, checkpoint_dir
from serving.process import ManagedServer, answers, port_in_use, spawn_tied
from serving.watchdog import (
    DIED_EXIT_CODE,
    HUNG_EXIT_CODE,
    Fault,
    Watchdog,
    kill_server_tree,
    model_stubs,
)


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


STOP_GRACE_S = 10.0  # a healthy server's time to finish its requests after a stop signal


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
    def live_url(self) -> str:
        return f"http://{self.host}:{self.ports.http}/v2/health/live"

    def stop(self, timeout: float | None = None) -> int | None:
        """Triton's graceful stop, for at most ``timeout`` seconds (STOP_GRACE_S), cut short
        when it stops answering HTTP (a hung server); then it and its stubs are killed."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            deadline = time.monotonic() + (STOP_GRACE_S if timeout is None else timeout)
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    self.process.wait(1.0)
                except subprocess.TimeoutExpired:
                    if not answers(self.ready_url, timeout=2.0):
                        break
        kill_server_tree(self.process.pid)
        return self.process.wait()

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
    watchdog = Watchdog(server.process.pid, server.live_url, stubs=model_stubs(server.process.pid))
    return _wait_for_exit(server, stopping, watchdog=watchdog)


STUB_DEATH_GRACE = 10.0  # seconds a server with a dead stub gets to stop before it is killed


def _wait_for_exit(
    server: TritonServer,
    stopping: list[float],
    grace: float = STOP_GRACE_S,
    watchdog: Watchdog | None = None,
) -> int:
    """Poll (rather than block in wait(), which a signal handler could deadlock) until the
    server exits, and leave no process behind.

    While it serves, the watchdog (serving/watchdog.py) checks the server, its stubs and its
    liveness endpoint: a dead stub gets the server stopped, a hung server is killed at once,
    and the launcher exits with the fault's code so that a supervisor (Kubernetes, compose's
    restart policy, systemd) starts a healthy one. After a stop signal a server that answers
    gets ``grace`` seconds; one that no longer answers HTTP is killed at once.
    """
    fault: Fault | None = None
    next_answer_check = 0.0
    while server.process.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        if watchdog and not stopping and (fault := watchdog.check()):
            print(fault.message, file=sys.stderr, flush=True)
            stopping.append(now)
            if fault.exit_code == HUNG_EXIT_CODE:
                kill_server_tree(server.process.pid)
            else:
                server.process.send_signal(signal.SIGINT)
        if not stopping:
            continue
        limit = STUB_DEATH_GRACE if fault else grace
        if now - stopping[0] > limit:
            print(f"tritonserver still running {limit:.0f}s after the signal: killing it")
            kill_server_tree(server.process.pid)
        elif watchdog and now >= next_answer_check:
            next_answer_check = now + 1.0
            if not answers(server.ready_url, timeout=2.0):
                print("tritonserver does not answer while stopping: killing it", flush=True)
                kill_server_tree(server.process.pid)
    kill_server_tree(server.process.pid)  # its stubs too, should any have outlived it
    if fault:
        return fault.exit_code
    code = server.process.returncode
    if not stopping:
        print(f"tritonserver exited on its own with code {code}", file=sys.stderr, flush=True)
        return DIED_EXIT_CODE
    return 0 if code in (0, -signal.SIGINT, -signal.SIGKILL) else code


if __name__ == "__main__":
    sys.exit(main())
