"""The per-length sweep: Locust driven through its Python API, one output length at a time.

For each length: start the users, warm up, then read Triton's metrics and open the window in
the event table at the same moment (rows are stamped ``phase=measure`` from then on), run for
the duration, and read the metrics again as the window closes. Locust fires its request event
when a request completes and Triton counts it then too, so the window's rows and Triton's
ensemble count agree. Then an optional streaming phase (time to first token and inter-token
gaps under the same load), stop, and let the server drain. Every request is a row of
:class:`reporting.events.EventLog`; Triton's figures come from one source: Prometheus when one
runs, else the two readings of ``/metrics``. Each length leaves a window record (:meth:`run`)
that the report (:mod:`loadtest.sweep.report`) joins with the event table.

Locust runs in this process (one Environment per length): that is what lets the window open
and close exactly. The users are those of ``loadtest/sweep/locustfile.py``.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

# Importing locust monkey-patches the process with gevent, which must happen before anything
# loads ssl (urllib.request, requests: the project's modules below). The standard-library
# modules above do not, so the patching is clean; every wait below is then cooperative.
import gevent
from locust.env import Environment
from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSVFileWriter

from loadtest.metrics import Deltas, busy_shares, execution_busy_us, snapshot_deltas
from loadtest.prom import PromSource
from loadtest.sweep import locustfile
from loadtest.sweep.report import length_row
from loadtest.sweep.settings import Settings
from loadtest.targets import OpenAITarget, TritonTarget
from reporting.events import EventLog
from reporting.triton import Snapshot, read_snapshot, wait_for_drain

log = logging.getLogger(__name__)
EDGE_S = 0.15  # the window brackets Prometheus' scrapes by this much at each end


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def length_file(length: int, suffix: str) -> str:
    """A per-length file's name in the run folder, e.g. ``len_0032_stats.csv``."""
    return f"len_{length:04d}{suffix}"


