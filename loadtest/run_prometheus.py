"""``make prometheus``: a Prometheus on 127.0.0.1 that scrapes Triton's metrics port, with the
binary ``scripts/install-prometheus.sh`` installs and ``loadtest/prometheus.yml`` filled in; its
configuration and time series go to ``.prometheus/`` (the sweep runs a private one).

    python -m loadtest.run_prometheus --metrics-port 8002 --port 9090 --interval 2s
"""

from __future__ import annotations

import argparse
import shutil
import signal
import string
import sys
from pathlib import Path

from reporting.triton import ChildServer
from serving.paths import REPO_ROOT

TEMPLATE = Path(__file__).with_name("prometheus.yml")
INSTALL_HINT = "run scripts/install-prometheus.sh (make setup does) to install Prometheus"


def find_binary() -> str | None:
    return shutil.which("prometheus")


def render_config(target: str, interval: str) -> str:
    """The scrape configuration for one Triton metrics endpoint (``host:port``)."""
    unit = next(u for u in ("ms", "s", "m", "") if interval.endswith(u))
    seconds = float(interval.removesuffix(unit)) * {"ms": 0.001, "m": 60.0}.get(unit, 1.0)
    timeout = f"{round(max(0.5, min(seconds * 0.8, 10.0)) * 1000)}ms"  # whole units only
    return string.Template(TEMPLATE.read_text()).substitute(
        scrape_interval=interval, scrape_timeout=timeout, target=target
    )


class PrometheusServer(ChildServer):
    """A Prometheus child process scraping ``target``."""

    name = "prometheus"
    stop_signal = signal.SIGTERM  # Prometheus flushes its head block on TERM
    stop_timeout = 20.0
    ready_path = "/-/ready"

    def __init__(self, target: str, port: int, directory: Path, interval: str = "2s") -> None:
        self.directory = Path(directory).resolve()
        super().__init__(port, self.directory / "prometheus.log")
        self.target, self.interval = target, interval
        self.config_file = self.directory / "prometheus.yml"

    def start(self) -> PrometheusServer:
        if (binary := find_binary()) is None:
            raise FileNotFoundError(f"no `prometheus` on PATH: {INSTALL_HINT}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(render_config(self.target, self.interval))
        command = [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            "--storage.tsdb.retention.time=7d",
            "--web.enable-lifecycle",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        return self.spawn(command, cwd=self.directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--metrics-port", type=int, default=8002, help="Triton's metrics port")
    parser.add_argument("--port", type=int, default=9090, help="Prometheus' own port")
    parser.add_argument("--interval", default="2s", help="scrape interval, e.g. 1s, 2s")
    parser.add_argument("--directory", type=Path, default=REPO_ROOT / ".prometheus")
    args = parser.parse_args(argv)
    target = f"{args.metrics_host}:{args.metrics_port}"
    server = PrometheusServer(target, args.port, args.directory, args.interval)
    try:
        server.start().wait_ready()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        print(f"prometheus: {exc}", file=sys.stderr)
        server.stop()
        return 1

    def shutdown(signum: int, _frame: object) -> None:
        # only signal: this interrupts process.wait() below, which holds the Popen's wait lock,
        # so waiting again here would deadlock
        if server.process is not None and server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    print(
        f"Prometheus is ready (Ctrl-C stops it): {server.url}, scraping http://{target}/metrics "
        f"every {args.interval}; data in {server.directory}; the load test finds it there (or "
        f"set PROMETHEUS_URL={server.url})",
        flush=True,
    )
    code = server.process.wait() if server.process else 1
    return 0 if code in (0, -signal.SIGTERM) else code


if __name__ == "__main__":
    sys.exit(main())
