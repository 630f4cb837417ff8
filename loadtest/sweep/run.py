"""``make loadtest``: the Locust sweep over output lengths, Locust driven through its Python API
in this process (one Environment per length), so that the measured window opens and closes right
at the metric readings (docs/loadtest.md, "What a run does"). The run folder gets ``events.csv``,
``run.json`` and the report drawn from them (:mod:`loadtest.sweep.report`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from contextlib import ExitStack
from datetime import datetime
from typing import Any

# Importing locust monkey-patches the process with gevent, which must precede anything that loads
# ssl (urllib.request, requests: the project's modules below); every wait below is cooperative.
import gevent
from locust.env import Environment
from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSVFileWriter

from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, STREAM_MODEL
from loadtest import console
from loadtest.metrics import busy_shares, execution_busy_us, snapshot_deltas
from loadtest.prom import PromSource, prometheus_for
from loadtest.results import MachineInfo
from loadtest.sweep import locustfile
from loadtest.sweep.report import EVENTS, RUN, length_row, write_report
from loadtest.sweep.settings import parse_args
from loadtest.targets import TritonTarget
from reporting.events import EventLog
from reporting.triton import Snapshot, read_snapshot, wait_for_drain

log = logging.getLogger(__name__)
EDGE_S = 0.15  # the window brackets Prometheus' scrapes by this much at each end
DRAIN_TIMEOUT_S = 180.0


def wait_until(deadline: float) -> None:
    """Sleep cooperatively (the users run meanwhile) until ``deadline``, Unix time."""
    gevent.sleep(max(0.0, deadline - time.time()))


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Sweep:
    """The lengths one after another against ``server``, every request into :attr:`events`."""

    def __init__(
        self, s: argparse.Namespace, server: TritonTarget, prom: PromSource | None, stream: bool
    ) -> None:
        self.s, self.server, self.prom, self.stream = s, server, prom, stream
        self.events = EventLog(profile="sweep", system=s.protocol)
        self.origin = time.time()  # the event table's clock: started_s counts from here

    def run_length(self, length: int) -> dict[str, Any]:
        """One length's window record: its times, Triton's counter increases and their source,
        each stage's execution time counted once, whether the server drained."""
        s, metrics_url = self.s, self.s.endpoints.metrics_url
        base = str(s.out / f"len_{length:04d}")  # Locust's own CSVs and HTML
        load = locustfile.LoadSettings(length, s.prompts, s.prompt_seed, s.endpoints.grpc)
        options = argparse.Namespace(**load._asdict())
        locustfile.requests_for(load)  # build the requests before the clock starts
        if s.protocol == "http":
            locustfile.http_bodies(load)
        env = self._environment(s.target.load_user_class(), options)
        writer = StatsCSVFileWriter(env, PERCENTILES_TO_REPORT, base, full_history=True)
        writer_greenlet = gevent.spawn(writer.stats_writer)
        self.events.stamp(window=length, phase="warm-up")
        started = time.time()
        log.info(f"length {length}: {s.users} {s.protocol} users, warm-up {s.warmup:.0f}s")
        env.runner.start(s.users, spawn_rate=s.users)

        wait_until(started + s.warmup)
        opening, closing = self._window_times()
        wait_until(opening)
        # the window opens and closes right at the metric readings (Triton's statistics API,
        # slow on a loaded machine, is read after them)
        start = read_snapshot(metrics_url)
        self.events.stamp(phase="measure")
        opened = time.time()
        env.stats.reset_all()  # Locust's own CSV and HTML tables cover the window
        start_busy = self._execution_busy()
        log.info(f"length {length}: measuring {closing - opened:.0f}s")
        wait_until(closing)
        end = read_snapshot(metrics_url)
        self.events.stamp(phase="stream" if self.stream else "after")
        closed = time.time()
        end_busy = self._execution_busy()
        with open(base + ".html", "w") as html:
            html.write(get_html_report(env, show_download_link=False))
        if self.stream:  # streaming users beside the same unary load
            streaming = self._environment(locustfile.StreamingUser, options)
            # stopping lets each stream finish: its row (first token, tokens) is fired at its end
            streaming.stop_timeout = locustfile.REQUEST_TIMEOUT_S
            streaming.runner.start(s.stream_users, spawn_rate=s.stream_users)
            log.info(f"length {length}: {s.stream_users} streaming users, {s.stream_duration:.0f}s")
            wait_until(time.time() + s.stream_duration)
            streaming.runner.quit()
        self.events.stamp(phase="after")
        env.runner.quit()
        writer_greenlet.kill(block=True)
        writer.close_files()
        log.info(f"length {length}: window closed; draining ...")
        state, _ = wait_for_drain(metrics_url, DRAIN_TIMEOUT_S)
        if state is None or not state.idle:
            log.info("the server did not drain in time; going on")
        for name, snapshot in (("_metrics_start.txt", start), ("_metrics_end.txt", end)):
            (s.out / f"len_{length:04d}{name}").write_text(snapshot.text)
        deltas, source = self._window_deltas(start, end)
        window = {
            "output_len": length,
            "source": source,
            "window_s": deltas.window_s,
            "client_window_s": closed - opened,  # the event table's: stamp to stamp
            "length_start_s": started - self.origin,
            "window_start_s": start.taken_at - self.origin,
            "window_end_s": end.taken_at - self.origin,
            "busy_share": busy_shares(
                start_busy,
                end_busy,
                deltas.get("codegen_engine_compute_duration_us_total", ENGINE_MODEL),
            ),
            "drained": state is not None and state.idle,
            "deltas": deltas.as_dict(),
        }
        r = length_row(self.events.frame(), window)
        n = lambda key, digits=0, scale=1: f"{scale * (r[key] or 0):.{digits}f}"  # noqa: E731
        log.info(
            f"length {length}: {n('rps', 2)} req/s, mean {n('latency_mean_ms')} ms "
            f"p95 {n('latency_p95_ms')} ms, {n('tokens_per_s')} tokens/s, engine batch "
            f"{n('engine_batch', 1)}, pre {n('share_preprocessing', 2, 100)}% post "
            f"{n('share_postprocessing', 2, 100)}% of model time, {r['requests']} requests, "
            f"{r['failures']} failures (Triton's figures from {r['source']})"
        )
        return window

    def _environment(self, user_class: type, options: argparse.Namespace) -> Environment:
        env = Environment(
            user_classes=[user_class], host=self.server.users_url, parsed_options=options
        )
        self.events.attach(env)
        env.create_local_runner()
        return env

    def _execution_busy(self) -> dict[str, float]:
        """Execution time per model from Triton's statistics API (see execution_busy_us)."""
        try:
            return execution_busy_us(self.server.statistics())
        except Exception as exc:  # an extra figure: the sweep goes on without it
            log.info(f"Triton's statistics API: {exc}")
            return {}

    def _window_times(self) -> tuple[float, float]:
        """With a Prometheus, just before one of its scrapes and just after a later one, so that
        its aligned window is the direct one but for EDGE_S at each end; else now, now +
        duration."""
        now, duration = time.time(), self.s.duration
        if self.prom is not None:
            try:
                scrape, interval = self.prom.next_scrape(now + 2 * EDGE_S)
            except Exception as exc:  # not fatal: the window is then simply not aligned
                log.info(f"Prometheus: cannot align the window to its scrapes ({exc})")
            else:
                whole = max(2, round(duration / interval)) * interval
                return scrape - EDGE_S, scrape + whole + EDGE_S
        return now, now + duration

    def _window_deltas(self, start: Snapshot, end: Snapshot) -> tuple[Any, str]:
        """The window's increases from Prometheus (its scrapes inside the window) when one runs,
        else from the two readings of ``/metrics``."""
        if self.prom is not None:
            try:
                deltas, window = self.prom.window_deltas(start.taken_at, end.taken_at)
                return deltas, (
                    f"Prometheus' samples over {window.seconds:.1f} s ({window.scrapes} "
                    f"scrapes inside the {end.taken_at - start.taken_at:.1f} s window)"
                )
            except Exception as exc:  # the window's own readings stand in
                log.info(f"Prometheus: {exc}; reading /metrics instead")
        return snapshot_deltas(start, end), "Triton's /metrics read at both ends of the window"


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    console()
    s.out.mkdir(parents=True, exist_ok=True)
    log.info(f"run folder {s.out}")
    with ExitStack() as stack:
        server = stack.enter_context(s.target.server(s.endpoints, s.model_repository, s.out))
        if not server.model_ready(ENSEMBLE_MODEL):
            raise SystemExit(f"the `{ENSEMBLE_MODEL}` model is not ready at {s.endpoints.host}")
        stream = s.stream_users > 0 and s.stream_duration > 0
        if stream and not (stream := server.model_ready(STREAM_MODEL)):
            log.info(f"`{STREAM_MODEL}` is not served: no streaming phase")
        prometheus = stack.enter_context(prometheus_for(s.prometheus, s.endpoints, s.out))
        log.info(prometheus.note)
        sweep = Sweep(s, server, prometheus.source, stream)
        per_length = s.warmup + s.duration + stream * s.stream_duration
        log.info(
            f"lengths {list(s.lengths)}, {s.users} {s.protocol} users: ~"
            f"{format_duration(len(s.lengths) * per_length)} plus draining"
        )
        started = time.time()
        windows = [sweep.run_length(length) for length in s.lengths]
        sweep.events.save(s.out / EVENTS)
        settings = {
            "lengths": list(s.lengths),
            "users": s.users,
            "duration_s": s.duration,
            "warmup_s": s.warmup,
            "protocol": s.protocol,
            "host": s.endpoints.host,
            "metrics_url": s.endpoints.metrics_url,
            "stream_users": s.stream_users * stream,
            "stream_duration_s": s.stream_duration * stream,
            "prompts": s.prompts,
            "prompt_seed": s.prompt_seed,
            "sampling": locustfile.SAMPLING,
        }
        run = {
            "name": s.out.name,
            "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "seconds": round(time.time() - started, 1),
            "command": " ".join(["python -m loadtest.sweep", *(argv or sys.argv[1:])]),
            "settings": settings,
            "prometheus": prometheus.note,
            "machine": dataclasses.asdict(MachineInfo.here()),
            "model": dataclasses.asdict(server.describe()),
        }
        text = json.dumps({"run": run, "windows": windows}, indent=2, default=str)
        (s.out / RUN).write_text(text + "\n")
        paths = write_report(s.out)
        log.info("report: " + ", ".join(str(p.relative_to(s.out)) for p in paths))
        log.info(f"done in {format_duration(time.time() - started)}: {s.out / 'report.md'}")
    return 0
