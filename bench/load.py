"""Closed-loop clients against the bare engine or the running server, and what they measure.

A *target* answers ``request(index, max_tokens)`` with the tokens generated; the same loop
drives the in-process engine and Triton, so served/bare compares like with like. Each request
uses the load test's sampling, a code prompt and seed chosen by its index, and bans the end
token; each is a row of a pandas table (:mod:`reporting.events`' ``started_s``, ``latency_ms``,
``tokens``, with the ``client`` and the tokens it ``wanted``). The served side is a real Triton
on a copy of the model repository, on free ports, so the benchmark neither touches a server
someone runs on 8000-8002 nor depends on what ``model_repository/`` holds.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch

import engine
from bench.models import END_OF_TEXT
from bench.settings import SAMPLED
from client import CodegenClient
from contract.options import SamplingParams
from reporting.triton import Endpoints, ServedTriton, open_triton
from serving import model_config
from serving.paths import MODEL_REPOSITORY, checkpoint_dir
from serving.process import free_ports
from serving.triton import Ports


class Pending(engine.NullListener):
    """A submitted engine request: the time of its first token, and its result once done."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: engine.GenerationResult | None = None
        self.first: float | None = None
        self.handle: engine.Handle | None = None

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.first = self.first or time.perf_counter()

    def on_finish(self, result: engine.GenerationResult) -> None:
        self.result = result
        self.done.set()

    def wait(self) -> engine.GenerationResult:
        """The result; RuntimeError for a failed request (a cancelled one is a result)."""
        self.done.wait()
        assert self.result is not None
        if self.result.error and self.result.finish_reason != "cancelled":
            raise RuntimeError(f"engine request failed: {self.result.error}")
        return self.result


class Measurement:
    """A closed-loop run's requests (one row each: client, wanted, started_s, latency_ms,
    tokens) and its measured window [w0, w1]."""

    def __init__(self, frame: pd.DataFrame, w0: float, w1: float) -> None:
        self.frame, self.w0, self.w1, self.window_s = frame, w0, w1, w1 - w0

    def rate(self) -> float:
        return windowed_rate(self.frame, self.w0, self.w1)

    def short_of(self) -> int:
        """Requests that got fewer tokens than they asked for."""
        return int((self.frame["tokens"] < self.frame["wanted"]).sum())

    def latencies(self, wanted: int) -> list[float]:
        """Seconds of the ``wanted``-token requests that started inside the window and got all
        their tokens."""
        f = self.frame
        if f.empty:
            return []
        chosen = (f["wanted"] == wanted) & (f["tokens"] >= wanted)
        chosen &= (f["started_s"] >= self.w0) & (f["started_s"] < self.w1)
        return list(f.loc[chosen, "latency_ms"] / 1e3)


def windowed_rate(frame: pd.DataFrame, w0: float, w1: float) -> float:
    """Tokens per second inside [w0, w1], each request's tokens spread evenly over its life: a
    closed loop has requests in flight at both edges, and crediting each the share of its life
    inside is unbiased for a steady load (counting only those inside would undercount)."""
    if w1 <= w0:
        raise ValueError(f"empty window [{w0}, {w1}]")
    start, life = frame["started_s"], frame["latency_ms"] / 1e3
    end = start + life
    inside = (end.clip(upper=w1) - start.clip(lower=w0)).clip(lower=0)
    at_once = ((end >= w0) & (end <= w1)).astype(float)  # a zero-length life: in or out
    share = (inside / life.where(life > 0)).fillna(at_once)
    return float((frame["tokens"] * share).sum()) / (w1 - w0)


def median_ms(values: Sequence[float]) -> float | None:
    return statistics.median(values) * 1000 if values else None


