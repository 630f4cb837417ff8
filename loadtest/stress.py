"""Stress the server with the ways editor clients leave requests, and check it survives.

    python -m loadtest.stress --grpc 127.0.0.1:8001 --http 127.0.0.1:8000 --duration 120
    python -m loadtest.stress ... --api http://127.0.0.1:8080   # also through the OpenAI API

Worker threads, each looping over one pattern until the run ends (bounded in time and count):

- ``grpc-cancel``: a gRPC stream to ``ensemble_stream`` with a long prompt, read for 0-8 pieces,
  then left the way the project's client leaves it (``stop_stream(cancel_requests=True)``);
- ``grpc-full``: the same stream read to its end (it must end);
- ``http-abandon``: Triton's HTTP ``generate_stream``, the connection closed after 0-8 events;
- ``unary``: the unary ``ensemble`` over gRPC, half of them with a client deadline that passes
  while they are queued or running;
- ``api-abandon`` (with ``--api``): a streamed ``/v1/completions`` closed after 0-8 events, and a
  non-streamed one given up by a short client timeout.

It fails (exit 1) on an unexpected error, on a stall (no request completed for ``--stall``
seconds while some were in flight), or when afterwards the server does not answer a new stream
and a new unary request at once, or a model still holds pending requests, engine rows or calls
in flight. Traffic goes to this machine only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import httpx

from client.request import CompletionRequest
from client.results import CodegenError, TimedOutError, error_message, resolve_target
from client.transport import ResponseStream, Transport
from contract import metrics as names
from contract.prompts import stdlib_sources
from contract.tensors import MODEL_STAGE
from reporting.triton import read_snapshot

LOCAL = ("127.0.0.1", "localhost", "[::1]")
STALL_S = 120.0  # a stream with no answer for this long is stalled
DEADLINE_ERRORS = ("Deadline", "deadline", "timeout", "Timeout", "cancelled", "Cancelled")


@dataclass
class Tally:
    """What happened, shared by the workers."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    last_completion: float = field(default_factory=time.monotonic)
    longest_gap: float = 0.0
    in_flight: int = 0

    def begin(self) -> None:
        with self.lock:
            self.in_flight += 1

    def end(self, outcome: str, completed: bool) -> None:
        now = time.monotonic()
        with self.lock:
            self.in_flight -= 1
            self.counts[outcome] += 1
            if completed:
                self.longest_gap = max(self.longest_gap, now - self.last_completion)
                self.last_completion = now

    def error(self, pattern: str, message: str) -> None:
        with self.lock:
            self.counts[f"{pattern} error"] += 1
            if len(self.errors) < 50:
                self.errors.append(f"{pattern}: {message[:300]}")

    def gap_now(self) -> float:
        with self.lock:
            return time.monotonic() - self.last_completion if self.in_flight else 0.0


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


PROMPT_CHARS = (800, 1600)  # long file prefixes that fit the default model's 1,024 tokens
PROMPT_CHARS_NOW = list(PROMPT_CHARS)  # this run's (--prompt-chars)


def _request(rng: random.Random, max_tokens: int) -> CompletionRequest:
    prompt = code_prompt(rng, rng.randint(*PROMPT_CHARS_NOW))
    return CompletionRequest((prompt,), max_tokens=max_tokens, top_k=5, seed=rng.randint(0, 9999))


def read_then_leave(
    pattern: str, open_stream: Callable[[], ResponseStream], keep: int | None, tally: Tally
) -> None:
    """Read ``keep`` answers of a stream (None: to its end), then drop it: a gRPC stream closed
    with a cancel, an HTTP connection closed, as an editor leaves them."""
    tally.begin()
    finished = False
    try:
        stream = open_stream()
        try:
            pieces = 0
            while keep is None or pieces < keep:
                piece = stream.read(STALL_S)
                if piece is None:
                    tally.error(pattern, f"no answer within {STALL_S:g} s (a stalled stream)")
                    return
                pieces += 1
                if piece.final:
                    finished = True
                    break
        finally:
            stream.abandon()
    except CodegenError as exc:
        tally.error(pattern, str(exc))
    finally:
        tally.end(f"{pattern} {'finished' if finished else 'left'}", completed=finished)


