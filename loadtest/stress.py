"""Stress the server with every way an editor client leaves a request, and check it survives
(docs/operations.md, "The stress test"): one Locust user class per way of leaving, every request
a row of the event table. FAIL (exit 1): an unexpected error, a stall, a request not answered
afterwards, or a model still holding requests, engine rows or calls. Local traffic only.

    python -m loadtest.stress --grpc 127.0.0.1:8001 --http 127.0.0.1:8000 --duration 120
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import numpy as np

# Locust patches the process with gevent on import; that must precede anything that loads ssl
# (grpc, httpx, urllib.request: imported below it, or where they are used).
from locust import User, constant, task
from locust.env import Environment
from locust.exception import StopUser

from client.request import CompletionRequest
from client.results import CodegenError, TimedOutError, error_message, resolve_target
from client.transport import ResponseStream, Transport
from contract import metrics as names
from contract.prompts import stdlib_sources
from contract.tensors import MODEL_STAGE
from loadtest.soak.users import write_locust_reports  # and grpc made gevent-cooperative
from reporting.events import EventLog
from reporting.triton import read_snapshot

LOCAL = ("127.0.0.1", "localhost", "[::1]")
STALL_S = 120.0  # a stream with no answer for this long is stalled
DEADLINE_ERRORS = ("Deadline", "deadline", "timeout", "Timeout", "cancelled", "Cancelled")


@functools.cache
def _sources() -> tuple[str, ...]:
    texts = []
    for path in stdlib_sources()[:400]:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            texts.append(path.read_text(encoding="utf-8"))
    return tuple(text for text in texts if len(text) > 3000)


def code_prompt(rng: random.Random, chars: int) -> str:
    """A file's text up to a cursor: ``chars`` characters of a standard-library module."""
    text = rng.choice(_sources())
    start = rng.randint(0, len(text) - chars) if len(text) > chars else 0
    return text[start : start + chars]


class StressUser(User):
    """One way of leaving, one request after another; ``args`` and the counters are the run's."""

    abstract = True
    wait_time = constant(0)
    pattern = ""
    args: argparse.Namespace
    in_flight = 0
    last_completion = 0.0
    index = itertools.count()

    def on_start(self) -> None:
        self.rng = random.Random(self.args.seed * 1000 + next(StressUser.index))
        self.sent = 0

    def prompt(self) -> str:
        return code_prompt(self.rng, self.rng.randint(*self.args.prompt_chars))

    def request(self, max_tokens: int) -> CompletionRequest:
        seed = self.rng.randint(0, 9999)
        return CompletionRequest((self.prompt(),), max_tokens=max_tokens, top_k=5, seed=seed)

    def measure(self, name: str, send: Callable[[], tuple[str, bool, str]]) -> None:
        """``send`` as one request event; it returns (how it ended, completed, error)."""
        if self.sent >= self.args.max_requests:
            raise StopUser()
        self.sent += 1
        StressUser.in_flight += 1
        began, wall = time.perf_counter(), time.time()
        try:
            ended, completed, error = send()
        except CodegenError as exc:
            ended, completed, error = "error", False, str(exc)
        finally:
            StressUser.in_flight -= 1
        if completed:
            StressUser.last_completion = time.monotonic()
        outcome = "error" if error else "ok" if completed else "abandoned"
        self.environment.events.request.fire(
            request_type=self.pattern,
            name=name,
            response_time=(time.perf_counter() - began) * 1e3,
            response_length=0,
            exception=CodegenError(error[:300]) if error else None,
            start_time=wall,
            context={"outcome": outcome, "ended": ended},
        )

    def leave(
        self, name: str, target: Any, keep: int | None, open_: Callable[[Transport], ResponseStream]
    ) -> None:
        """A stream read for ``keep`` answers (None: to its end), then dropped as an editor does."""

        def send() -> tuple[str, bool, str]:
            with Transport(target, STALL_S) as transport:
                stream, pieces = open_(transport), 0
                try:
                    while keep is None or pieces < keep:
                        if (piece := stream.read(STALL_S)) is None:
                            return "error", False, f"no answer within {STALL_S:g} s (stalled)"
                        pieces += 1
                        if piece.final:
                            return "finished", True, ""
                    return "left", False, ""
                finally:
                    stream.abandon()

        self.measure(name, send)


