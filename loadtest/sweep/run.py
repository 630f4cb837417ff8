"""One run of ``make loadtest`` from start to end, in order: settings, the server and Prometheus
(:mod:`loadtest.targets`), the sweep (:mod:`loadtest.sweep.driver`), the run's description (this
machine, the served model) and the report (:mod:`loadtest.sweep.report`).

``python -m loadtest.sweep`` calls :func:`main`.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from datetime import datetime

# Locust patches the process with gevent on import; that must precede anything that loads ssl
# (the project's modules below do, through urllib.request and requests).
import locust  # noqa: F401

from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL
from loadtest import console
from loadtest.results import MachineInfo, RunInfo, RunResult, RunSettings
from loadtest.sweep import locustfile
from loadtest.sweep.driver import Sweep, format_duration
from loadtest.sweep.report import write_report
from loadtest.sweep.settings import Settings, parse_args
from loadtest.targets import prometheus_for

log = logging.getLogger(__name__)


def run_settings(settings: Settings, stream: bool) -> RunSettings:
    """The settings as the sweep ran them (no streaming phase: recorded as 0)."""
    s = settings
    return RunSettings(
        lengths=list(s.lengths),
        users=s.users,
        duration_s=s.duration,
        warmup_s=s.warmup,
        protocol=s.protocol,
        host=s.endpoints.host,
        metrics_url=s.endpoints.metrics_url,
        stream_users=s.stream_users if stream else 0,
        stream_duration_s=s.stream_duration if stream else 0,
        prompts=s.prompts,
        prompt_seed=s.prompt_seed,
        sampling=locustfile.SAMPLING,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    console()
    settings.out.mkdir(parents=True, exist_ok=True)
    log.info(f"run folder {settings.out}")
    with ExitStack() as stack:
        server = stack.enter_context(
            settings.target.server(settings.endpoints, settings.model_repository, settings.out)
        )
        if not server.model_ready(ENSEMBLE_MODEL):
            host = settings.endpoints.host
            raise SystemExit(f"the `{ENSEMBLE_MODEL}` model is not ready at {host}")
        stream = settings.stream_users > 0 and settings.stream_duration > 0
        if stream and not server.model_ready(STREAM_MODEL):
            log.info(f"`{STREAM_MODEL}` is not served: no streaming phase")
            stream = False
        prometheus = stack.enter_context(prometheus_for(settings.prometheus, settings.endpoints))
        log.info(prometheus.note)
        sweep = Sweep(settings, server, prometheus.source, stream)
        log.info(sweep.plan())
        started = time.time()
        rows = sweep.run()
        run = RunInfo(
            name=settings.out.name,
            started=datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            seconds=round(time.time() - started, 1),
            command=" ".join(["python -m loadtest.sweep", *(argv or sys.argv[1:])]),
            settings=run_settings(settings, stream),
            prometheus=prometheus.note,
            machine=MachineInfo.here(),
            model=server.describe(),
        )
        paths = write_report(settings.out, RunResult(run, rows))
        log.info("report: " + ", ".join(str(p.relative_to(settings.out)) for p in paths))
        log.info(f"done in {format_duration(time.time() - started)}: {settings.out / 'report.md'}")
    return 0