class BareTarget:
    """Threads submitting to an in-process backend: the engine with no server around it.
    ``end_id`` None bans ``eos`` (one id, or several) as bad words (the torch engine); an id
    stands in for the end token instead (openvino refuses bad words: bench/systems.py)."""

    def __init__(
        self,
        backend: engine.GenerationBackend,
        prompts: Sequence[list[int]],
        eos: int | Sequence[int] | None,
        end_id: int | None = None,
        name: str = "bare",
    ) -> None:
        self.engine, self.prompts, self.end_id, self.name = backend, list(prompts), end_id, name
        ends = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.bad = [[end] for end in ends] if end_id is None else []
        self._pending: set[Pending] = set()
        self._lock = threading.Lock()

    def submit(self, index: int, max_tokens: int) -> Pending:
        pending = Pending()
        request = engine.GenerationRequest(
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

    def wait(self, pending: Pending) -> int:
        """The tokens ``pending`` generated, once it is done (then it is no longer tracked)."""
        try:
            return len(pending.wait().output_ids)
        finally:
            with self._lock:
                self._pending.discard(pending)

    def request(self, index: int, max_tokens: int) -> int:
        return self.wait(self.submit(index, max_tokens))

    def cancel_all(self) -> None:
        """Cancel what is in flight (the long requests once a mixed window is over)."""
        with self._lock:
            for handle in [p.handle for p in self._pending if p.handle is not None]:
                handle.cancel()


class ServedTarget:
    """Threads calling the running server's unary ensemble over gRPC, one client per thread.
    The end tokens are banned as text (the model's own, e.g. SmolLM2's ``<|im_end|>``), or
    (openvino, which refuses bad words) a stand-in end id is sent."""

    def __init__(
        self,
        url: str,
        prompts: Sequence[str],
        prompt_tokens: Sequence[int],
        end_id: int | None = None,
        name: str = "served",
        end_words: Sequence[str] = (END_OF_TEXT,),
    ) -> None:
        self.url, self.name = url, name
        self.end = {"end_id": end_id} if end_id is not None else {"bad_words": tuple(end_words)}
        self.prompts, self.prompt_tokens = list(prompts), list(prompt_tokens)
        self._local = threading.local()
        self._clients: list[CodegenClient] = []

    def request(self, index: int, max_tokens: int) -> int:
        if (client := getattr(self._local, "client", None)) is None:
            client = self._local.client = CodegenClient(self.url, "grpc")
            self._clients.append(client)  # list.append is atomic: no lock
        i = index % len(self.prompts)
        # whole, as the bare pipeline gets it: the same prompt tokens on both sides
        done = client.complete(
            self.prompts[i], max_tokens, **SAMPLED, seed=index, token_healing=False, **self.end
        )
        return done.total_tokens - self.prompt_tokens[i]

    def cancel_all(self) -> None:
        """Unary requests cannot be cancelled here: the loop waits for them."""

    def close(self) -> None:
        while self._clients:
            self._clients.pop().close()


def closed_loop(
    target: BareTarget | ServedTarget,
    wanted: Sequence[int],
    window_s: float,
    max_window_s: float,
    warmup_cap_s: float,
    cancel_at_end: bool = False,
) -> Measurement:
    """One thread per entry of ``wanted`` (its output length), each sending its next request as
    soon as the last is answered. The window opens once every client has had an answer (they no
    longer move in step) or after ``warmup_cap_s``; it lasts ``window_s``, stretched to two of the
    slowest requests so far (at most ``max_window_s``)."""
    stop, lock, rows, errors = threading.Event(), threading.Lock(), [], []
    t0, next_index = time.perf_counter(), iter(range(1 << 62)).__next__

    def client(c: int, tokens: int) -> None:
        try:
            while not stop.is_set():
                with lock:
                    index = next_index()
                start = time.perf_counter()
                got = target.request(index, tokens)
                with lock:
                    rows.append(
                        {
                            "client": c,
                            "wanted": tokens,
                            "started_s": start - t0,
                            "latency_ms": (time.perf_counter() - start) * 1e3,
                            "tokens": got,
                        }
                    )
        except BaseException as exc:  # surfaced by the caller after the join
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=client, args=(c, n), daemon=True, name=f"bench-client-{c}")
        for c, n in enumerate(wanted)
    ]
    for thread in threads:
        thread.start()
    while time.perf_counter() - t0 < warmup_cap_s and not stop.is_set():
        with lock:
            if len({r["client"] for r in rows}) == len(wanted):
                break
        time.sleep(0.02)
    w0 = time.perf_counter() - t0
    with lock:
        slowest = max((r["latency_ms"] / 1e3 for r in rows), default=0.0)
    stop.wait(min(max(window_s, 2 * slowest), max(window_s, max_window_s)))
    w1 = time.perf_counter() - t0
    stop.set()
    if cancel_at_end:
        target.cancel_all()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"a {target.name} client failed: {errors[0]}") from errors[0]
    columns = ["client", "wanted", "started_s", "latency_ms", "tokens"]
    return Measurement(pd.DataFrame(rows, columns=columns), w0, w1)