class GrpcCancel(StressUser):
    """A gRPC stream read for 0-8 pieces, then cancelled as the project's client does."""

    pattern, read_all = "grpc-cancel", False

    @task
    def stream(self) -> None:
        request = self.request(self.rng.choice((8, 16, 32)) if self.read_all else 64)
        keep = None if self.read_all else self.rng.randint(0, 8)
        self.leave("stream", self.args.grpc, keep, lambda t: t.stream(request))


class GrpcFull(GrpcCancel):
    pattern, read_all = "grpc-full", True


class HttpAbandon(StressUser):
    """Triton's HTTP ``generate_stream`` closed after 0-8 events."""

    pattern = "http-abandon"

    @task
    def abandon(self) -> None:
        request, target = self.request(64), resolve_target(self.args.http, "http")
        self.leave("generate_stream", target, self.rng.randint(0, 8), lambda t: t.stream(request))


class Unary(StressUser):
    """Unary gRPC requests, half of them given up by a client deadline."""

    pattern = "unary"

    @task
    def unary(self) -> None:
        request = self.request(self.rng.choice((8, 16, 32)))
        deadline = self.rng.choice((None, self.rng.uniform(0.05, 1.0)))

        def send() -> tuple[str, bool, str]:
            with Transport(self.args.grpc, deadline or STALL_S) as transport:
                try:
                    transport.infer(request, f"stress-{self.rng.getrandbits(64):x}")
                except CodegenError as exc:
                    text = str(exc)
                    gave_up = isinstance(exc, TimedOutError) or any(
                        w in text for w in DEADLINE_ERRORS
                    )
                    return "given up", False, "" if deadline and gave_up else text
            return "answered", True, ""

        self.measure("infer", send)


class ApiAbandon(StressUser):
    """With ``--api``: a streamed ``/v1/completions`` closed after 0-8 events, or a plain one
    given up by a short timeout."""

    pattern = "api-abandon"

    @task
    def abandon(self) -> None:
        body, api = {"prompt": self.prompt(), "max_tokens": 48, "temperature": 0.2}, self.args.api
        if self.rng.random() < 0.7:
            keep = self.rng.randint(0, 8)
            self.leave("stream", resolve_target(api, "http"), keep, lambda t: t.openai_stream(body))
            return
        timeout = self.rng.uniform(0.05, 1.0)
        import httpx

        def send() -> tuple[str, bool, str]:
            try:
                answer = httpx.post(f"{api}/v1/completions", json=body, timeout=timeout)
            except httpx.TimeoutException:
                return "left", False, ""  # the client gave up, as an editor does
            if answer.status_code != 200:
                return "error", False, error_message(answer.content, answer.status_code)
            return "finished", True, ""

        self.measure("completion", send)


def released(metrics_url: str, timeout: float = 60.0) -> list[str]:
    """What is still held once the traffic stopped (empty: everything was let go)."""
    gauges = (names.PENDING_REQUEST_COUNT, names.ENGINE_RUNNING, names.CALLS_IN_FLIGHT)
    deadline = time.monotonic() + timeout
    while True:
        series = read_snapshot(metrics_url).series.items()
        held = [
            f"{name}{{model={dict(labels).get('model')}}} = {value:g}"
            for (name, labels), value in series
            if name in gauges and value
        ]
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(1.0)


