"""Closed-loop clients against the bare engine or the running server, and what they measure.

A *target* answers one request at a time per calling thread (``request(index, max_tokens)``
returns the tokens generated). The same loop drives the in-process engine and Triton, so the
served/bare ratio compares like with like. Each request uses the load test's sampling, a code
prompt and seed chosen by its index, and bans the end token so it makes every token asked for.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bench.models import END_OF_TEXT
from bench.settings import SAMPLED
from client import CodegenClient
from contract.options import SamplingParams
from engine import (
    CausalLM,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    Handle,
    KVCache,
    Segment,
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Record:
    """One finished request: who asked, for how many tokens, when, and what it got."""

    client: int
    wanted: int
    start: float
    end: float
    tokens: int


@dataclass
class Measurement:
    """A closed-loop run's requests and its measured window [w0, w1]."""

    records: list[Record]
    w0: float
    w1: float

    @property
    def window_s(self) -> float:
        return self.w1 - self.w0

    def rate(self) -> float:
        return windowed_rate(self.records, self.w0, self.w1)

    def short_of(self, wanted: int | None = None) -> int:
        """Requests (of ``wanted`` tokens, or all) that got fewer tokens than asked."""
        return sum(1 for r in self.records if r.tokens < r.wanted and wanted in (None, r.wanted))


def overlap(start: float, end: float, w0: float, w1: float) -> float:
    """Seconds of [start, end] inside [w0, w1]."""
    return max(0.0, min(end, w1) - max(start, w0))


def windowed_rate(records: Sequence[Record], w0: float, w1: float) -> float:
    """Tokens per second inside [w0, w1], each request's tokens spread evenly over its life.

    A closed loop always has requests in flight at both edges of the window; counting only
    the ones that fit inside would undercount, counting every one touching it would overcount.
    Crediting each the share of its lifetime inside the window is unbiased for a steady load.
    """
    if w1 <= w0:
        raise ValueError(f"empty window [{w0}, {w1}]")
    tokens = 0.0
    for r in records:
        life = r.end - r.start
        if life <= 0:
            tokens += r.tokens if w0 <= r.end <= w1 else 0
        else:
            tokens += r.tokens * overlap(r.start, r.end, w0, w1) / life
    return tokens / (w1 - w0)


def median_ms(values: Sequence[float]) -> float | None:
    return statistics.median(values) * 1000 if values else None


class _Pending:
    """A submitted engine request: wait() for its generated-token count."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: GenerationResult | None = None
        self.handle: Handle | None = None

    def on_token(self, token_id: int, log_prob: float) -> None:
        pass

    def on_finish(self, result: GenerationResult) -> None:
        self.result = result
        self.done.set()

    def wait(self) -> int:
        self.done.wait()
        assert self.result is not None
        if self.result.error and self.result.finish_reason != "cancelled":
            raise RuntimeError(f"engine request failed: {self.result.error}")
        return len(self.result.output_ids)


class BareTarget:
    """Threads submitting to an in-process backend: the engine with no server around it.

    ``end_id`` None bans ``eos`` as a bad word (the torch engine; one id, or every end id of a
    model with several); an id stands in for the end token instead (the openvino backend,
    which refuses bad words: bench/ov.py)."""

    name = "bare"

    def __init__(
        self,
        engine: GenerationBackend,
        prompts: Sequence[list[int]],
        eos: int | Sequence[int] | None,
        end_id: int | None = None,
        name: str = "bare",
    ) -> None:
        self.engine = engine
        self.prompts = list(prompts)
        ends = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.bad = [[end] for end in ends] if end_id is None else []
        self.end_id = end_id
        self.name = name
        self._pending: set[_Pending] = set()
        self._lock = threading.Lock()

    def submit(self, index: int, max_tokens: int) -> _Pending:
        pending = _Pending()
        request = GenerationRequest(
            self.prompts[index % len(self.prompts)],
            max_tokens,
            sampling=SamplingParams(**SAMPLED, seed=index),
            bad_words=self.bad,
            end_id=self.end_id,
            return_log_probs=False,
        )
        with self._lock:
            self._pending.add(pending)
        pending.handle = self.engine.submit(request, pending)
        return pending

    def wait(self, pending: _Pending) -> int:
        """The tokens ``pending`` generated, once it is done (then it is no longer tracked)."""
        try:
            return pending.wait()
        finally:
            with self._lock:
                self._pending.discard(pending)

    def request(self, index: int, max_tokens: int) -> int:
        return self.wait(self.submit(index, max_tokens))

    def cancel_all(self) -> None:
        """Cancel what is in flight (the long requests once a mixed window is over)."""
        with self._lock:
            for pending in self._pending:
                if pending.handle is not None:
                    pending.handle.cancel()

    def close(self) -> None:
        pass


class ServedTarget:
    """Threads calling the running server's unary ensemble over gRPC, one client per thread."""

    name = "served"

    def __init__(
        self,
        url: str,
        prompts: Sequence[str],
        prompt_tokens: Sequence[int],
        end_id: int | None = None,
        name: str = "served",
        end_words: Sequence[str] = (END_OF_TEXT,),
    ) -> None:
        self.url = url
        self.name = name
        # the end tokens banned (as text: the model's own, e.g. SmolLM2's <|im_end|>), or
        # (openvino, which refuses bad words) a stand-in end id
        self.end: dict = (
            {"end_id": end_id} if end_id is not None else {"bad_words": tuple(end_words)}
        )
        self.prompts = list(prompts)
        self.prompt_tokens = list(prompt_tokens)
        self._local = threading.local()
        self._clients: list = []
        self._lock = threading.Lock()

    def _client(self) -> CodegenClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = CodegenClient(self.url, "grpc")
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def request(self, index: int, max_tokens: int) -> int:
        i = index % len(self.prompts)
        completion = self._client().complete(
            self.prompts[i], max_tokens, **SAMPLED, seed=index, **self.end
        )
        return completion.total_tokens - self.prompt_tokens[i]

    def cancel_all(self) -> None:
        """Unary requests cannot be cancelled here: the loop waits for them."""

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()