def static_batches(
    target: BareTarget, clients: int, tokens: int, window_s: float
) -> tuple[float, int, int]:
    """The engine fed whole batches: ``clients`` requests at once, wait for all, repeat until
    ``window_s`` has passed. (tokens/s, rounds, requests short of ``tokens``)."""
    generated = rounds = short = 0
    started = time.perf_counter()
    while rounds == 0 or time.perf_counter() - started < window_s:
        pending = [target.submit(rounds * clients + i, tokens) for i in range(clients)]
        got = [target.wait(p) for p in pending]
        generated, short = generated + sum(got), short + sum(n < tokens for n in got)
        rounds += 1
    return generated / (time.perf_counter() - started), rounds, short


def timed(call: Callable[[], object], count: int, warmup: int = 2) -> list[float]:
    """Seconds of ``count`` calls after ``warmup`` untimed ones (one request alone: the same
    prompt and seed every time, so only the path differs between targets)."""
    seconds = []
    for _ in range(warmup + count):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds[warmup:]


def forward_ceiling(
    model: engine.CausalLM,
    prompt_lengths: Sequence[int],
    rows: int,
    length: int,
    repeats: int = 100,
    seed: int = 0,
    budget_s: float = 15.0,
) -> float:
    """Tokens/s of the model's decode forward pass alone, ``rows`` rows at the positions a closed
    loop of ``length``-token requests holds: no scheduler can beat it, so it says how far a
    throughput target is from what the model itself does here (at most ``budget_s`` of passes)."""
    rng = random.Random(seed)
    positions = [rng.choice(prompt_lengths) + rng.randrange(length) for _ in range(rows)]
    weights = next(model.parameters())
    cache = engine.KVCache.empty(model.config, weights.dtype, weights.device)
    cache.reserve(rows, max(positions) + 1)
    tokens = [[rng.randrange(model.config.vocab_size)] for _ in range(rows)]
    at = torch.tensor(positions, device=weights.device)
    segment = engine.Segment(
        torch.tensor(tokens, device=weights.device), at, torch.zeros_like(at), slice(0, rows)
    )
    for _ in range(3):
        model.step([segment], cache)
    seconds: list[float] = []
    while len(seconds) < repeats and sum(seconds) < budget_s:
        start = time.perf_counter()
        model.step([segment], cache)
        if weights.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return rows / statistics.median(seconds)


def served_engine_settings() -> dict[str, str | int]:
    """The served engine's batch size, prefill and KV-cache budgets and dtype, so the bare
    engine matches."""
    params = model_config.parameters(model_config.read(MODEL_REPOSITORY / "engine"))
    return {
        "max_batch_size": int(params.get("engine_max_batch_size", 32)),
        "max_prefill_tokens": int(params.get("engine_max_prefill_tokens", 4096)),
        "kv_cache_tokens": int(params.get("kv_cache_tokens", 0)),
        "dtype": params.get("dtype", "float32"),
    }


@contextmanager
def running_server(
    checkpoint: Path,
    workdir: Path,
    log_file: Path,
    device: str,
    backend: str = "torch",
    parameters: dict[str, str] | None = None,
) -> Iterator[ServedTriton]:
    """Triton serving ``checkpoint`` from a fresh repository copy under ``workdir``; the device
    and backend go to the engine model through CODEGEN_DEVICE and CODEGEN_BACKEND, and
    ``parameters`` replace those of its config (KeyError for one it lacks: never ignored)."""
    repo = workdir / "model_repository"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("checkpoint"))
    shutil.copytree(checkpoint, checkpoint_dir(repo))
    if parameters:
        config = model_config.read(repo / "engine")
        model_config.set_parameters(config, parameters)
        model_config.write(repo / "engine", config)
    previous = {name: os.environ.get(name) for name in ("CODEGEN_DEVICE", "CODEGEN_BACKEND")}
    os.environ.update(CODEGEN_DEVICE=device, CODEGEN_BACKEND=backend)
    try:
        with open_triton(Endpoints.local(Ports(*free_ports(3))), repo, log_file) as server:
            yield server
    finally:
        for name, value in previous.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})