def answers_at_once(grpc: str, timeout: float = 30.0) -> list[str]:
    """A new stream, a new unary request and a call of the model stage, each answered within
    ``timeout`` seconds."""
    problems = []
    request = CompletionRequest(("def answer():\n",), max_tokens=8)
    with Transport(grpc, timeout) as transport:
        inputs = []
        for name, value in (
            ("input_ids", [5, 6, 7, 8]),
            ("input_lengths", [4]),
            ("request_output_len", [4]),
        ):
            inputs.append(transport.module.InferInput(name, [1, len(value)], "UINT32"))
            inputs[-1].set_data_from_numpy(np.array([value], dtype=np.uint32))
        for what, ask in (
            ("a unary request", lambda: transport.infer(request, "stress-after")),
            (
                "a model-stage call",
                lambda: transport.call("infer", MODEL_STAGE, inputs, client_timeout=timeout),
            ),
            ("a stream", lambda: list(transport.stream(request).pieces())),
        ):
            try:
                ask()
            except CodegenError as exc:
                problems.append(f"{what} after the run failed: {exc}")
    return problems


def longest_gap(frame: Any) -> float:
    """The longest interval without a completion, from the run's start (table time)."""
    ok = frame[frame["outcome"] == "ok"]
    ends = sorted(ok["started_s"] + ok["latency_ms"] / 1e3)
    return max((b - a for a, b in zip([0.0, *ends], ends, strict=False)), default=0.0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", default="127.0.0.1:8001")
    parser.add_argument("--http", default="127.0.0.1:8000")
    parser.add_argument("--metrics", default="http://127.0.0.1:8002/metrics")
    parser.add_argument("--api", help="the OpenAI-compatible API's base URL")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--cancel-threads", type=int, default=8, help="grpc-cancel users")
    parser.add_argument("--stall", type=float, default=30.0, help="seconds without a completion")
    parser.add_argument("--max-requests", type=int, default=5000, help="per user")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="a folder for events.csv and Locust's reports")
    parser.add_argument(
        "--prompt-chars",
        type=lambda text: tuple(map(int, text.split(","))),
        default=(800, 1600),
        help="MIN,MAX, within the context",
    )
    args = parser.parse_args(argv)
    for address in (args.grpc, args.http, args.metrics, *([args.api] if args.api else [])):
        if address.split("://")[-1].rsplit(":", 1)[0] not in LOCAL:
            raise SystemExit(f"{address}: the stress test sends traffic to this machine only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = {GrpcCancel: args.cancel_threads, GrpcFull: 1, HttpAbandon: 2, Unary: 2}
    if args.api:
        counts[ApiAbandon] = 4
    for cls, count in counts.items():
        cls.fixed_count, cls.args = count, args
    events = EventLog(profile="stress", window="stress")
    env = Environment(user_classes=list(counts), stop_timeout=150.0)
    events.attach(env)
    runner = env.create_local_runner()
    users = sum(counts.values())
    print(f"stress: {users} users for {args.duration:.0f} s ...", flush=True)
    StressUser.last_completion = began = time.monotonic()
    runner.start(users, spawn_rate=users)
    runner.spawning_greenlet.join()  # every user started (each stops after --max-requests)
    stalled = False
    while time.monotonic() - began < args.duration and runner.user_count and not stalled:
        gevent.sleep(min(5.0, max(0.1, args.duration - (time.monotonic() - began))))
        gap = time.monotonic() - StressUser.last_completion if StressUser.in_flight else 0.0
        if stalled := gap > args.stall:
            print(f"STALL: nothing completed for {gap:.0f} s", flush=True)
    env.stop_timeout = 1.0 if stalled else 150.0  # users end the request they are in
    runner.quit()
    frame = events.frame().assign(ended=lambda f: f.get("ended", ""))
    if args.out:
        events.save(args.out / "events.csv")
        write_locust_reports(env, args.out)
    print("outcomes:", dict((frame["kind"] + " " + frame["ended"]).value_counts().sort_index()))
    print(f"longest interval without a completion: {longest_gap(frame):.1f} s")
    failed = frame[frame["outcome"] == "error"]
    problems = [f"{k}: {e}" for k, e in zip(failed["kind"], failed["error"], strict=True)][:50]
    problems += ["stalled"] * stalled + answers_at_once(args.grpc)
    problems += [f"still held: {what}" for what in released(args.metrics)]
    for problem in problems:
        print("PROBLEM:", problem)
    print("PASS" if not problems else "FAIL", flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
