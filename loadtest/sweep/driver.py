"""The per-length sweep: Locust driven through its Python API, one output length at a time.

For each length: start the users, warm up, then read Triton's metrics and reset Locust's
statistics at the same moment (the window opens), run for the duration, and read both again
(the window closes). Both count a request when it completes, so Locust's requests and
Triton's ensemble count over the window agree. Then an optional streaming phase (time to first
token and inter-token latency under the same load), stop, and let the server drain. Triton's
figures come from one source: Prometheus when one runs, else the two readings of ``/metrics``.
The result is a :class:`loadtest.results.LengthResult`.

Locust runs in this process (one Environment per length): that is what lets the window open
and close exactly. The users are those of ``loadtest/sweep/locustfile.py``. The rest of a run
(settings, server, report) is :mod:`loadtest.sweep.run`; ``python -m loadtest.sweep`` runs it:

    python -m loadtest.sweep --lengths 8,32,128,512 --users 16 --duration 100 --protocol http \\
        --host localhost:8000
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
from pathlib import Path
from typing import Any

# Importing locust monkey-patches the process with gevent, which must happen before anything
# loads ssl (urllib.request, requests: the project's modules below). The standard-library
# modules above do not, so the patching is clean; every wait below is then cooperative.
import gevent
from locust.env import Environment
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV, StatsCSVFileWriter, StatsEntry

from contract.tensors import ENSEMBLE_MODEL
from loadtest.metrics import (
    Deltas,
    busy_shares,
    execution_busy_us,
    snapshot_deltas,
    window_figures,
)
from loadtest.prom import PromSource
from loadtest.results import (
    ClientFigures,
    Latency,
    LengthResult,
    LocustWindow,
    RequestRecord,
    StreamFigures,
    Timeline,
    length_file,
    write_request_log,
)
from loadtest.sweep import locustfile
from loadtest.sweep.settings import Settings
from loadtest.targets import Server
from reporting.triton import Snapshot, read_snapshot, wait_for_drain

log = logging.getLogger(__name__)
EDGE_S = 0.15  # the window brackets Prometheus' scrapes by this much at each end


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Recorder:
    """Every request of one length with its completion time: the request log, and the live
    rate shown in the progress lines."""

    def __init__(self) -> None:
        self.origin = time.time()
        self.records: list[RequestRecord] = []

    def __call__(
        self, name: str, response_time: float, response_length: int, exception=None, **_: Any
    ) -> None:
        """Locust's request event."""
        self.records.append(
            RequestRecord(
                time.time() - self.origin,
                name,
                response_time,
                response_length or 0,
                exception is not None,
            )
        )

    def live(self, seconds: float, name: str) -> tuple[float, float | None]:
        """(completions/s, median response time in ms) over the last ``seconds``."""
        since = time.time() - self.origin - seconds
        recent = [
            r.response_time_ms
            for r in reversed(self.records[-5000:])
            if r.name == name and r.t_s >= since
        ]
        median = sorted(recent)[len(recent) // 2] if recent else None
        return len(recent) / seconds, median

    @property
    def failures(self) -> int:
        return sum(r.failed for r in self.records)


def client_figures(entry: StatsEntry, window_s: float) -> ClientFigures:
    """One Locust request name's figures over a window of ``window_s`` seconds."""
    n = entry.num_requests
    return ClientFigures(
        requests=n,
        failures=entry.num_failures,
        rps=n / window_s if window_s > 0 else None,
        latency_ms=_latency(entry),
    )


def _latency(entry: StatsEntry) -> Latency:
    if not entry.num_requests:
        return Latency()
    pct = entry.get_response_time_percentile
    return Latency(
        mean=entry.avg_response_time,
        p50=float(pct(0.5)),
        p90=float(pct(0.9)),
        p95=float(pct(0.95)),
        p99=float(pct(0.99)),
        max=entry.max_response_time,
    )


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


class Sweep:
    """Runs the lengths one after another against ``server``; Triton's figures come from
    ``prom`` when there is one."""

    def __init__(
        self, settings: Settings, server: Server, prom: PromSource | None, stream: bool
    ) -> None:
        self.settings = settings
        self.server = server
        self.prom = prom
        self.stream = stream
        self.user_class: type = settings.target.load_user_class()
        self.per_length = (
            settings.warmup + settings.duration + (settings.stream_duration if stream else 0)
        )

    def plan(self) -> str:
        """The sweep in a line, with how long it will take."""
        s = self.settings
        total = len(s.lengths) * self.per_length
        return (
            f"lengths {list(s.lengths)}, {s.users} {s.protocol} users, "
            f"{s.duration:.0f}s measured + {s.warmup:.0f}s warm-up"
            + (f" + {s.stream_duration:.0f}s streaming" if self.stream else "")
            + f" per length: ~{format_duration(total)} plus draining"
        )

    def run(self) -> list[LengthResult]:
        return [self.run_length(i, length) for i, length in enumerate(self.settings.lengths)]

    def run_length(self, index: int, length: int) -> LengthResult:
        s = self.settings
        metrics_url = s.endpoints.metrics_url
        base = str(s.out / length_file(length, ""))
        options = self._options(length)
        load = locustfile.load_settings(argparse.Namespace(parsed_options=options))
        locustfile.requests_for(load)  # build the requests before the clock starts
        if s.protocol == "http":
            locustfile.http_bodies(load)

        env = Environment(
            user_classes=[self.user_class], host=self.server.users_url, parsed_options=options
        )
        recorder = Recorder()
        env.events.request.add_listener(recorder)
        runner = env.create_local_runner()
        writer = StatsCSVFileWriter(env, PERCENTILES_TO_REPORT, base, full_history=True)
        writer_greenlet = gevent.spawn(writer.stats_writer)
        length_started = time.monotonic()
        log.info(f"length {length}: {s.users} {s.protocol} users, warm-up {s.warmup:.0f}s")
        runner.start(s.users, spawn_rate=s.users)
        self._wait_until(time.time() + s.warmup, "warm-up", recorder, index, length_started)

        opening, closing = self._window_times()
        self._wait_until(opening, "warm-up", recorder, index, length_started)
        start = read_snapshot(metrics_url)
        start_busy = self._execution_busy()
        env.stats.reset_all()
        reset_at = time.time()
        self._wait_until(closing, "measure", recorder, index, length_started)
        end = read_snapshot(metrics_url)
        end_busy = self._execution_busy()
        closed_at = time.time()
        locust_window = closed_at - reset_at
        client = client_figures(env.stats.total, locust_window)
        errors = {str(e.error): e.occurrences for e in env.stats.errors.values()}
        writer_greenlet.kill(block=True)
        writer.close_files()
        files = [*_write_tables(env, base), Path(writer.stats_history_file_name()).name]

        stream = None
        if self.stream:
            stream, stream_files = self._stream_phase(
                index, options, base, recorder, length_started
            )
            files += stream_files
        runner.quit()
        log.info(f"length {length}: window closed; {client.requests} requests, draining ...")
        drained = self._drain()

        for name, snapshot in (("_metrics_start.txt", start), ("_metrics_end.txt", end)):
            (s.out / length_file(length, name)).write_text(snapshot.text)
            files.append(length_file(length, name))
        write_request_log(s.out / length_file(length, "_requests.csv"), recorder.records)
        files.append(length_file(length, "_requests.csv"))

        deltas, source = self._window_deltas(start, end)
        figures = window_figures(deltas)
        result = LengthResult(
            output_len=length,
            protocol=s.protocol,
            users=s.users,
            busy_share=busy_shares(start_busy, end_busy, figures.compute_us["model"]),
            locust=LocustWindow(**vars(client), window_s=locust_window, errors=errors),
            triton=figures,
            triton_deltas=deltas.as_dict(),
            timeline=Timeline(start.taken_at - recorder.origin, end.taken_at - recorder.origin),
            stream=stream,
            drained=drained,
            files=files,
            source=source,
        )
        self._log_result(result)
        return result

    def _options(self, length: int) -> argparse.Namespace:
        """What the users read as Locust's parsed options (locustfile.load_settings)."""
        s = self.settings
        return argparse.Namespace(
            output_len=length,
            prompts=s.prompts,
            prompt_seed=s.prompt_seed,
            grpc_url=s.endpoints.grpc,
        )

    def _wait_until(
        self, deadline: float, label: str, recorder: Recorder, index: int, length_started: float
    ) -> None:
        """Sleep until ``deadline`` (Unix time), printing progress: which length and phase,
        the sweep's time left, and the live rate and median of the unary requests."""
        s = self.settings
        phase_started = time.time()
        while (now := time.time()) < deadline:
            gevent.sleep(min(s.progress_every, deadline - now))
            now = time.time()
            if deadline - now < 0.05:
                break  # the phase is over: no progress line for the last few milliseconds
            left = max(0.0, self.per_length - (time.monotonic() - length_started))
            left += (len(s.lengths) - index - 1) * self.per_length
            rate, median = recorder.live(s.progress_every, ENSEMBLE_MODEL)
            log.info(
                f"length {s.lengths[index]} ({index + 1}/{len(s.lengths)}) {label:<7} "
                f"{now - phase_started:4.0f}/{deadline - phase_started:.0f}s | sweep ~"
                f"{format_duration(left)} left | {rate:6.2f} req/s now | median "
                f"{'-' if median is None else f'{median:.0f}'} ms | "
                f"{recorder.failures} failures"
            )

    def _execution_busy(self) -> dict[str, float]:
        """Execution time per model from Triton's statistics API (see execution_busy_us)."""
        try:
            return execution_busy_us(self.server.statistics())
        except Exception as exc:  # an extra figure: the sweep goes on without it
            log.info(f"Triton's statistics API: {exc}")
            return {}

    def _window_times(self) -> tuple[float, float]:
        """When to open and close the window: with a Prometheus, just before one of its scrapes
        and just after a later one, so that its aligned window is the direct one but for
        EDGE_S at each end; otherwise now and now + duration."""
        now, duration = time.time(), self.settings.duration
        if self.prom is not None:
            try:
                scrape, interval = self.prom.next_scrape(now + 2 * EDGE_S)
            except Exception as exc:  # not fatal: the window is then simply not aligned
                log.info(f"Prometheus: cannot align the window to its scrapes ({exc})")
            else:
                whole = max(2, round(duration / interval)) * interval
                return scrape - EDGE_S, scrape + whole + EDGE_S
        return now, now + duration

    def _stream_phase(
        self,
        index: int,
        options: argparse.Namespace,
        base: str,
        recorder: Recorder,
        length_started: float,
    ) -> tuple[StreamFigures, list[str]]:
        """Streaming users beside the same unary load: TTFT and inter-token latency."""
        s = self.settings
        env = Environment(
            user_classes=[locustfile.StreamingUser],
            host=self.server.users_url,
            parsed_options=options,
        )
        runner = env.create_local_runner()
        started = time.time()
        runner.start(s.stream_users, spawn_rate=s.stream_users)
        self._wait_until(started + s.stream_duration, "stream", recorder, index, length_started)
        seconds = time.time() - started

        def figures(name: str) -> ClientFigures:
            return client_figures(env.stats.get(name, "grpc-stream"), seconds)

        stream = StreamFigures(
            users=s.stream_users,
            seconds=seconds,
            ttft=figures(locustfile.TTFT_NAME),
            inter_token=figures(locustfile.ITL_NAME),
            total=figures(locustfile.STREAM_NAME),
        )
        files = _write_tables(env, base + "_stream")
        runner.quit()
        return stream, files

    def _drain(self) -> bool:
        """Wait until nothing is in flight, so that the next length starts on an idle server
        (and the last leaves it idle for whoever uses it next)."""
        state, _ = wait_for_drain(self.settings.endpoints.metrics_url, self.settings.drain_timeout)
        if state is None or not state.idle:
            log.info("the server did not drain in time; going on")
        return state is not None and state.idle

    def _window_deltas(self, start: Snapshot, end: Snapshot) -> tuple[Deltas, str]:
        """The window's counter increases from one source: Prometheus when one runs (its
        scrapes inside the window), else the two readings of ``/metrics``."""
        if self.prom is not None:
            try:
                deltas, window = self.prom.window_deltas(start.taken_at, end.taken_at)
                return deltas, (
                    f"Prometheus' increase() over {window.seconds:.1f} s ({window.scrapes} "
                    f"scrapes inside the {end.taken_at - start.taken_at:.1f} s window)"
                )
            except Exception as exc:  # the window's own readings stand in
                log.info(f"Prometheus: {exc}; reading /metrics instead")
        return snapshot_deltas(start, end), "Triton's /metrics read at both ends of the window"

    def _log_result(self, r: LengthResult) -> None:
        lat, shares = r.latency_ms, r.stage_share
        log.info(
            f"length {r.output_len}: {r.rps or 0:.2f} req/s, mean {lat.mean or 0:.0f} ms "
            f"p95 {lat.p95 or 0:.0f} ms, {r.tokens_per_s or 0:.0f} tokens/s, "
            f"engine batch {r.engine_batch_size or 0:.1f}, "
            f"pre {100 * (shares['preprocessing'] or 0):.2f}% post "
            f"{100 * (shares['postprocessing'] or 0):.2f}% of model time, "
            f"{r.failures} failures (Triton's figures from {r.source})"
        )