def grpc_stream(address: str, rng: random.Random, tally: Tally, read_all: bool) -> None:
    """One gRPC stream: read ``0-8`` pieces then cancel it, or read it to its end."""
    request = _request(rng, 64 if not read_all else rng.choice((8, 16, 32)))
    keep = None if read_all else rng.randint(0, 8)
    pattern = "grpc-full" if read_all else "grpc-cancel"
    read_then_leave(pattern, lambda: Transport(address, STALL_S).stream(request), keep, tally)


def http_abandon(address: str, rng: random.Random, tally: Tally) -> None:
    """Triton's HTTP generate_stream, the connection closed after 0-8 events."""
    request, keep = _request(rng, 64), rng.randint(0, 8)
    with Transport(resolve_target(address, "http"), STALL_S) as transport:
        read_then_leave("http-abandon", lambda: transport.stream(request), keep, tally)


def unary(address: str, rng: random.Random, tally: Tally) -> None:
    """The unary ensemble over gRPC; half of them given up by a short client deadline."""
    request = _request(rng, rng.choice((8, 16, 32)))
    deadline = rng.choice((None, rng.uniform(0.05, 1.0)))
    transport = Transport(address, deadline or STALL_S)
    tally.begin()
    completed = False
    try:
        transport.infer(request, f"stress-{rng.getrandbits(64):x}")
        completed = True
    except CodegenError as exc:
        gave_up = isinstance(exc, TimedOutError) or any(w in str(exc) for w in DEADLINE_ERRORS)
        if deadline is None or not gave_up:
            tally.error("unary", str(exc))
    finally:
        transport.close()
        tally.end(f"unary {'answered' if completed else 'given up'}", completed=completed)


def api_abandon(api: str, rng: random.Random, tally: Tally) -> None:
    """A /v1/completions request: streamed and closed after 0-8 events, or non-streamed and
    given up by a short client timeout."""
    body = {"prompt": code_prompt(rng, rng.randint(*PROMPT_CHARS_NOW)), "max_tokens": 48,
            "temperature": 0.2}  # fmt: skip
    if rng.random() < 0.7:
        keep = rng.randint(0, 8)
        with Transport(resolve_target(api, "http"), STALL_S) as transport:
            read_then_leave("api-abandon", lambda: transport.openai_stream(body), keep, tally)
        return
    tally.begin()
    finished = False
    try:
        answer = httpx.post(f"{api}/v1/completions", json=body, timeout=rng.uniform(0.05, 1.0))
        if answer.status_code != 200:
            tally.error("api-abandon", error_message(answer.content, answer.status_code))
        finished = answer.status_code == 200
    except httpx.TimeoutException:
        pass  # the client gave up, as an editor does
    except Exception as exc:
        tally.error("api-abandon", repr(exc))
    finally:
        tally.end(f"api {'finished' if finished else 'left'}", completed=finished)


def _worker(job: Callable[[random.Random], None], seed: int, until: float, limit: int) -> None:
    rng = random.Random(seed)
    for _ in range(limit):
        if time.monotonic() >= until:
            return
        job(rng)


def released(metrics_url: str, timeout: float = 60.0) -> list[str]:
    """What is still held once the traffic stopped (empty: everything was let go)."""
    gauges = (names.PENDING_REQUEST_COUNT, names.ENGINE_RUNNING, names.CALLS_IN_FLIGHT)
    deadline = time.monotonic() + timeout
    while True:
        series = read_snapshot(metrics_url).series.items()
        held = [f"{name}{{model={dict(labels).get('model')}}} = {value:g}"
                for (name, labels), value in series if name in gauges and value]  # fmt: skip
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(1.0)


