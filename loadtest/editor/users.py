"""The typists as Locust users (keystrokes: ``wait_time``; a pause: one task), in windows of one
system each; each system keeps its typists' walks from window to window (the same seed, the
same prompts), its counters and CPU read around each window, once drained. Imports Locust,
which monkey-patches the process with gevent: the tests run it in a subprocess."""

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

from loadtest.editor.protocols import request_event, type_pause
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
    sent: int = 0


class EditorTypist(User):
    """One simulated typist; a window's subclass sets the class attributes."""

    abstract = True
    system: System
    windows: Windows
    walks: dict[int, Walk]
    until: float  # monotonic: no request is sent after it
    numbers: Iterator[int]

    def on_start(self) -> None:
        self.index = next(self.numbers)
        self.walk, self.visit = self.walks[self.index], next(self.walks[self.index].visits)
        gevent.sleep(self.visit.pause.typing_s)  # the first burst of keystrokes

    def wait_time(self) -> float:
        self.visit = next(self.walk.visits)
        return self.visit.pause.typing_s  # the keystrokes before the next pause

    def context_chunks(self, visit: Visit) -> Sequence[dict]:
        """Other files' chunks sent with the request at ``visit`` (none: the editor profile
        measures the file alone)."""
        return ()

    @task
    def pause(self) -> None:
        if time.monotonic() >= self.until:  # the next window on this system starts here
            self.walk.visits = itertools.chain([self.visit], self.walk.visits)
            raise StopUser()
        wall, seed = time.time(), self.index * 1_000_003 + self.walk.sent
        self.walk.sent += 1
        w, sender = self.windows, self.system.sender
        exchange, window = type_pause(
            sender, w.clipper, w.with_suffix, self.visit, seed, self.context_chunks(self.visit)
        )
        self.environment.events.request.fire(
            **request_event(
                exchange,
                window,
                self.visit.pause.pause_s,
                self.index,
                sender.protocol,
                w.one_line,
                wall,
            )
        )


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
    walks: dict[str, dict[int, Walk]] = field(default_factory=dict)

    def run(self, system: System, number: int, seconds: float, problems: list[str]) -> dict:
        """One window of ``seconds`` on ``system``: its counters, CPU and drain around it."""
        if not system.drain(DRAIN_S):
            problems.append(f"{system.label} held requests before window {number}")
        self.events.stamp(system=system.label, window=number)
        before, cpu, began = system.counters(), system.cpu_s(), time.monotonic()
        walks = self.walks.setdefault(
            system.label,
            {
                i: Walk(Typist(i, self.files, self.seed, self.style).visits())
                for i in range(self.typists)
            },
        )
        typist = type(
            "Typist",
            (EditorTypist,),
            dict(
                system=system,
                windows=self,
                walks=walks,
                until=began + seconds,
                numbers=itertools.count(),
            ),
        )
        environment = Environment(user_classes=[typist])
        self.events.attach(environment)
        runner = environment.create_local_runner()
        runner.start(self.typists, spawn_rate=100)
        hard_end = began + seconds + self.style.longest_step_s + 30
        gevent.sleep(0.1)
        while runner.user_count and time.monotonic() < hard_end:
            gevent.sleep(0.1)
        if runner.user_count:
            problems.append(f"{runner.user_count} typist(s) still busy after window {number}")
        runner.quit()
        typed = time.monotonic() - began
        rows = self.events.frame().query("window == @number")
        n, first = rows["outcome"].value_counts(), rows.query("outcome == 'ok'").first_token_ms
        first = first.dropna().astype(float)
        log.info(
            f"editor {system.label} window {number} {typed:.0f}s | {self.typists} typists | "
            f"answered {n.get('ok', 0)} abandoned {n.get('abandoned', 0)} errors "
            f"{n.get('error', 0)} | first token p50 "
            + (f"{first.median():.0f} ms" if len(first) else "-")
            + ("" if self.with_suffix else " | PREFIX-ONLY")
        )
        if not system.drain(DRAIN_S):
            problems.append(f"{system.label} did not drain within {DRAIN_S:.0f} s")
        after = system.counters()
        return {
            "system": system.label,
            "window": number,
            "seconds": round(typed, 1),
            "cpu_s": system.cpu_s() - cpu,
            **{k: after[k] - before.get(k, 0.0) for k in after},
        }