def closed_loop(
    target: BareTarget | ServedTarget,
    wanted: Sequence[int],
    window_s: float,
    max_window_s: float,
    warmup_cap_s: float,
    first_index: int = 0,
    cancel_at_end: bool = False,
) -> Measurement:
    """One thread per entry of ``wanted`` (its output length), each sending its next request
    as soon as the last one is answered.

    The window opens once every client has had one answer (so the clients no longer move in
    step) or after ``warmup_cap_s``; it lasts ``window_s``, stretched to two of the slowest
    requests seen so far (at most ``max_window_s``) so long outputs are seen more than once.
    """
    stop = threading.Event()
    records: list[Record] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    counter = itertools.count(first_index)
    answered = [0] * len(wanted)

    def client(c: int, tokens: int) -> None:
        try:
            while not stop.is_set():
                with lock:
                    index = next(counter)
                start = time.perf_counter()
                got = target.request(index, tokens)
                end = time.perf_counter()
                with lock:
                    records.append(Record(c, tokens, start, end, got))
                    answered[c] += 1
        except BaseException as exc:  # surfaced by the caller after the join
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=client, args=(c, n), daemon=True, name=f"bench-client-{c}")
        for c, n in enumerate(wanted)
    ]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    while time.perf_counter() - began < warmup_cap_s and not stop.is_set():
        with lock:
            if all(answered):
                break
        time.sleep(0.02)
    w0 = time.perf_counter()
    with lock:
        slowest = max((r.end - r.start for r in records), default=0.0)
    window = min(max(window_s, 2 * slowest), max(window_s, max_window_s))
    stop.wait(window)
    w1 = time.perf_counter()
    stop.set()
    if cancel_at_end:
        target.cancel_all()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"a {target.name} client failed: {errors[0]}") from errors[0]
    return Measurement(records, w0, w1)


def static_batches(
    target: BareTarget, clients: int, tokens: int, window_s: float, first_index: int = 0
) -> tuple[float, int, int]:
    """The engine fed whole batches: ``clients`` requests at once, wait for all, repeat until
    ``window_s`` has passed. (tokens/s, rounds, requests short of ``tokens``)."""
    index = first_index
    generated = rounds = short = 0
    started = time.perf_counter()
    while rounds == 0 or time.perf_counter() - started < window_s:
        pending = [target.submit(index + i, tokens) for i in range(clients)]
        index += clients
        for p in pending:
            got = target.wait(p)
            generated += got
            short += got < tokens
        rounds += 1
    return generated / (time.perf_counter() - started), rounds, short


def latencies(
    target: BareTarget | ServedTarget, tokens: int, repeats: int, warmup: int = 2
) -> list[float]:
    """Seconds for one request alone, ``repeats`` times after ``warmup`` untimed ones; the
    same prompt and seed every time so only the path differs between targets."""
    for _ in range(warmup):
        target.request(0, tokens)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.request(0, tokens)
        seconds.append(time.perf_counter() - start)
    return seconds


def short_latencies(measurement: Measurement, wanted: int) -> list[float]:
    """Latencies of the ``wanted``-token requests that started inside the window and got all
    their tokens."""
    return [
        r.end - r.start
        for r in measurement.records
        if r.wanted == wanted and measurement.w0 <= r.start < measurement.w1 and r.tokens >= wanted
    ]


def forward_ceiling(
    model: CausalLM,
    prompt_lengths: Sequence[int],
    rows: int,
    length: int,
    repeats: int = 100,
    seed: int = 0,
    budget_s: float = 15.0,
) -> float:
    """Tokens/s of the model's decode forward pass alone, ``rows`` rows at the positions a
    closed loop of ``length``-token requests holds (a prompt's length plus a uniform share of
    ``length``): no sampling, no prefill, no serving. No scheduler can beat it, so it says
    how far a throughput target is from what the model itself does on this machine. Timed
    passes stop at ``repeats`` or once they have taken ``budget_s`` (a loaded machine)."""
    rng = random.Random(seed)
    positions = [rng.choice(prompt_lengths) + rng.randrange(length) for _ in range(rows)]
    device = next(model.parameters()).device
    cache = KVCache.empty(model.config, next(model.parameters()).dtype, device)
    cache.reserve(rows, max(positions) + 1)
    segment = Segment(
        torch.tensor(
            [[rng.randrange(model.config.vocab_size)] for _ in range(rows)], device=device
        ),
        torch.tensor(positions, device=device),
        torch.zeros(rows, dtype=torch.long, device=device),
        slice(0, rows),
    )
    for _ in range(3):
        model.step([segment], cache)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.step([segment], cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        if sum(seconds) >= budget_s:
            break
    return rows / statistics.median(seconds)