def answers_at_once(grpc: str, timeout: float = 30.0) -> list[str]:
    """A new stream and a new unary request, each answered within ``timeout`` seconds."""
    problems = []
    request = CompletionRequest(("def answer():\n",), max_tokens=8)
    transport = Transport(grpc, timeout)
    try:
        transport.infer(request, "stress-after")
        transport.call("infer", MODEL_STAGE, _stage_inputs(transport.module),
                       client_timeout=timeout)  # fmt: skip
    except CodegenError as exc:
        problems.append(f"a unary request after the run failed: {exc}")
    finally:
        transport.close()
    tally = Tally()
    grpc_stream(grpc, random.Random(0), tally, read_all=True)
    if tally.errors:
        problems.append(f"a stream after the run failed: {tally.errors}")
    return problems


def _stage_inputs(module: ModuleType) -> list:
    import numpy as np

    arrays = {
        "input_ids": np.array([[5, 6, 7, 8]], dtype=np.uint32),
        "input_lengths": np.array([[4]], dtype=np.uint32),
        "request_output_len": np.array([[4]], dtype=np.uint32),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "UINT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _local(address: str) -> str:
    host = address.split("://")[-1].rsplit(":", 1)[0]
    if host not in LOCAL:
        raise SystemExit(f"{address}: the stress test sends traffic to this machine only")
    return address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", default="127.0.0.1:8001")
    parser.add_argument("--http", default="127.0.0.1:8000")
    parser.add_argument("--metrics", default="http://127.0.0.1:8002/metrics")
    parser.add_argument(
        "--api", help="the OpenAI-compatible API's base URL, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--cancel-threads", type=int, default=8)
    parser.add_argument("--stall", type=float, default=30.0, help="seconds without a completion")
    parser.add_argument("--max-requests", type=int, default=5000, help="per worker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--prompt-chars",
        default=",".join(map(str, PROMPT_CHARS)),
        help="the range of prompt lengths in characters, MIN,MAX (they must fit the context)",
    )
    args = parser.parse_args(argv)
    low, high = (int(x) for x in args.prompt_chars.split(","))
    PROMPT_CHARS_NOW[:] = [low, high]
    for address in (args.grpc, args.http, args.metrics, *([args.api] if args.api else [])):
        _local(address)

    tally = Tally()
    jobs: list[Callable[[random.Random], None]] = [
        *[lambda rng: grpc_stream(args.grpc, rng, tally, False)] * args.cancel_threads,
        lambda rng: grpc_stream(args.grpc, rng, tally, True),
        lambda rng: http_abandon(args.http, rng, tally),
        lambda rng: http_abandon(args.http, rng, tally),
        lambda rng: unary(args.grpc, rng, tally),
        lambda rng: unary(args.grpc, rng, tally),
    ]
    if args.api:
        jobs += [lambda rng: api_abandon(args.api, rng, tally)] * 4
    until = time.monotonic() + args.duration
    threads = [
        threading.Thread(target=_worker, args=(job, args.seed * 1000 + i, until, args.max_requests),
                         daemon=True)
        for i, job in enumerate(jobs)
    ]  # fmt: skip
    print(f"stress: {len(threads)} workers for {args.duration:.0f} s ...", flush=True)
    for thread in threads:
        thread.start()
    stalled = False
    while any(thread.is_alive() for thread in threads):
        time.sleep(5)
        gap = tally.gap_now()
        with tally.lock:
            done = sum(tally.counts.values())
        print(f"  {done} requests done, {tally.in_flight} in flight, {len(tally.errors)} errors, "
              f"{gap:.1f} s since the last completion", flush=True)  # fmt: skip
        if gap > args.stall:
            stalled = True
            print(f"STALL: nothing completed for {gap:.0f} s", flush=True)
            break
    for thread in threads:
        thread.join(timeout=150 if not stalled else 1)
    print("outcomes:", dict(sorted(tally.counts.items())))
    print(f"longest interval without a completion: {tally.longest_gap:.1f} s")
    problems = list(tally.errors)
    if stalled:
        problems.append("stalled")
    problems += answers_at_once(args.grpc)
    problems += [f"still held: {what}" for what in released(args.metrics)]
    for problem in problems:
        print("PROBLEM:", problem)
    print("PASS" if not problems else "FAIL", flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