class Sweep:
    """Runs the lengths one after another against ``server``, every request into
    :attr:`events`; Triton's figures come from ``prom`` when there is one."""

    def __init__(
        self,
        settings: Settings,
        server: TritonTarget | OpenAITarget,
        prom: PromSource | None,
        stream: bool,
    ) -> None:
        self.settings, self.server, self.prom, self.stream = settings, server, prom, stream
        self.events = EventLog(profile="sweep", system=settings.protocol)
        self.origin = time.time()  # the event table's clock: started_s counts from here
        self.user_class: type = settings.target.load_user_class()
        self.per_length = settings.warmup + settings.duration + stream * settings.stream_duration

    def plan(self) -> str:
        """The sweep in a line, with how long it will take."""
        s = self.settings
        return (
            f"lengths {list(s.lengths)}, {s.users} {s.protocol} users, "
            f"{s.duration:.0f}s measured + {s.warmup:.0f}s warm-up"
            + (f" + {s.stream_duration:.0f}s streaming" if self.stream else "")
            + f" per length: ~{format_duration(len(s.lengths) * self.per_length)} plus draining"
        )

    def run(self) -> list[dict[str, Any]]:
        """Every length's window record: when it ran, Triton's counter increases and their
        source, each stage's execution time counted once, whether the server drained."""
        return [self.run_length(i, length) for i, length in enumerate(self.settings.lengths)]

    def run_length(self, index: int, length: int) -> dict[str, Any]:
        s, metrics_url = self.settings, self.settings.endpoints.metrics_url
        base = str(s.out / length_file(length, ""))  # Locust's own CSVs and HTML
        grpc_url = s.endpoints.grpc
        options = argparse.Namespace(output_len=length, prompts=s.prompts,
                                     prompt_seed=s.prompt_seed, grpc_url=grpc_url)  # fmt: skip
        load = locustfile.load_settings(argparse.Namespace(parsed_options=options))
        locustfile.requests_for(load)  # build the requests before the clock starts
        if s.protocol == "http":
            locustfile.http_bodies(load)
        env = self._environment(self.user_class, options)
        writer = StatsCSVFileWriter(env, PERCENTILES_TO_REPORT, base, full_history=True)
        writer_greenlet = gevent.spawn(writer.stats_writer)
        self.events.stamp(window=length, phase="warm-up")
        started = time.time()
        log.info(f"length {length}: {s.users} {s.protocol} users, warm-up {s.warmup:.0f}s")
        env.runner.start(s.users, spawn_rate=s.users)
        self._wait_until(started + s.warmup, "warm-up", env, index, started)

        opening, closing = self._window_times()
        self._wait_until(opening, "warm-up", env, index, started)
        # the event table's window opens and closes right at the metric readings (Triton's
        # statistics API, slow on a loaded machine, is read after them)
        start = read_snapshot(metrics_url)
        self.events.stamp(phase="measure")
        opened = time.time()
        env.stats.reset_all()  # Locust's own CSV and HTML tables cover the window
        start_busy = self._execution_busy()
        self._wait_until(closing, "measure", env, index, started)
        end = read_snapshot(metrics_url)
        self.events.stamp(phase="stream" if self.stream else "after")
        closed = time.time()
        end_busy = self._execution_busy()
        Path(base + ".html").write_text(get_html_report(env, show_download_link=False))
        if self.stream:
            self._stream_phase(index, options, env, started)
        self.events.stamp(phase="after")
        env.runner.quit()
        writer_greenlet.kill(block=True)
        writer.close_files()
        log.info(f"length {length}: window closed; draining ...")
        state, _ = wait_for_drain(metrics_url, s.drain_timeout)
        if state is None or not state.idle:
            log.info("the server did not drain in time; going on")
        for name, snapshot in (("_metrics_start.txt", start), ("_metrics_end.txt", end)):
            (s.out / length_file(length, name)).write_text(snapshot.text)

        deltas, source = self._window_deltas(start, end)
        compute_model = deltas.get("codegen_engine_compute_duration_us_total", "engine")
        window = {
            "output_len": length,
            "source": source,
            "window_s": deltas.window_s,
            "client_window_s": closed - opened,  # the event table's: stamp to stamp
            "length_start_s": started - self.origin,
            "window_start_s": start.taken_at - self.origin,
            "window_end_s": end.taken_at - self.origin,
            "busy_share": busy_shares(start_busy, end_busy, compute_model),
            "drained": state is not None and state.idle,
            "deltas": deltas.as_dict(),
        }
        self._log_result(length_row(self.events.frame(), window))
        return window

    def _environment(self, user_class: type, options: argparse.Namespace) -> Environment:
        env = Environment(user_classes=[user_class], host=self.server.users_url,
                          parsed_options=options)  # fmt: skip
        self.events.attach(env)
        env.create_local_runner()
        return env

    def _wait_until(
        self, deadline: float, label: str, env: Environment, index: int, started: float
    ) -> None:
        """Sleep until ``deadline`` (Unix time), printing progress: which length and phase,
        the sweep's time left, and Locust's current rate and median of the unary requests."""
        s = self.settings
        phase_started = time.time()
        while (now := time.time()) < deadline:
            gevent.sleep(min(s.progress_every, deadline - now))
            now = time.time()
            if deadline - now < 0.05:
                break  # the phase is over: no progress line for the last few milliseconds
            left = max(0.0, self.per_length - (now - started))
            left += (len(s.lengths) - index - 1) * self.per_length
            total = env.stats.total
            median = total.median_response_time if total.num_requests else None
            log.info(
                f"length {s.lengths[index]} ({index + 1}/{len(s.lengths)}) {label:<7} "
                f"{now - phase_started:4.0f}/{deadline - phase_started:.0f}s | sweep ~"
                f"{format_duration(left)} left | {total.current_rps:6.2f} req/s now | median "
                f"{'-' if median is None else f'{median:.0f}'} ms | {total.num_failures} failures"
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
        self, index: int, options: argparse.Namespace, unary: Environment, started: float
    ) -> None:
        """Streaming users beside the same unary load: time to first token, inter-token gaps."""
        s = self.settings
        env = self._environment(locustfile.StreamingUser, options)
        # stopping lets each stream finish: its row (first token, tokens) is fired at its end
        env.stop_timeout = locustfile.REQUEST_TIMEOUT_S
        env.runner.start(s.stream_users, spawn_rate=s.stream_users)
        self._wait_until(time.time() + s.stream_duration, "stream", unary, index, started)
        env.runner.quit()

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

    def _log_result(self, r: dict[str, Any]) -> None:
        def n(key: str, digits: int = 0, scale: float = 1) -> str:
            return f"{scale * (r[key] or 0):.{digits}f}"

        log.info(
            f"length {r['output_len']}: {n('rps', 2)} req/s, mean {n('latency_mean_ms')} ms "
            f"p95 {n('latency_p95_ms')} ms, {n('tokens_per_s')} tokens/s, engine batch "
            f"{n('engine_batch', 1)}, pre {n('share_preprocessing', 2, 100)}% post "
            f"{n('share_postprocessing', 2, 100)}% of model time, {r['requests']} requests, "
            f"{r['failures']} failures (Triton's figures from {r['source']})"
        )
