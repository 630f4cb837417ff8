"""An OpenAI request whose client leaves stops generating, on both paths: the
unary ensemble (the API sends a stop request with the choice's request id; with or without a
checkpoint at hand, since the engine counts the tokens) and the streamed one (with stop
sequences: the gRPC stream is cancelled). The API
watches for the disconnect while it waits, so it needs no piece from the engine to notice.

By construction: the engine is held, so the request waits at the engine's door however fast the
machine and whatever the model generates; the client leaves while it waits, and the engine goes
on (4 tokens at a time) only once the cancellation has reached it, so the sequence cannot have
finished first."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from api_server import ApiServer
from engine_hold import engine_held, wait_for
from server_metrics import cancels_sent, engine_counters
from test_client_cancel import ASKED, assert_dropped, departure_seen, waits_at_engine

from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from openai_api import Settings

PROMPT = "def fib(n):\n"


@pytest.fixture(scope="module")
def unary_api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


@pytest.fixture(scope="module")
def no_checkpoint_api(server) -> Iterator[ApiServer]:
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=None)) as running:
        yield running


def post_and_keep_open(api: ApiServer, body: dict) -> socket.socket:
    """A raw HTTP request whose connection the test closes when it chooses."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=30)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    sock.sendall(head + data)
    return sock


@pytest.mark.parametrize(
    ("which", "stop", "model"),
    [
        ("unary_api", None, MODEL_STAGE),
        ("unary_api", ["<never generated: Zq9>"], ENGINE_MODEL),
        ("no_checkpoint_api", None, MODEL_STAGE),
    ],
    ids=["unary", "stop-sequences", "no-tokenizer"],
)
def test_a_non_streamed_client_that_leaves_stops_its_generation(
    server, request, which, stop, model
):
    api = request.getfixturevalue(which)
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": ASKED, "temperature": 0}
    if stop:
        body["stop"] = stop
    before_engine = engine_counters(server)
    sent_before = cancels_sent(server, MODEL_STAGE)
    with engine_held(server):
        sock = post_and_keep_open(api, body)
        wait_for(lambda: waits_at_engine(server, model), f"the request never reached {model}")
        sock.close()  # the client leaves; the engine still holds
        wait_for(lambda: departure_seen(server, model, sent_before), "the departure was lost")
    assert_dropped(server, before_engine)


@pytest.mark.parametrize("which", ["unary_api", "no_checkpoint_api"])
def test_a_streamed_client_that_leaves_before_its_first_piece_stops_its_generation(
    server, request, which
):
    """An editor leaves while its long prompt is still being prefilled: no piece has been
    written, so only the API's watch on the connection can tell, and it must cancel the
    stream then rather than after the first piece (seconds later on a long prompt)."""
    api = request.getfixturevalue(which)
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": ASKED, "stream": True}
    before_engine = engine_counters(server)
    with engine_held(server):
        sock = post_and_keep_open(api, body)
        wait_for(lambda: waits_at_engine(server, ENGINE_MODEL), "the request never got in")
        sock.close()  # the client leaves before any piece; the engine still holds
        wait_for(lambda: departure_seen(server, ENGINE_MODEL, 0), "the departure was lost")
    assert_dropped(server, before_engine, most=0)
