"""The typists as Locust users, run in windows, one system per window.

A :class:`EditorTypist` walks its files as :class:`loadtest.editor.typist.Typist` schedules it:
its keystrokes between two pauses are Locust's ``wait_time``, each pause is one task, a request
read until it is answered or the pause ends, then abandoned (its stream closed, see
:func:`loadtest.editor.drive.type_pause`). Every request is one Locust ``request`` event, with
the editor's columns in its ``context``, recorded by :class:`reporting.events.EventLog`: the
report is built from that table alone.

:func:`run_windows` gives each window its system and its seconds; every system keeps its own
typists' walks from window to window (the same seed, so each system is sent the same prompts
in the same order), and the counters and CPU of the system are read around each window, after
it drained.

Importing this module imports Locust, which monkey-patches the process with gevent: the command
line imports it, the tests run it in a subprocess.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gevent
import grpc.experimental.gevent as grpc_gevent
from locust import User, task
from locust.env import Environment
from locust.exception import StopUser

from loadtest.editor.drive import type_pause
from loadtest.editor.figures import request_event
from loadtest.editor.systems import System
from loadtest.editor.typist import TypingStyle, Typist, Visit
from loadtest.editor.window import Clipper
from reporting.events import EventLog

grpc_gevent.init_gevent()  # before any channel exists: gRPC calls yield to the other typists
log = logging.getLogger("loadtest.editor")
DRAIN_S = 120.0


@dataclass
class Walk:
    """One typist's pauses on one system, kept from window to window."""

    visits: Iterator[Visit]
    pending: Visit | None = None
    sent: int = 0

    def next(self) -> Visit:
        visit, self.pending = self.pending or next(self.visits), None
        return visit


@dataclass
class Plan:
    """What a window's typists share."""

    system: System
    clipper: Clipper
    with_suffix: bool
    walks: dict[int, Walk]
    until: float  # monotonic: no request is sent after it
    one_line: bool
    origin: float = field(default_factory=time.monotonic)
    numbers: Iterator[int] = field(default_factory=itertools.count)


class EditorTypist(User):
    """One simulated typist (see the module's docstring)."""

    abstract = True
    plan: Plan

    def on_start(self) -> None:
        self.index = next(self.plan.numbers)
        self.walk = self.plan.walks[self.index]
        self.visit = self.walk.next()
        gevent.sleep(self.visit.pause.typing_s)  # the first burst of keystrokes

    def wait_time(self) -> float:
        self.visit = self.walk.next()
        return self.visit.pause.typing_s  # the keystrokes before the next pause

    @task
    def pause(self) -> None:
        plan = self.plan
        if time.monotonic() >= plan.until:
            self.walk.pending = self.visit  # the next window on this system starts here
            raise StopUser()
        wall = time.time()
        seed = self.index * 1_000_003 + self.walk.sent
        self.walk.sent += 1
        record = type_pause(plan.system.sender, plan.clipper, plan.with_suffix, self.index,
                            plan.origin, self.visit, seed)  # fmt: skip
        event = request_event(record, plan.system.sender.protocol, plan.one_line, wall)
        self.environment.events.request.fire(**event)


@dataclass
class Windows:
    """The typists over ``files``, window after window (:meth:`run`)."""

    files: Sequence[Path]
    typists: int
    clipper: Clipper
    with_suffix: bool
    style: TypingStyle
    seed: int
    one_line: bool
    events: EventLog
    progress_every: float
    walks: dict[str, dict[int, Walk]] = field(default_factory=dict)

    def _walks(self, system: str) -> dict[int, Walk]:
        if system not in self.walks:
            self.walks[system] = {
                i: Walk(Typist(i, self.files, self.seed, self.style).visits())
                for i in range(self.typists)
            }
        return self.walks[system]

    def run(self, system: System, number: int, seconds: float, problems: list[str]) -> dict:
        """One window of ``seconds`` on ``system``: its counters, CPU and drain around it."""
        if not system.drain(DRAIN_S):
            problems.append(f"{system.label} held requests before window {number}")
        self.events.stamp(system=system.label, window=number)
        before, cpu, began = system.counters(), system.cpu_s(), time.monotonic()
        plan = Plan(system, self.clipper, self.with_suffix, self._walks(system.label),
                    began + seconds, self.one_line, origin=began)  # fmt: skip
        environment = Environment(user_classes=[type("Typist", (EditorTypist,), {"plan": plan})])
        self.events.attach(environment)
        runner = environment.create_local_runner()
        runner.start(self.typists, spawn_rate=100)
        hard_end = began + seconds + self.style.longest_step_s + 30
        gevent.sleep(0.1)
        while runner.user_count and time.monotonic() < hard_end:
            gevent.sleep(min(self.progress_every, max(0.1, hard_end - time.monotonic())))
            log.info(self.progress(system.label, number, time.monotonic() - began, seconds))
        if runner.user_count:
            problems.append(f"{runner.user_count} typist(s) still busy after window {number}")
        runner.quit()
        typed = time.monotonic() - began
        if not system.drain(DRAIN_S):
            problems.append(f"{system.label} did not drain within {DRAIN_S:.0f} s")
        after = system.counters()
        return {"system": system.label, "window": number, "seconds": round(typed, 1),
                "cpu_s": system.cpu_s() - cpu,
                **{k: after[k] - before.get(k, 0.0) for k in after}}  # fmt: skip

    def progress(self, label: str, number: int, elapsed: float, seconds: float) -> str:
        frame = self.events.frame()
        rows = frame[frame["window"] == number]
        counts = rows["outcome"].value_counts()
        first = rows.loc[rows["outcome"] == "ok", "first_token_ms"].tail(100)
        p50 = first.median() if len(first) else None
        return (
            f"editor {label} window {number} {elapsed:4.0f}/{seconds:.0f}s | {self.typists} "
            f"typists | answered {counts.get('ok', 0)} abandoned {counts.get('abandoned', 0)} "
            f"errors {counts.get('error', 0)} | first token p50 "
            + ("-" if p50 is None else f"{p50:.0f} ms")
            + ("" if self.with_suffix else " | PREFIX-ONLY")
        )
