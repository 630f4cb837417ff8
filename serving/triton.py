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
    Stopping,
    Watchdog,
    has_stubs,
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


STOP_GRACE_S = 10  # a healthy server's time to finish its requests: its --exit-timeout-secs
EXIT_MARGIN_S = 10.0  # past its exit timeout, the time it gets to exit before it is ended
HUNG_PROBE_S = 2.0  # a server that does not answer /v2/health/live this fast when told to stop


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
        self.stop_note: str | None = None  # why the last stop ended the server, if it did

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
            f"--exit-timeout-secs={STOP_GRACE_S}",
            *self.extra_args,
        ]

    @property
    def exit_timeout(self) -> float:
        """Seconds tritonserver gives requests in flight after a stop signal (a later
        ``--exit-timeout-secs`` among the extra flags wins, as in tritonserver)."""
        value: float = STOP_GRACE_S
        for at, flag in enumerate(self.extra_args):
            if flag.startswith("--exit-timeout-secs="):
                value = float(flag.split("=", 1)[1])
            elif flag == "--exit-timeout-secs" and at + 1 < len(self.extra_args):
                value = float(self.extra_args[at + 1])
        return value

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

    def answers_now(self) -> bool:
        """Whether the server answers at all now: asked before the stop signal, since Triton
        2.51 closes its HTTP endpoint as soon as it gets one."""
        return answers(self.live_url, timeout=HUNG_PROBE_S)

    def signal_stop(self, grace: float | None = None, likely: str = "") -> Stopping:
        """Send Triton's graceful stop; what to watch until it exits (see Stopping), and
        what most likely holds it should it not exit within ``grace`` seconds."""
        assert self.process is not None
        had_stubs = has_stubs(self.process.pid)
        self.process.send_signal(self.stop_signal)
        stopping = Stopping(self.process.pid, self.exit_timeout + EXIT_MARGIN_S, had_stubs)
        if grace is not None:
            stopping.grace_s = grace
        if likely:
            stopping.likely = likely
        return stopping

    def stop(self, timeout: float | None = None) -> int | None:
        """Triton's graceful stop (at most ``timeout`` seconds, by default its exit timeout and
        a margin); a server that does not answer, or that only waits on open gRPC streams, is
        ended (``stop_note`` says why). Its stubs never outlive it."""
        if self.process is None:
            return None
        self.stop_note = None
        if self.process.poll() is None:
            if not self.answers_now():
                self.stop_note = "tritonserver did not answer when told to stop: killed"
            else:
                stopping = self.signal_stop(timeout)
                while self.process.poll() is None:
                    try:
                        self.process.wait(0.5)
                    except subprocess.TimeoutExpired:
                        if note := stopping.why_end():
                            self.stop_note = note
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

    stop = StopRequest()

    def shutdown(signum: int, _frame: object) -> None:
        """Only note the request here; the main loop below acts on it (no wait() in here). A
        server still starting is sent its signal at once: there is nothing to probe yet."""
        if stop.since is None:
            print(f"\n{signal.Signals(signum).name}: stopping tritonserver ...", flush=True)
            stop.since = time.monotonic()
            if not stop.serving:
                stop.signalled = True
                server.process.send_signal(signal.SIGINT)  # Triton's graceful shutdown
        else:
            print("second signal: killing tritonserver", flush=True)
            server.process.kill()

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    try:
        server.wait_ready(args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        if stop.since is not None:
            return _wait_for_exit(server, stop)
        print(f"tritonserver failed to start: {exc}", file=sys.stderr)
        server.stop()
        return 1
    stop.serving = True
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
    return _wait_for_exit(server, stop, watchdog=watchdog)


STUB_DEATH_GRACE = 10.0  # seconds a server with a dead stub gets to stop before it is killed


@dataclass
class StopRequest:
    """A stop signal the launcher got, shared by its signal handler and its main loop."""

    since: float | None = None  # when the first signal came
    serving: bool = False  # the server said ready (before that the handler signals it itself)
    signalled: bool = False  # tritonserver was sent its stop signal


def _wait_for_exit(
    server: TritonServer, stop: StopRequest, watchdog: Watchdog | None = None
) -> int:
    """Poll (rather than block in wait(), which a signal handler could deadlock) until the
    server exits, and leave no process behind.

    While it serves, the watchdog (serving/watchdog.py) checks the server, its stubs and its
    liveness endpoint: a dead stub gets the server stopped, a hung server is killed at once,
    and the launcher exits with the fault's code so that a supervisor (Kubernetes, compose's
    restart policy, systemd) starts a healthy one. On a stop signal a server that does not
    answer is killed at once; one that does gets Triton's graceful stop and its exit timeout,
    and is ended only when all that is left is Triton waiting on clients (``Stopping``).
    """
    fault: Fault | None = None
    stopping: Stopping | None = None
    while server.process.poll() is None:
        time.sleep(0.2)
        if watchdog and stop.since is None and (fault := watchdog.check()):
            print(fault.message, file=sys.stderr, flush=True)
            stop.since, stop.signalled = time.monotonic(), True
            if fault.exit_code == HUNG_EXIT_CODE:
                break
            stopping = server.signal_stop(STUB_DEATH_GRACE, likely="the dead stub")
        elif stop.since is not None and not stop.signalled:
            stop.signalled = True
            if not server.answers_now():
                print(
                    "tritonserver does not answer while stopping: killing it (it did not "
                    f"answer {server.live_url} within {HUNG_PROBE_S:.0f} s: hung)",
                    flush=True,
                )
                break
            stopping = server.signal_stop()
        elif stop.signalled and stopping is None:  # signalled by the handler while starting
            stopping = Stopping(server.process.pid, server.exit_timeout + EXIT_MARGIN_S, False)
        if stopping and (why := stopping.why_end()):
            print(why, flush=True)
            break
    kill_server_tree(server.process.pid)  # its stubs too, should any have outlived it
    code = server.process.wait()
    if fault:
        return fault.exit_code
    if stop.since is None:
        print(f"tritonserver exited on its own with code {code}", file=sys.stderr, flush=True)
        return DIED_EXIT_CODE
    if code == 0:
        print("tritonserver stopped (exit code 0)", flush=True)
    return 0 if code in (0, -signal.SIGINT, -signal.SIGKILL) else code


if __name__ == "__main__":
    sys.exit(main())
