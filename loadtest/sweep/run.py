"""One run of ``make loadtest`` from start to end, in order: settings, the server and Prometheus
(:mod:`loadtest.targets`), the sweep (:mod:`loadtest.sweep.driver`), then the run folder's
``events.csv`` (every request), ``run.json`` (the run and its windows) and the report drawn
from them (:mod:`loadtest.sweep.report`).

``python -m loadtest.sweep`` calls :func:`main`.
"""

from __future__ import annotations

import dataclasses
import json
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
from loadtest.results import MachineInfo
from loadtest.sweep import locustfile
from loadtest.sweep.driver import Sweep, format_duration
from loadtest.sweep.report import EVENTS, RUN, write_report
from loadtest.sweep.settings import parse_args
from loadtest.targets import prometheus_for

log = logging.getLogger(__name__)


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
        if stream and not server.model_ready(STREAM_MODEL):
            log.info(f"`{STREAM_MODEL}` is not served: no streaming phase")
            stream = False
        prometheus = stack.enter_context(prometheus_for(s.prometheus, s.endpoints, s.out))
        log.info(prometheus.note)
        sweep = Sweep(s, server, prometheus.source, stream)
        log.info(sweep.plan())
        started = time.time()
        windows = sweep.run()
        sweep.events.save(s.out / EVENTS)
        settings = {
            "lengths": list(s.lengths), "users": s.users, "duration_s": s.duration,
            "warmup_s": s.warmup, "protocol": s.protocol, "host": s.endpoints.host,
            "metrics_url": s.endpoints.metrics_url, "stream_users": s.stream_users * stream,
            "stream_duration_s": s.stream_duration * stream, "prompts": s.prompts,
            "prompt_seed": s.prompt_seed, "sampling": locustfile.SAMPLING,
        }  # fmt: skip
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
