"""Section ``llama``: the project served beside llama.cpp's ``llama-server``, same weights.

The project runs as a user runs it: Triton on a copy of the repository (openvino, the engine
config as shipped) behind the OpenAI API; llama.cpp serves the GGUF the default model was made
from, with the engine's KV budget. Both get the same OpenAI SSE requests (:mod:`client.transport`):
code prompts cut mid-line as at an editor's cursor, greedy, one line; every prompt is sent once
to each first, so both caches are warm. At 1, 4 and 16 closed-loop clients the systems alternate
in mirrored windows (A B B A); each request is a row of :class:`reporting.events.EventLog`, and
each side's CPU is read over its process tree. Abandoned requests, each left at its first piece,
say how many tokens a server generates for a client that has gone, from its own counter.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.format import Table, context, fmt, prose, ratio
from bench.load import running_server, served_engine_settings
from bench.models import CACHE
from client.results import resolve_target
from client.transport import Transport
from contract import metrics as names
from contract.prompts import code_prompts
from contract.tensors import ENGINE_MODEL
from loadtest.api_process import ApiProcess
from reporting.events import EventLog, summarize
from reporting.llama_server import PREDICTED, LlamaServer, checkpoint_gguf, llama_server_binary
from reporting.machine import tree_cpu_seconds
from reporting.triton import read_snapshot
from serving.process import free_port

CLIENTS = (1, 4, 16)
ONE_LINE = {"max_tokens": 32, "temperature": 0, "stop": ["\n"]}
ABANDON_TOKENS = 64  # an abandoned request asks for this many, and leaves after one piece
ABANDONS = 8
PROMPTS = 16
PROJECT, LLAMA = "project", "llama.cpp"
ONE_LINE_AT_MOST = 1.0  # the project's one-line p50 over llama.cpp's
TOKENS_AT_LEAST = 1.0  # the project's tokens/s at 16 clients over llama.cpp's
Progress = Callable[[str], None]


@dataclass
class Peer:
    """One system as the clients see it: an OpenAI base URL, its processes, its counter."""

    name: str
    url: str  # http://127.0.0.1:port
    pids: list[int]
    generated: Callable[[], float]  # tokens generated so far, from the server's own counter
    body: dict[str, Any] = field(default_factory=dict)  # what this server's requests add
    parallel: int = 0  # llama-server's slots (0: not llama.cpp)
    cpu_s: dict[int, float] = field(default_factory=dict)  # per client count
    wall_s: dict[int, float] = field(default_factory=dict)  # its windows' length, per count

    def transport(self) -> Transport:
        """A client transport to this server's OpenAI API (one per client thread)."""
        return Transport(resolve_target(self.url, "http"), timeout=120.0)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the process trees so far (psutil)."""
        return tree_cpu_seconds(self.pids)


def mid_line(text: str) -> str:
    """A code prompt cut in the middle of its last line (its indent and half its text), as
    an editor's cursor is: the one-line answer is the rest of that line, not a blank line."""
    *head, last = text.rstrip("\n").split("\n")
    indent = len(last) - len(last.lstrip())
    return "\n".join([*head, last[: indent + max(1, (len(last) - indent) // 2)]])


def ask(
    transport: Any, peer: Peer, prompt: str, log: Any, leave_first: bool = False, **row: Any
) -> None:
    """One streamed request, recorded as a row of ``log``; ``leave_first``: close the stream
    at its first piece of text (an editor that moved on)."""
    body = {
        "model": "ensemble",
        "prompt": prompt,
        **ONE_LINE,
        **peer.body,
        "stream_options": {"include_usage": True},
    }
    if leave_first:
        body.update(max_tokens=ABANDON_TOKENS, stop=[])
    sent, first, pieces, usage, error = time.perf_counter(), None, 0, {}, ""
    outcome = "abandoned" if leave_first else "ok"
    try:
        stream = transport.openai_stream(body)
        try:
            while not (leave_first and first is not None):
                if (piece := stream.read(transport.timeout)) is None:
                    raise TimeoutError(f"no answer within {transport.timeout:g} s")
                if piece.text and first is None:
                    first = piece.arrived - sent
                pieces, usage = pieces + bool(piece.text), piece.usage or usage
                if piece.final:
                    break
        finally:
            stream.abandon() if leave_first else stream.close()
    except Exception as exc:  # a failed request is a row, never a crash of the window
        outcome, error = "error", str(exc) or type(exc).__name__
    if first is None and outcome == "ok":  # an empty answer: it arrived with the end
        first = time.perf_counter() - sent
    log.record(
        system=peer.name,
        kind="openai",
        name="abandon" if leave_first else "one-line",
        latency_ms=(time.perf_counter() - sent) * 1e3,
        first_token_ms=None if first is None else first * 1e3,
        tokens=pieces if leave_first else usage.get("completion_tokens", pieces),
        outcome=outcome,
        error=error,
        **row,
    )


def closed_window(
    peer: Peer, prompts: list[str], clients: int, seconds: float, log: Any, window: str
) -> None:
    """``clients`` threads, each sending its next prompt as soon as its last is answered,
    until ``seconds`` have passed; the window's CPU seconds are added to ``peer.cpu_s``."""
    counter, deadline = itertools.count(), time.perf_counter() + seconds

    def client() -> None:
        with peer.transport() as transport:
            while True:  # every client sends at least once, however late its thread starts
                prompt = prompts[next(counter) % len(prompts)]  # count's next is atomic
                ask(transport, peer, prompt, log, clients=clients, window=window)
                if time.perf_counter() >= deadline:
                    return

    cpu0, began = peer.cpu_seconds(), time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # the last requests end after the deadline: their time counts too
    peer.cpu_s[clients] = peer.cpu_s.get(clients, 0.0) + peer.cpu_seconds() - cpu0
    peer.wall_s[clients] = peer.wall_s.get(clients, 0.0) + time.perf_counter() - began


def settled(read: Callable[[], float], timeout: float = 30.0) -> float:
    """A counter's value once two readings half a second apart agree (a server finishing
    what its clients left, and flushing its counters)."""
    last, deadline = read(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if (now := read()) == last:
            break
        last = now
    return last


def wasted_tokens(peer: Peer, prompts: list[str], log: Any) -> float:
    """Tokens generated per abandoned request after its client left: the server's counter
    over :data:`ABANDONS` requests, one at a time, less the piece each client read."""
    before = settled(peer.generated)
    with peer.transport() as transport:
        for prompt in prompts[:ABANDONS]:
            ask(transport, peer, prompt, log, leave_first=True, clients=1, window="abandon")
    frame = log.frame()
    read = frame[(frame["system"] == peer.name) & (frame["name"] == "abandon")]["tokens"]
    return (settled(peer.generated) - before - float(read.sum())) / ABANDONS


@contextmanager
def both_servers(
    checkpoint: Path, out: Path, progress: Progress, parallel: int | None = None
) -> Iterator[list[Peer]]:
    """The project (Triton + OpenAI API) and llama-server, both started; stopped on exit.
    llama-server gets one slot per client at the most clients: at the engine's batch (64
    slots) it collapsed here (3-6 s for a 4-token answer, docs/performance.md), which made its
    targets pass for a wrong reason."""
    llama_server_binary()  # before minutes of starting Triton: the error names the fix
    gguf, kv_tokens = checkpoint_gguf(checkpoint), served_engine_settings()["kv_cache_tokens"]
    with ExitStack() as stack:
        progress("llama: starting Triton (openvino, the engine config as shipped) ...")
        log = out / "tritonserver-llama.log"
        triton = stack.enter_context(
            running_server(checkpoint, CACHE / "serving", log, "cpu", "openvino")
        )
        api = stack.enter_context(ApiProcess(triton.grpc_url, out / "openai-api.log"))
        llama = stack.enter_context(
            LlamaServer(
                gguf,
                free_port(),
                out / "llama-server.log",
                parallel=parallel or max(CLIENTS),
                ctx_size=int(kv_tokens) or 8192,
            )
        )
        metrics = triton.endpoints.metrics_url
        assert triton.launcher is not None and triton.launcher.process is not None
        assert api.process is not None and llama.process is not None
        progress(
            f"llama: both up; llama-server {gguf.name}, --parallel {llama.parallel}, "
            f"--ctx-size {llama.ctx_size}"
        )
        yield [
            Peer(
                PROJECT,
                api.url,
                [triton.launcher.process.pid, api.process.pid],
                lambda: read_snapshot(metrics).value(
                    names.ENGINE_GENERATED_TOKENS, model=ENGINE_MODEL
                ),
            ),
            Peer(
                LLAMA,
                llama.url,
                [llama.process.pid],
                lambda: read_snapshot(f"{llama.url}/metrics").value(PREDICTED),
                body={"cache_prompt": True},
                parallel=llama.parallel,
            ),
        ]


def run_peer(
    checkpoint: Path,
    half_window_s: float,
    out: Path,
    progress: Progress,
    parallel: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The section's results: per system and client count the summary of its rows, its CPU,
    and its wasted tokens per abandoned request; the rows in ``out/llama-events.csv``."""
    prompts = [mid_line(text) for text in code_prompts(PROMPTS, seed=seed)]
    log = EventLog(profile="bench")
    result: dict[str, Any] = {"clients": list(CLIENTS), "half_window_s": half_window_s}
    with both_servers(checkpoint, out, progress, parallel) as peers:
        result["llama_parallel"] = peers[1].parallel
        for peer in peers:  # every prompt once: warm caches, compiled paths
            with peer.transport() as transport:
                for prompt in prompts:
                    ask(transport, peer, prompt, log, clients=1, window="warm-up")
            progress(f"llama: {peer.name} warmed on {len(prompts)} prompts")
        for clients in CLIENTS:
            for n, peer in enumerate(peers + peers[::-1]):  # mirrored: A B B A
                closed_window(peer, prompts, clients, half_window_s, log, f"{clients}/{n}")
            progress(f"llama: {clients} clients measured")
        result["wasted"] = {p.name: wasted_tokens(p, prompts, log) for p in peers}
        result["cpu_s"] = {p.name: p.cpu_s for p in peers}
        result["wall_s"] = {p.name: p.wall_s for p in peers}
    log.save(out / "llama-events.csv")
    frame = log.frame()
    measured = frame[~frame["window"].isin(["warm-up", "abandon"])]
    per_window = summarize(measured, by=["system", "clients", "window"])
    rates = per_window.groupby(["system", "clients"])["tokens_per_s"].mean()
    rows = summarize(measured, by=["system", "clients"]).to_dict("records")
    tokens = measured.groupby(["system", "clients"])["tokens"].sum()
    for row in rows:
        key = (system, clients) = (row["system"], row["clients"])
        cpu = result["cpu_s"][system].get(clients, 0.0)
        row.update(
            tokens_per_s=float(rates[key]),
            cpu_s=cpu,
            cpu_ms_per_token=cpu * 1e3 / float(tokens[key]) if tokens[key] else None,
            cores_used=ratio(cpu, result["wall_s"][system].get(clients)),
        )
    return {**result, "rows": rows}


def _row(results: dict[str, Any], system: str, clients: int) -> dict[str, Any]:
    rows = (results.get("llama") or {}).get("rows") or []
    return next((r for r in rows if r["system"] == system and r["clients"] == clients), {})


def peer_ratio(results: dict[str, Any], figure: str, clients: int) -> float | None:
    """The project's figure over llama.cpp's at ``clients``."""
    mine, theirs = _row(results, PROJECT, clients), _row(results, LLAMA, clients)
    return ratio(mine.get(figure), theirs.get(figure))


FIGURES = (
    ("first token p50 ms", "first_token_p50_ms", 0),
    ("first token p95 ms", "first_token_p95_ms", 0),
    ("one line p50 ms", "latency_p50_ms", 0),
    ("one line p95 ms", "latency_p95_ms", 0),
    ("tokens/s", "tokens_per_s", 1),
    ("CPU ms/token", "cpu_ms_per_token", 1),
    ("cores used", "cores_used", 2),
    ("requests", "requests", 0),
    ("failures", "failures", 0),
)


def peer_table(results: dict[str, Any]) -> Table:
    """Per client count, each system's figures and the project/llama.cpp ratio."""
    section = results.get("llama") or {}
    wasted = section.get("wasted") or {}
    lines = [
        (
            str(c),
            label,
            _row(results, PROJECT, c).get(figure),
            _row(results, LLAMA, c).get(figure),
            digits,
        )
        for c in CLIENTS
        for label, figure, digits in FIGURES
    ]
    lines.append(
        (
            "1",
            "tokens generated after the client left, per abandoned request",
            wasted.get(PROJECT),
            wasted.get(LLAMA),
            1,
        )
    )
    body = [
        [n, label, fmt(mine, digits), fmt(theirs, digits), fmt(ratio(mine, theirs), 2, "x")]
        for n, label, mine, theirs, digits in lines
    ]
    parallel, half = section.get("llama_parallel", "engine batch"), section.get("half_window_s")
    how = context(
        results,
        prose("peer", parallel=parallel, half=half),
        f"abandoned: {ABANDON_TOKENS}-token requests left at the first piece, counted "
        "by each server",
    )
    headers = ["clients", "figure", " project", " llama.cpp", " project/llama.cpp"]
    title = "The project served vs llama.cpp's llama-server, same SmolLM2 weights"
    return title, how, headers, body
