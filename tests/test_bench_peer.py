"""The llama.cpp peer section (bench/peer.py): opt-in by the binary's presence, the same
OpenAI SSE requests to each system recorded as event rows, wasted tokens read from a server's
own counter, and the report's ratios and targets. A stand-in OpenAI server (threads, no
model) answers, so every count is known by construction."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import report
from bench.peer import (
    ABANDONS,
    LLAMA,
    PROJECT,
    Peer,
    ask,
    closed_window,
    mid_line,
    peer_ratio,
    peer_table,
    wasted_tokens,
)
from bench.settings import make_plan
from bench.targets import target_rows
from client.results import resolve_target
from client.transport import Transport
from reporting.events import EventLog

PIECES = 3  # a one-line answer from the stand-in: three pieces, then usage
GENERATED_PER_REQUEST = 5  # what the stand-in "generates" for every request, left or not


class StandIn(BaseHTTPRequestHandler):
    """``POST /v1/completions`` with ``stream``: PIECES chunks, a usage chunk, ``[DONE]``;
    every request adds GENERATED_PER_REQUEST to the server's counter first."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        self.server.generated += GENERATED_PER_REQUEST  # type: ignore[attr-defined]
        if body["prompt"] == "empty":  # a blank next line: no text, only the end
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n')
            self.wfile.write(b"data: [DONE]\n\n")
            return
        if body["prompt"] == "fail":
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "boom"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"text": "x"}]}] * PIECES
        chunks.append({"choices": [], "usage": {"completion_tokens": PIECES}})
        try:
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass  # the client left

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.bodies, server.generated = [], 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def peer_on(server: ThreadingHTTPServer, name: str = LLAMA) -> Peer:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return Peer(
        name,
        url,
        [os.getpid()],
        lambda: float(server.generated),  # type: ignore[attr-defined]
        body={"cache_prompt": True},
    )


def test_llama_runs_by_default_only_where_the_binary_is_built():
    assert "llama" in make_plan(llama_available=True).sections
    assert "llama" not in make_plan(llama_available=False).sections
    assert make_plan(only="llama", llama_available=True).sections == ("llama",)
    with pytest.raises(ValueError, match="make llama-server"):
        make_plan(only="kernels,llama", llama_available=False)


def test_a_request_is_one_greedy_one_line_row(stand_in):
    log, peer = EventLog(profile="bench"), peer_on(stand_in)
    with Transport(resolve_target(peer.url, "http"), timeout=10) as transport:
        ask(transport, peer, "def f():\n", log, clients=1, window="w")
        ask(transport, peer, "fail", log, clients=1, window="w")
        ask(transport, peer, "empty", log, clients=1, window="w")
    body = stand_in.bodies[0]
    assert body["temperature"] == 0 and body["stop"] == ["\n"] and body["max_tokens"] == 32
    assert body["cache_prompt"] is True and body["prompt"] == "def f():\n"
    ok, failed, empty = log.frame().to_dict("records")
    assert (ok["system"], ok["outcome"], ok["tokens"], ok["clients"]) == (LLAMA, "ok", PIECES, 1)
    assert 0 < ok["first_token_ms"] <= ok["latency_ms"]
    assert failed["outcome"] == "error" and "boom" in failed["error"]
    assert empty["outcome"] == "ok" and empty["tokens"] == 1
    assert 0 < empty["first_token_ms"] <= empty["latency_ms"]  # the end is its first answer


def test_prompts_end_mid_line_like_an_editor_cursor():
    assert mid_line("def f(x):\n    return x + 1\n") == "def f(x):\n    return"
    assert mid_line("a\n\tb\n") == "a\n\tb"  # never less than one character after the indent


def test_closed_window_keeps_every_client_busy_and_counts_cpu(stand_in):
    log, peer = EventLog(profile="bench"), peer_on(stand_in)
    closed_window(peer, ["a\n", "b\n"], clients=3, seconds=0.3, log=log, window="3/0")
    frame = log.frame()
    assert len(frame) >= 3  # each client at least once, by construction
    assert set(frame["clients"]) == {3} and set(frame["window"]) == {"3/0"}
    assert set(frame["outcome"]) == {"ok"}
    assert set(b["prompt"] for b in stand_in.bodies) == {"a\n", "b\n"}
    assert peer.cpu_s[3] >= 0.0


def test_wasted_tokens_are_the_counter_less_what_the_clients_read(stand_in):
    log, peer = EventLog(profile="bench"), peer_on(stand_in)
    wasted = wasted_tokens(peer, [f"p{i}\n" for i in range(ABANDONS)], log)
    rows = log.frame()
    assert list(rows["outcome"]) == ["abandoned"] * ABANDONS and list(rows["tokens"]) == [1] * 8
    assert all(b["max_tokens"] > 32 and b["stop"] == [] for b in stand_in.bodies)
    assert wasted == GENERATED_PER_REQUEST - 1


def results_with(project: dict, llama: dict) -> dict:
    rows = [{"system": PROJECT, "clients": c, **project} for c in (1, 4, 16)]
    rows += [{"system": LLAMA, "clients": c, **llama} for c in (1, 4, 16)]
    return {
        "plan": {},
        "llama": {"rows": rows, "wasted": {PROJECT: 0.0, LLAMA: 2.0}, "half_window_s": 4.0},
    }


def test_the_report_gives_ratios_and_the_two_targets():
    results = results_with(
        {"latency_p50_ms": 300.0, "tokens_per_s": 50.0},
        {"latency_p50_ms": 200.0, "tokens_per_s": 40.0},
    )
    assert peer_ratio(results, "latency_p50_ms", 4) == 1.5
    title, _, headers, rows = peer_table(results)
    assert "llama.cpp" in title and headers[-1].strip() == "project/llama.cpp"
    assert ["16", "tokens/s", "50.0", "40.0", "1.25x"] in rows
    assert rows[-1][2:] == ["0.0", "2.0", "0.00x"]
    verdicts = {r["target"]: r["verdict"] for r in target_rows(results) if "llama" in r["target"]}
    assert sorted(verdicts.values()) == ["FAIL", "PASS"]  # one line slower, tokens/s faster
    assert any("llama.cpp" in t[0] for t in report.all_tables(results))
    assert not any("llama" in r["target"] for r in target_rows({"plan": {}}))
