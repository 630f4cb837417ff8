"""Run a real Prometheus server that scrapes Triton's metrics port (``make prometheus``).

The binary is the one ``scripts/install-prometheus.sh`` installs (Debian's ``prometheus``
package). Its configuration is rendered from ``loadtest/prometheus.yml`` into the data folder
(``.prometheus/`` by default, ignored by git), it listens on 127.0.0.1 only, and it keeps its
time series under ``.prometheus/data``. The load test and its integration test use the
:class:`PrometheusServer` class to run a private one on a free port.

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
    """The ``prometheus`` executable on PATH (Debian installs it as /usr/bin/prometheus)."""
    return shutil.which("prometheus")


def _seconds(interval: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if interval.endswith(unit):
            return float(interval[: -len(unit)]) * units[unit]
    return float(interval)


def render_config(target: str, interval: str) -> str:
    """The scrape configuration for one Triton metrics endpoint (``host:port``)."""
    seconds = _seconds(interval)
    timeout = f"{round(max(0.5, min(seconds * 0.8, 10.0)) * 1000)}ms"  # whole units only
    return string.Template(TEMPLATE.read_text()).substitute(
        scrape_interval=interval, scrape_timeout=timeout, target=target
    )


class PrometheusServer(ChildServer):
    """A Prometheus child process scraping ``target``: start, wait until ready, stop."""

    name = "prometheus"
    stop_signal = signal.SIGTERM  # Prometheus flushes its head block on TERM
    stop_timeout = 20.0
    ready_path = "/-/ready"

    def __init__(
        self,
        target: str,
        port: int = 9090,
        directory: Path | None = None,
        interval: str = "2s",
        retention: str = "7d",
    ) -> None:
        self.directory = Path(directory or REPO_ROOT / ".prometheus").resolve()
        super().__init__(port, self.directory / "prometheus.log")
        self.target, self.interval, self.retention = target, interval, retention

    @property
    def config_file(self) -> Path:
        return self.directory / "prometheus.yml"

    def command(self, binary: str) -> list[str]:
        return [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]

    def start(self) -> PrometheusServer:
        binary = find_binary()
        if binary is None:
            raise FileNotFoundError(f"no `prometheus` on PATH: {INSTALL_HINT}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(render_config(self.target, self.interval))
        return self.spawn(self.command(binary), cwd=self.directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics-host", default="127.0.0.1", help="Triton's metrics host")
    parser.add_argument("--metrics-port", type=int, default=8002, help="Triton's metrics port")
    parser.add_argument("--port", type=int, default=9090, help="Prometheus' own port")
    parser.add_argument("--interval", default="2s", help="scrape interval, e.g. 1s, 2s")
    parser.add_argument("--directory", type=Path, default=REPO_ROOT / ".prometheus")
    args = parser.parse_args(argv)

    server = PrometheusServer(
        f"{args.metrics_host}:{args.metrics_port}", args.port, args.directory, args.interval
    )
    try:
        server.start()
        server.wait_ready()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        print(f"prometheus: {exc}", file=sys.stderr)
        server.stop()
        return 1

    def shutdown(signum: int, _frame: object) -> None:
        # Only signal here: this handler interrupts process.wait() below, which holds the
        # Popen's wait lock, so waiting again in the handler would deadlock.
        if server.process is not None and server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    print(
        f"Prometheus is ready (Ctrl-C stops it): {server.url}\n"
        f"  scraping http://{server.target}/metrics every {args.interval}\n"
        f"  config {server.config_file}, data {server.directory / 'data'}\n"
        f"  the load test finds it there (or set PROMETHEUS_URL={server.url})",
        flush=True,
    )
    code = server.process.wait() if server.process else 1
    return 0 if code in (0, -signal.SIGTERM) else code


if __name__ == "__main__":
    sys.exit(main())
