"""``make loadtest``: a Locust sweep over output lengths against the served ensemble.

For each output length: start the users, warm up, then read Triton's metrics and reset Locust's
statistics at the same moment (the window opens), run for the duration, and read both again
(the window closes). Both count a request when it completes, so Locust's requests and Triton's
ensemble count over the window agree. Then an optional streaming phase (time to first token and
inter-token latency under the same load), stop, let the server drain, and take the same
window's figures from Prometheus when one is reachable.

Locust runs in this process through its Python API (one Environment per length): that is what
lets the window open and close exactly. The users are those of ``loadtest/locustfile.py``.

    python -m loadtest.sweep --lengths 8,32,128,512 --users 16 --duration 100 --protocol http \\
        --host localhost:8000
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

# Importing locust monkey-patches the process with gevent. The standard-library modules above do
# not load ssl, so the patching is clean; every wait below is then cooperative.
import gevent
from locust.env import Environment
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV, StatsCSVFileWriter, StatsEntry

from client.contract import ENSEMBLE_MODEL, MODEL_STAGE, STREAM_MODEL
from engine import metrics as names
from loadtest import locustfile, openai_protocol
from loadtest.metrics import (
    Deltas,
    Snapshot,
    agreement,
    busy_shares,
    execution_busy_us,
    read_snapshot,
    snapshot_deltas,
    window_figures,
)
from loadtest.prom import PromSource
from loadtest.report import write_report
from loadtest.run_prometheus import INSTALL_HINT, PrometheusServer, find_binary
from serving.triton import REPO_ROOT, Ports, TritonServer

DEFAULTS = {  # sized for a 2-core machine and the default model: ~10 minutes for 4 lengths
    "lengths": "8,32,128,512",
    "users": 16,
    "duration": 100.0,
    "warmup": 12.0,
    "stream_users": 2,
    "stream_duration": 10.0,
}
QUICK = {  # --quick: a smoke run for tests and a first look (~1 minute)
    "lengths": "8,32",
    "users": 4,
    "duration": 6.0,
    "warmup": 3.0,
    "stream_users": 1,
    "stream_duration": 3.0,
}
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def log(message: str) -> None:
    print(f"[loadtest] {message}", flush=True)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class SweepConfig:
    lengths: list[int]
    users: int
    duration: float
    warmup: float
    protocol: str
    host: str  # host:port of Triton's HTTP endpoint
    grpc_url: str
    metrics_url: str
    stream_users: int
    stream_duration: float
    prompts: int
    prompt_seed: int
    out: Path
    prometheus: str
    agreement_tolerance: float
    model_repository: Path
    progress_every: float
    drain_timeout: float = 180.0
    api_url: str | None = None  # PROTOCOL=openai: the API the sweep started (its users' host)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}"


def parse_args(argv: list[str] | None = None) -> SweepConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", help=f"output lengths, e.g. {DEFAULTS['lengths']}")
    parser.add_argument("--users", type=int, help=f"concurrent users ({DEFAULTS['users']})")
    parser.add_argument("--duration", type=float, help="measured seconds per length (100)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per length (12)")
    parser.add_argument("--protocol", choices=("http", "grpc", "openai"), default="http")
    parser.add_argument("--host", default="localhost:8000", help="Triton's HTTP host:port")
    parser.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    parser.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    parser.add_argument("--stream-users", type=int, help="streaming users, 0 = none (2)")
    parser.add_argument("--stream-duration", type=float, help="streaming phase seconds (10)")
    parser.add_argument("--prompts", type=int, default=300, help="distinct code prompts")
    parser.add_argument("--prompt-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="run folder (loadtest/results/<time>-<proto>)")
    parser.add_argument(
        "--prometheus",
        default="auto",
        help="auto: $PROMETHEUS_URL or http://127.0.0.1:9090 if it scrapes this Triton, else a "
        "private Prometheus if installed; off; or a Prometheus URL",
    )
    parser.add_argument(
        "--agreement-tolerance",
        type=float,
        default=0.10,
        help="relative difference allowed between the direct reading and Prometheus, before "
        "the allowance for one wave of completions at each window edge",
    )
    parser.add_argument("--model-repository", type=Path, default=REPO_ROOT / "model_repository")
    parser.add_argument("--quick", action="store_true", help="a short run: " + str(QUICK))
    parser.add_argument("--progress-every", type=float, help="seconds between progress lines")
    args = parser.parse_args(argv)

    preset = QUICK if args.quick else DEFAULTS

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return preset[name] if value is None else value

    host = args.host.removeprefix("http://").removeprefix("https://").rstrip("/")
    hostname, _, port = host.rpartition(":")
    if not hostname or not port.isdigit():
        parser.error(f"--host must be host:port, got {args.host!r}")
    http_port = int(port)
    lengths = [int(x) for x in str(pick("lengths")).split(",") if x.strip()]
    if not lengths or min(lengths) < 1:
        parser.error("--lengths must be positive integers")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return SweepConfig(
        lengths=lengths,
        users=pick("users"),
        duration=pick("duration"),
        warmup=pick("warmup"),
        protocol=args.protocol,
        host=host,
        grpc_url=args.grpc_url or f"{hostname}:{http_port + 1}",
        metrics_url=args.metrics_url or f"http://{hostname}:{http_port + 2}/metrics",
        stream_users=pick("stream_users"),
        stream_duration=pick("stream_duration"),
        prompts=args.prompts,
        prompt_seed=args.prompt_seed,
        out=args.out or REPO_ROOT / "loadtest" / "results" / f"{stamp}-{args.protocol}",
        prometheus=args.prometheus,
        agreement_tolerance=args.agreement_tolerance,
        model_repository=args.model_repository,
        progress_every=args.progress_every or (2.0 if args.quick else 10.0),
    )


# --- the server ----------------------------------------------------------------------------


def _get_json(url: str, timeout: float = 5.0) -> Any:
    import urllib.request  # here, not above: it loads ssl, which gevent must patch first

    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def _ready(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def ensure_server(config: SweepConfig) -> TritonServer | None:
    """Use the Triton at --host, or start one there on the model repository (returned, so the
    sweep stops it at the end) when none is running and the host is this machine."""
    ready_url = f"{config.http_url}/v2/health/ready"
    if _ready(ready_url):
        log(f"using the Triton server at {config.host}")
        return None
    hostname, _, port = config.host.rpartition(":")
    if hostname not in LOCAL_HOSTS:
        raise SystemExit(f"no Triton server answers at {config.host}")
    if _port_open("127.0.0.1", int(port)):
        log(f"a server is starting at {config.host}; waiting for it to be ready")
        deadline = time.monotonic() + 600
        while not _ready(ready_url):
            if time.monotonic() > deadline:
                raise SystemExit(f"the server at {config.host} did not become ready")
            time.sleep(1)
        return None
    checkpoint = config.model_repository / MODEL_STAGE / "1" / "checkpoint" / "config.json"
    if not checkpoint.exists():
        raise SystemExit(f"no model at {checkpoint.parent}: run `make model` first")
    grpc_port = int(config.grpc_url.rpartition(":")[2])
    metrics_port = int(config.metrics_url.split("://")[-1].split("/")[0].rpartition(":")[2])
    log_file = config.out / "tritonserver.log"
    server = TritonServer(
        config.model_repository, Ports(int(port), grpc_port, metrics_port), log_file=log_file
    )
    log(f"starting Triton on {config.model_repository} (log: {log_file}) ...")
    server.start()
    try:
        server.wait_ready(timeout=600)
    except BaseException:
        server.stop()
        raise
    log("Triton is ready")
    return server


def model_ready(config: SweepConfig, model: str) -> bool:
    return _ready(f"{config.http_url}/v2/models/{model}/ready")


# --- Prometheus ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_prometheus(
    config: SweepConfig,
) -> tuple[PromSource | None, PrometheusServer | None, str]:
    """(source to query, private server we started, a sentence saying which was chosen)."""
    if config.prometheus == "off":
        return None, None, "Prometheus: off (--prometheus off)"
    url = config.prometheus
    if url == "auto":
        url = os.environ.get("PROMETHEUS_URL") or "http://127.0.0.1:9090"
    source = PromSource(url)
    if source.reachable():
        instance = source.find_instance(config.metrics_url)
        if instance:
            source.instance = instance
            return source, None, f"Prometheus at {url} (target {instance})"
        note = f"the Prometheus at {url} does not scrape {config.metrics_url}"
        if config.prometheus != "auto":
            raise SystemExit(note)
        log(note + "; starting a private one")
    elif config.prometheus != "auto":
        raise SystemExit(f"no Prometheus answers at {url}")
    if find_binary() is None:
        return None, None, f"Prometheus: not installed, skipped ({INSTALL_HINT})"
    netloc = config.metrics_url.split("://")[-1].split("/")[0]
    hostname, _, port = netloc.rpartition(":")
    target = f"{'127.0.0.1' if hostname in LOCAL_HOSTS else hostname}:{port}"
    server = PrometheusServer(
        target,
        port=_free_port(),
        directory=Path(tempfile.mkdtemp(prefix="loadtest-prometheus-")),
        interval="1s",
    )
    server.start()
    server.wait_ready()
    source = PromSource(server.url, instance=target)
    deadline = time.monotonic() + 20  # a few scrapes first: windows are aligned to them
    while (
        time.monotonic() < deadline and len(source.scrape_times(time.time() - 10, time.time())) < 3
    ):
        time.sleep(0.5)
    return (
        source,
        server,
        f"private Prometheus at {server.url} scraping {target} every 1s",
    )


# --- one output length ---------------------------------------------------------------------


def _entry_figures(entry: StatsEntry, window_s: float) -> dict[str, Any]:
    n = entry.num_requests

    def pct(p: float) -> float | None:
        return float(entry.get_response_time_percentile(p)) if n else None

    return {
        "requests": n,
        "failures": entry.num_failures,
        "rps": n / window_s if window_s > 0 else None,
        "latency_ms": {
            "mean": entry.avg_response_time if n else None,
            "p50": pct(0.5),
            "p90": pct(0.9),
            "p95": pct(0.95),
            "p99": pct(0.99),
            "max": entry.max_response_time if n else None,
        },
    }


def _write_tables(environment: Environment, base: str) -> list[str]:
    """Locust's per-name tables as they stand now (the end of the window)."""
    tables = StatsCSV(environment, PERCENTILES_TO_REPORT)
    written = []
    for suffix, write in (
        ("_stats.csv", tables.requests_csv),
        ("_failures.csv", tables.failures_csv),
        ("_exceptions.csv", tables.exceptions_csv),
    ):
        with open(base + suffix, "w", newline="") as handle:
            write(csv.writer(handle))
        written.append(Path(base + suffix).name)
    return written


