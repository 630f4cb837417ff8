"""The soak's Locust side: :class:`SoakUser` (one closed-loop client sending the mix) and
:class:`SoakShape` (the phases, :class:`loadtest.soak.plan.SoakPlan`, as a load shape).

Importing this module imports Locust, which monkey-patches the process with gevent: only the
run (:mod:`loadtest.soak.run`) imports it, never the tests' process.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.experimental.gevent as grpc_gevent
from locust import LoadTestShape, User, constant, task
from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadtest.soak.cases import HOSTILE, INVALID, UNARY_GRPC, Rotation, Schedule
from loadtest.soak.plan import RAMP, SoakPlan
from loadtest.soak.send import Client, ClientParams, Requests

grpc_gevent.init_gevent()  # before any channel exists: grpc calls then yield to other users


@dataclass
class Mix:
    """What the users share: where and how to send, the ledger, and the order of the kinds."""

    params: ClientParams
    requests: Requests
    plan: SoakPlan
    mix: dict[str, int]
    seed: int = 0
    schedule: Schedule = field(init=False)
    rotation: Rotation = field(default_factory=Rotation)
    index: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.schedule = Schedule(self.mix)

    def choose(self) -> tuple[str, str, str]:
        """The ramp sends valid unary gRPC requests; the soak, the mix in its proportions."""
        if self.plan.stage == RAMP:
            return UNARY_GRPC, "", ""
        kind = self.schedule.next()
        if kind in (INVALID, HOSTILE):
            return kind, *self.rotation.next(kind)
        return kind, "", ""


class SoakUser(User):
    """A closed-loop client: one request after another, no pause."""

    wait_time = constant(0)
    mix: Mix  # set by the run before it starts

    def on_start(self) -> None:
        self.client = Client(next(self.mix.index), self.mix.params, self.mix.requests,
                             self.mix.seed)  # fmt: skip

    def on_stop(self) -> None:
        self.client.close()

    @task
    def send(self) -> None:
        self.client.run(*self.mix.choose())


class SoakShape(LoadTestShape):
    """The plan's stages as Locust's load shape (every user spawned at once)."""

    def __init__(self, plan: SoakPlan, clock: Any) -> None:
        super().__init__()
        self.plan, self.clock = plan, clock

    def tick(self) -> tuple[int, float] | None:
        step = self.plan.tick(self.clock())
        return None if step is None else (step[0], 100)  # all at once, up or down


def write_locust_reports(environment: Any, out: Path) -> list[Path]:
    """Locust's own reports of the run: its request and failure tables and its HTML page."""
    tables = StatsCSV(environment, PERCENTILES_TO_REPORT)
    paths = [out / "locust_stats.csv", out / "locust_failures.csv", out / "locust.html"]
    for path, write in zip(paths, (tables.requests_csv, tables.failures_csv), strict=False):
        with path.open("w", newline="") as handle:
            write(csv.writer(handle))
    paths[2].write_text(get_html_report(environment, show_download_link=False))
    return paths