def _activity(snapshot: Snapshot) -> tuple[float, float, float]:
    """What moves while requests are in flight: queued ensemble requests, ensemble completions
    and engine steps (all engines). Idle when it stops changing and nothing is queued."""
    return (
        snapshot.value(names.PENDING_REQUEST_COUNT, model=ENSEMBLE_MODEL),
        snapshot.value(names.INFERENCE_COUNT, model=ENSEMBLE_MODEL),
        snapshot.value(names.ENGINE_STEPS),
    )


class Recorder:
    """Every request of one length with its completion time: the time series, and the live
    rate shown in the progress lines."""

    def __init__(self) -> None:
        self.origin = time.time()
        self.records: list[tuple[float, str, float, int, bool]] = []

    def __call__(
        self, name: str, response_time: float, response_length: int, exception=None, **_: Any
    ) -> None:
        failed = exception is not None
        self.records.append(
            (time.time() - self.origin, name, response_time, response_length or 0, failed)
        )

    def live(self, seconds: float, name: str) -> tuple[float, float | None]:
        """(completions/s, median response time in ms) over the last ``seconds``."""
        since = time.time() - self.origin - seconds
        recent = [r[2] for r in reversed(self.records[-5000:]) if r[1] == name and r[0] >= since]
        median = sorted(recent)[len(recent) // 2] if recent else None
        return len(recent) / seconds, median

    def write(self, path: Path) -> None:
        with open(path, "w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(["t_s", "name", "response_time_ms", "response_length", "failed"])
            out.writerows(
                (f"{t:.3f}", name, f"{ms:.1f}", size, int(failed))
                for t, name, ms, size, failed in self.records
            )


EDGE_S = 0.15  # the direct reading brackets Prometheus' scrapes by this much at each end


class Sweep:
    def __init__(self, config: SweepConfig, prom: PromSource | None, stream: bool) -> None:
        self.config = config
        self.prom = prom
        self.stream = stream
        self.per_length = (
            config.warmup + config.duration + (config.stream_duration if stream else 0)
        )

    def _user_class(self) -> type:
        if self.config.protocol == "grpc":
            return locustfile.GrpcEnsembleUser
        if self.config.protocol == "openai":
            return openai_protocol.OpenAIUser
        return locustfile.HttpEnsembleUser

    def _options(self, length: int) -> argparse.Namespace:
        c = self.config
        return argparse.Namespace(
            output_len=length, prompts=c.prompts, prompt_seed=c.prompt_seed, grpc_url=c.grpc_url
        )

    def _wait_until(
        self, deadline: float, label: str, recorder: Recorder, index: int, length_started: float
    ) -> None:
        """Sleep until ``deadline`` (Unix time), printing progress: which length and phase,
        the sweep's time left, and the live rate and median of the unary requests."""
        c = self.config
        phase_started = time.time()
        while (now := time.time()) < deadline:
            gevent.sleep(min(c.progress_every, deadline - now))
            now = time.time()
            if deadline - now < 0.05:
                break  # the phase is over: no progress line for the last few milliseconds
            left = max(0.0, self.per_length - (time.monotonic() - length_started))
            left += (len(c.lengths) - index - 1) * self.per_length
            rate, median = recorder.live(c.progress_every, ENSEMBLE_MODEL)
            failures = sum(r[4] for r in recorder.records)
            log(
                f"length {c.lengths[index]} ({index + 1}/{len(c.lengths)}) {label:<7} "
                f"{now - phase_started:4.0f}/{deadline - phase_started:.0f}s | sweep ~"
                f"{_duration(left)} left | {rate:6.2f} req/s now | median "
                f"{'-' if median is None else f'{median:.0f}'} ms | {failures} failures"
            )

    def _execution_busy(self) -> dict[str, float]:
        """Execution time per model from Triton's statistics API (see execution_busy_us)."""
        try:
            return execution_busy_us(_get_json(f"{self.config.http_url}/v2/models/stats"))
        except Exception as exc:  # an extra figure: the sweep goes on without it
            log(f"Triton's statistics API: {exc}")
            return {}

    def _window_times(self) -> tuple[float, float]:
        """When to open and close the window: with a Prometheus, just before one of its scrapes
        and just after a later one, so that its aligned window is the direct one but for
        EDGE_S at each end; otherwise now and now + duration."""
        now, duration = time.time(), self.config.duration
        if self.prom is not None:
            try:
                scrape, interval = self.prom.next_scrape(now + 2 * EDGE_S)
            except Exception as exc:  # not fatal: the window is then simply not aligned
                log(f"Prometheus: cannot align the window to its scrapes ({exc})")
            else:
                whole = max(2, round(duration / interval)) * interval
                return scrape - EDGE_S, scrape + whole + EDGE_S
        return now, now + duration

    def run_length(self, index: int, length: int) -> dict[str, Any]:
        c = self.config
        base = str(c.out / f"len_{length:04d}")
        options = self._options(length)
        settings = locustfile.load_settings(argparse.Namespace(parsed_options=options))
        locustfile.requests_for(settings)  # build the requests before the clock starts
        if c.protocol == "http":
            locustfile.http_bodies(settings)

        env = Environment(
            user_classes=[self._user_class()], host=c.api_url or c.http_url, parsed_options=options
        )
        recorder = Recorder()
        env.events.request.add_listener(recorder)
        runner = env.create_local_runner()
        writer = StatsCSVFileWriter(env, PERCENTILES_TO_REPORT, base, full_history=True)
        writer_greenlet = gevent.spawn(writer.stats_writer)
        length_started = time.monotonic()
        log(f"length {length}: {c.users} {c.protocol} users, warm-up {c.warmup:.0f}s")
        runner.start(c.users, spawn_rate=c.users)
        self._wait_until(time.time() + c.warmup, "warm-up", recorder, index, length_started)

        opening, closing = self._window_times()
        self._wait_until(opening, "warm-up", recorder, index, length_started)
        start = read_snapshot(c.metrics_url)
        start_busy = self._execution_busy()
        env.stats.reset_all()
        reset_at = time.time()
        self._wait_until(closing, "measure", recorder, index, length_started)
        end = read_snapshot(c.metrics_url)
        end_busy = self._execution_busy()
        closed_at = time.time()
        locust_window = closed_at - reset_at
        client = _entry_figures(env.stats.total, locust_window)
        errors = {str(e.error): e.occurrences for e in env.stats.errors.values()}
        writer_greenlet.kill(block=True)
        writer.close_files()
        csv_files = [*_write_tables(env, base), Path(writer.stats_history_file_name()).name]

        stream_figures = None
        if self.stream:
            stream_figures, stream_csv = self._stream_phase(
                index, options, base, recorder, length_started
            )
            csv_files += stream_csv
        runner.quit()
        log(f"length {length}: window closed; {client['requests']} requests, draining ...")
        drained = self._drain()

        (c.out / f"len_{length:04d}_metrics_start.txt").write_text(start.text)
        (c.out / f"len_{length:04d}_metrics_end.txt").write_text(end.text)
        recorder.write(Path(f"{base}_requests.csv"))

        direct_deltas = snapshot_deltas(start, end)
        direct = window_figures(direct_deltas)
        row: dict[str, Any] = {
            "output_len": length,
            "protocol": c.protocol,
            "users": c.users,
            "window_s": direct["window_s"],
            "rps": client["rps"],
            "latency_ms": client["latency_ms"],
            "failures": client["failures"],
            "requests": client["requests"],
            "tokens_per_s": direct["tokens_per_s"],
            "tokens_per_request": direct["tokens_per_request"],
            "batch_size": direct["batch_size"],
            "engine_batch_size": direct["engine_batch_size"],
            "stage_share": direct["stage_share"],
            "queue_share": direct["queue_share"],
            "busy_share": busy_shares(start_busy, end_busy, direct["compute_us"]["model"]),
            "locust": client | {"window_s": locust_window, "errors": errors},
            "triton": direct,
            "triton_deltas": direct_deltas.as_dict(),
            "timeline": {
                "window_start_s": start.taken_at - recorder.origin,
                "window_end_s": end.taken_at - recorder.origin,
            },
            "stream": stream_figures,
            "drained": drained,
            "files": [
                *csv_files,
                f"len_{length:04d}_metrics_start.txt",
                f"len_{length:04d}_metrics_end.txt",
                Path(f"{base}_requests.csv").name,
            ],
        }
        row["prometheus"] = self._prometheus(start, end, direct, direct_deltas)
        self._log_row(row)
        return row

    def _stream_phase(
        self,
        index: int,
        options: argparse.Namespace,
        base: str,
        recorder: Recorder,
        length_started: float,
    ) -> tuple[dict[str, Any], list[str]]:
        """Streaming users beside the same unary load: TTFT and inter-token latency."""
        c = self.config
        env = Environment(
            user_classes=[locustfile.StreamingUser], host=c.http_url, parsed_options=options
        )
        runner = env.create_local_runner()
        started = time.time()
        runner.start(c.stream_users, spawn_rate=c.stream_users)
        self._wait_until(started + c.stream_duration, "stream", recorder, index, length_started)
        seconds = time.time() - started
        figures = {
            "users": c.stream_users,
            "seconds": seconds,
            **{
                key: _entry_figures(env.stats.get(name, "grpc-stream"), seconds)
                for key, name in (
                    ("ttft", locustfile.TTFT_NAME),
                    ("inter_token", locustfile.ITL_NAME),
                    ("total", locustfile.STREAM_NAME),
                )
            },
        }
        files = _write_tables(env, base + "_stream")
        runner.quit()
        return figures, files

    def _drain(self) -> bool:
        """Wait until nothing is in flight, so that the next length starts on an idle server
        (and the last leaves it idle for whoever uses it next)."""
        deadline = time.monotonic() + self.config.drain_timeout
        previous, still = None, 0
        while time.monotonic() < deadline:
            current = _activity(read_snapshot(self.config.metrics_url))
            still = still + 1 if current == previous and current[0] == 0 else 0
            if still >= 2:  # a second without progress and nothing queued
                return True
            previous = current
            gevent.sleep(0.5)
        log("the server did not drain in time; going on")
        return False

    def _prometheus(
        self,
        start: Snapshot,
        end: Snapshot,
        direct: dict[str, Any],
        direct_deltas: Deltas,
    ) -> dict[str, Any] | None:
        if self.prom is None:
            return None
        try:
            deltas, window = self.prom.window_deltas(start.taken_at, end.taken_at)
        except Exception as exc:
            log(f"Prometheus: {exc}")
            return {"error": str(exc)}
        figures = window_figures(deltas)
        requests = max(direct["requests"] or 0, 1)
        # One wave of completions (up to one per user) at each edge of the shorter window.
        tolerance = self.config.agreement_tolerance + 2 * self.config.users / requests
        # Exact: Prometheus' window lies inside the direct one and counters only grow, so no
        # counter (count or duration) may have grown more there than in the direct window.
        excess = {
            f"{metric}{{model={model}}}": value - direct_deltas.get(metric, model)
            for (metric, model), value in deltas.values.items()
            if value > direct_deltas.get(metric, model) * (1 + 1e-9) + 1e-6
        }
        return {
            "url": self.prom.url,
            "instance": self.prom.instance,
            "window": {
                "start": window.start,
                "end": window.end,
                "seconds": window.seconds,
                "scrapes": window.scrapes,
                "direct_seconds": end.taken_at - start.taken_at,
            },
            "figures": figures,
            "deltas": deltas.as_dict(),
            "agreement": agreement(direct, figures, tolerance),
            "contained": not excess,
            "excess": excess,
        }

    def _log_row(self, row: dict[str, Any]) -> None:
        lat = row["latency_ms"]
        shares = row["stage_share"]
        prom = row.get("prometheus") or {}
        agree = prom.get("agreement")
        log(
            f"length {row['output_len']}: {row['rps']:.2f} req/s, mean {lat['mean'] or 0:.0f} ms "
            f"p95 {lat['p95'] or 0:.0f} ms, {row['tokens_per_s'] or 0:.0f} tokens/s, "
            f"engine batch {row['engine_batch_size'] or 0:.1f}, "
            f"pre {100 * (shares['preprocessing'] or 0):.2f}% post "
            f"{100 * (shares['postprocessing'] or 0):.2f}% of model time, "
            f"{row['failures']} failures"
            + (
                f"; Prometheus agrees within {100 * agree['max_rel_diff']:.1f}%"
                if agree and agree["max_rel_diff"] is not None
                else ""
            )
        )


# --- the run's description -----------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": "none" if shutil.which("nvidia-smi") is None else "present",
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "locust": version("locust"),
        "tritonclient": version("tritonclient"),
    }


def model_info(config: SweepConfig) -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        info["triton_version"] = _get_json(f"{config.http_url}/v2")["version"]
        model_config = _get_json(f"{config.http_url}/v2/models/{MODEL_STAGE}/config")
        parameters = model_config.get("parameters", {})
        info["stage_parameters"] = {k: v.get("string_value") for k, v in parameters.items()}
        info["dynamic_batching"] = model_config.get("dynamic_batching")
        info["instances"] = model_config.get("instance_group")
    except Exception as exc:
        info["error"] = str(exc)
    build = config.model_repository / MODEL_STAGE / "1" / "checkpoint" / "build.json"
    if build.exists():
        data = json.loads(build.read_text())
        spec = data.get("build", {})
        info["checkpoint"] = {
            "path": str(build.parent),
            "name": data.get("name"),
            "parameters": data.get("parameters"),
            "layers": spec.get("n_layer"),
            "width": spec.get("n_embd"),
            "heads": spec.get("n_head"),
            "context": spec.get("n_positions"),
            "vocab": spec.get("vocab_size"),
            "held_out_loss": data.get("held_out_loss"),
        }
    return info


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    config.out.mkdir(parents=True, exist_ok=True)
    log(f"run folder {config.out}")
    server = ensure_server(config)
    private_prom: PrometheusServer | None = None
    api: openai_protocol.ApiProcess | None = None
    try:
        if config.protocol == "openai":
            api, address = openai_protocol.start_api(config.grpc_url, config.out)
            config.api_url = f"http://{address}"
            log(f"OpenAI-compatible API at {config.api_url} in front of {config.grpc_url}")
        if not model_ready(config, ENSEMBLE_MODEL):
            raise SystemExit(f"the `{ENSEMBLE_MODEL}` model is not ready at {config.host}")
        stream = config.stream_users > 0 and config.stream_duration > 0
        if stream and not model_ready(config, STREAM_MODEL):
            log(f"`{STREAM_MODEL}` is not served: no streaming phase")
            stream = False
        prom, private_prom, prom_note = resolve_prometheus(config)
        log(prom_note)
        sweep = Sweep(config, prom, stream)
        total = len(config.lengths) * sweep.per_length
        log(
            f"lengths {config.lengths}, {config.users} {config.protocol} users, "
            f"{config.duration:.0f}s measured + {config.warmup:.0f}s warm-up"
            + (f" + {config.stream_duration:.0f}s streaming" if stream else "")
            + f" per length: ~{_duration(total)} plus draining"
        )
        started = time.time()
        rows = [sweep.run_length(i, length) for i, length in enumerate(config.lengths)]
        summary = {
            "run": {
                "name": config.out.name,
                "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
                "seconds": round(time.time() - started, 1),
                "command": " ".join(["python -m loadtest.sweep", *(argv or sys.argv[1:])]),
                "settings": {
                    "lengths": config.lengths,
                    "users": config.users,
                    "duration_s": config.duration,
                    "warmup_s": config.warmup,
                    "protocol": config.protocol,
                    "host": config.host,
                    "metrics_url": config.metrics_url,
                    "stream_users": config.stream_users if stream else 0,
                    "stream_duration_s": config.stream_duration if stream else 0,
                    "prompts": config.prompts,
                    "prompt_seed": config.prompt_seed,
                    "sampling": locustfile.SAMPLING,
                    "agreement_tolerance": config.agreement_tolerance,
                },
                "prometheus": prom_note,
                "machine": machine_info(),
                "model": model_info(config),
            },
            "rows": rows,
        }
        paths = write_report(config.out, summary)
        log("report: " + ", ".join(str(p.relative_to(config.out)) for p in paths))
        log(f"done in {_duration(time.time() - started)}: {config.out / 'report.md'}")
        return 0
    finally:
        if api is not None:
            api.stop()
        if private_prom is not None:
            private_prom.stop()
            shutil.rmtree(private_prom.directory, ignore_errors=True)
        if server is not None:
            log("stopping the Triton server this sweep started")
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
