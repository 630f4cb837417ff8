"""The client library: URL handling and option checks offline, then everything against the real
server of the test session (the tiny model), over gRPC and HTTP."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading

import psutil
import pytest
from engine_hold import advance_until, engine_held, wait_for
from server_metrics import dropped_since, engine_counters

from client import (
    CodegenClient,
    CodegenError,
    Completion,
    CompletionRequest,
    InvalidRequestError,
    ServerUnavailableError,
    resolve_target,
    split_completion,
)
from client.request import generate_body
from contract import metrics as names
from contract.tensors import (
    ENSEMBLE_INPUTS,
    ENSEMBLE_OUTPUTS,
    RESULT_OUTPUTS,
    STOP_INPUT,
)

PROMPT = "def fib(n):\n"
PROTOCOLS = ["grpc", "http"]


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def url_of(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.fixture(params=PROTOCOLS)
def codegen(request, server):
    """A client of the session's server, once per protocol."""
    with CodegenClient(url_of(server, request.param), request.param, timeout=120) as client:
        yield client


# -- offline: URLs, protocols, option checks ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "protocol", "expected"),
    [
        (None, None, ("grpc", "localhost:8001", "grpc://localhost:8001")),
        (None, "http", ("http", "localhost:8000", "http://localhost:8000")),
        ("example.org", None, ("grpc", "example.org:8001", "grpc://example.org:8001")),
        ("example.org", "http", ("http", "example.org:8000", "http://example.org:8000")),
        ("localhost:9001", "grpc", ("grpc", "localhost:9001", "grpc://localhost:9001")),
        ("http://h:81/", None, ("http", "h:81", "http://h:81")),
        ("https://h", None, ("http", "h:8000", "https://h:8000")),
        ("grpc://h:5", "grpc", ("grpc", "h:5", "grpc://h:5")),
        ("[::1]:8001", None, ("grpc", "[::1]:8001", "grpc://[::1]:8001")),
    ],
)
def test_url_and_protocol_resolution(url, protocol, expected):
    target = resolve_target(url, protocol)
    assert (target.protocol, target.address, target.url) == expected
    assert target.ssl == (url or "").startswith("https")


@pytest.mark.parametrize(
    ("url", "protocol", "words"),
    [
        (None, "rest", "protocol must be 'grpc' or 'http'"),
        ("grpc://h:1", "http", "is grpc but protocol is 'http'"),
        ("ftp://h", None, "url scheme must be"),
        ("h:notaport", None, "invalid port"),
        ("h:1/v2/models", None, "without a path"),
        (":8001", None, "no host"),
    ],
)
def test_bad_url_or_protocol_is_named(url, protocol, words):
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        CodegenClient(url, protocol)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_tokens": -5}, "max_tokens must be a positive integer"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"top_p": 1.5}, "runtime_top_p must be in [0, 1]"),
        ({"top_p": -0.1}, "runtime_top_p must be in [0, 1]"),
        ({"top_k": -1}, "runtime_top_k must be >= 0"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"seed": -1}, "random_seed must be in [0, 2**64)"),
        ({"end_id": -1}, "end_id must be a token id"),
    ],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_invalid_options_are_refused_before_sending(protocol, options, words):
    """Nothing listens at the URL: the error must be the option's, not "unreachable"."""
    client = CodegenClient(f"localhost:{closed_port()}", protocol)
    options = dict(options)
    max_tokens = options.pop("max_tokens", 8)
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        client.complete(PROMPT, max_tokens, **options)
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        client.stream(PROMPT, max_tokens, **options)
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        client.complete_batch([PROMPT, "x"], max_tokens, **options)


def test_empty_prompt_and_multi_prompt_stream_are_refused():
    client = CodegenClient(f"localhost:{closed_port()}")
    with pytest.raises(InvalidRequestError, match="prompt 0 is empty"):
        client.complete("")
    with pytest.raises(InvalidRequestError, match="one prompt per request"):
        client.open_stream(CompletionRequest(("a", "b")))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_not_running_names_the_url_and_make_triton(protocol):
    port = closed_port()
    client = CodegenClient(f"localhost:{port}", protocol)
    calls = {
        "complete": lambda: client.complete(PROMPT, 4),
        "stream": lambda: list(client.stream(PROMPT, 4)),
        "health": client.health,
    }
    for call in calls.values():
        with pytest.raises(ServerUnavailableError) as caught:
            call()
        message = str(caught.value)
        assert f"{protocol}://localhost:{port}" in message
        assert "make triton" in message
        assert isinstance(caught.value, CodegenError)


def test_completion_split_from_the_full_text():
    assert split_completion("def f(", "def f(x):") == "x):"
    # a text that does not start with the prompt: drop the common prefix, never crash
    assert split_completion("abc\t", "abc    x") == "    x"
    assert split_completion("abc", "xyz") == "xyz"


def test_http_stream_body_is_the_contract_tensors_as_scalars():
    request = CompletionRequest(("é",), 5, top_k=3, seed=7, stop_words=("a,b", "c"))
    body = generate_body(request)
    assert body["INPUT_0"] == "é"
    assert body["INPUT_1"] == 5
    assert body["INPUT_3"] == '"a,b",c'
    assert body["runtime_top_k"] == 3
    assert body["random_seed"] == 7
    assert body["is_return_log_probs"] is False
    assert set(body) == set(request.tensors())


def test_importable_without_server_torch_or_tritonclient():
    code = (
        "import sys, client; from client import CodegenClient; CodegenClient('nowhere:1');"
        "bad = [m for m in ('torch', 'tritonclient', 'grpc', 'gevent') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- against the session's server ---------------------------------------------------------------


def test_unary_completion(codegen):
    result = codegen.complete(PROMPT, max_tokens=12)
    assert isinstance(result, Completion)
    assert result.prompt == PROMPT
    assert result.text == PROMPT + result.completion
    assert result.completion
    assert result.total_tokens > 12  # prompt + 12 generated (the tiny model never ends early)
    assert result.latency_s > 0
    assert result.log_probs is None and result.cum_log_prob is None
    # the same request through the raw contract gives the same text
    assert codegen.send(CompletionRequest((PROMPT,), 12))[0].text == result.text


def test_both_protocols_give_the_same_answer(server):
    answers = {
        protocol: CodegenClient(url_of(server, protocol), protocol).complete(
            PROMPT, 10, top_k=20, temperature=1.3, seed=11
        )
        for protocol in PROTOCOLS
    }
    assert answers["grpc"].text == answers["http"].text


def test_sampling_options_reach_the_server(codegen):
    greedy = codegen.complete(PROMPT, 16).completion
    seeded = [codegen.complete(PROMPT, 16, top_k=20, temperature=1.5, seed=3) for _ in range(2)]
    assert seeded[0].completion == seeded[1].completion != greedy
    other_seed = codegen.complete(PROMPT, 16, top_k=20, temperature=1.5, seed=4).completion
    assert other_seed != seeded[0].completion
    assert codegen.complete(PROMPT, 16, top_p=0.9, temperature=1.5, seed=3).completion != greedy
    penalised = codegen.complete(PROMPT, 16, repetition_penalty=3.0).completion
    assert penalised != greedy


def test_stop_and_bad_words(codegen):
    pieces = list(codegen.stream(PROMPT, 24))  # one piece per token for this ASCII text
    greedy = "".join(pieces)
    stopped = codegen.complete(PROMPT, 24, stop_words=[pieces[1]]).completion
    assert stopped.endswith(pieces[1])
    assert greedy.startswith(stopped) and len(stopped) < len(greedy)
    banned = list(codegen.stream(PROMPT, 24, bad_words=[pieces[0]]))
    assert banned[0] != pieces[0]
    assert "".join(banned) == codegen.complete(PROMPT, 24, bad_words=[pieces[0]]).completion


def test_an_answer_ends_at_a_stop_word_found_in_its_text_not_its_tokens(codegen):
    """A stop word that no token sequence of the answer spells (it ends inside a token, or
    spans two): the engine's match on tokens cannot see it; the match on the text ends the
    answer there, streamed (the stop word last) or unary, and says so in the account."""
    pieces = list(codegen.stream(PROMPT, 24))  # one piece per token for this ASCII text
    greedy = "".join(pieces)
    at = next(i for i in range(len(pieces) - 1) if len(pieces[i]) > 1 and pieces[i + 1])
    stop = pieces[at][-1] + pieces[at + 1][0]
    end = greedy.find(stop) + len(stop)
    tokens = next(n for n in range(1, len(pieces) + 1) if len("".join(pieces[:n])) >= end)
    stream = codegen.stream(PROMPT, 24, stop_words=[stop])
    assert "".join(stream) == greedy[:end]
    assert stream.completion.finish_reason == "stop_word"
    assert stream.completion.completion_tokens == tokens < 24
    # unary, through the ensemble: the engine's row matches the same text and ends at the
    # same token, which it keeps whole (the model stage's answer is whole tokens)
    unary = codegen.complete(PROMPT, 24, stop_words=[stop])
    assert unary.completion == "".join(pieces[:tokens])
    assert (unary.finish_reason, unary.completion_tokens) == ("stop_word", tokens)


def test_log_probs(codegen):
    result = codegen.complete(PROMPT, 8, return_log_probs=True)
    assert result.log_probs is not None and len(result.log_probs) == 8
    assert all(p <= 0 for p in result.log_probs)
    assert result.cum_log_prob == pytest.approx(sum(result.log_probs), rel=1e-4)
    streamed = codegen.stream(PROMPT, 8, return_log_probs=True)
    assert "".join(streamed) == result.completion
    assert streamed.completion is not None
    assert streamed.completion.log_probs == pytest.approx(result.log_probs, rel=1e-4)
    assert streamed.completion.cum_log_prob == pytest.approx(result.cum_log_prob, rel=1e-4)


def test_batch_is_one_request_with_each_prompts_answer(codegen):
    prompts = [PROMPT, "import os\n", "class Tree:\n    def __init__(self"]
    batch = codegen.complete_batch(prompts, 10)
    assert [r.prompt for r in batch] == prompts
    for prompt, result in zip(prompts, batch, strict=True):
        alone = codegen.complete(prompt, 10)
        assert result.text == alone.text
        assert result.total_tokens == alone.total_tokens


def test_stream_pieces_concatenate_to_the_unary_completion(codegen):
    unary = codegen.complete(PROMPT, 20)
    stream = codegen.stream(PROMPT, 20)
    pieces = list(stream)
    assert len(pieces) > 1
    assert all(pieces)
    assert "".join(pieces) == unary.completion
    done = stream.completion
    assert done is not None
    assert done.text == unary.text
    assert done.total_tokens == unary.total_tokens
    assert done.completion_tokens == 20
    assert done.prompt_tokens == unary.total_tokens - 20
    assert done.first_piece_s is not None and 0 < done.first_piece_s <= done.latency_s


def test_stream_delivers_pieces_as_they_are_generated(codegen, server):
    """No buffering on the way (SSE included), by construction: the engine holds after 24
    steps, so the first pieces must arrive while most of the 250 tokens are not generated."""
    with engine_held(server, after_steps=24):
        stream = codegen.stream(PROMPT, 250)
        first = next(stream)  # the engine cannot finish before the block ends
        assert first
    pieces = [first, *stream]
    assert len(pieces) > 100
    done = stream.completion
    assert done is not None and done.completion_tokens == 250


def test_concurrent_streams_share_one_connection_to_the_server(server):
    """Each stream rides its own kept session (a client and its open stream), but gRPC shares
    one subchannel between channels to one address with the same settings: four streams in
    flight at once add no TCP connection to the server's gRPC port."""
    port = int(server.grpc_url.rsplit(":", 1)[1])

    def connections() -> int:
        return sum(
            1
            for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )

    with CodegenClient(server.grpc_url, "grpc", timeout=120) as client:
        list(client.stream(PROMPT, 4))  # a kept session: one connection, if there was none
        before = connections()
        opened, release = threading.Barrier(5), threading.Event()

        def hold_a_stream() -> None:
            with CodegenClient(server.grpc_url, "grpc", timeout=120) as own:
                stream = own.stream(PROMPT, 64)
                next(stream)  # in flight: its first piece came
                opened.wait(60)
                release.wait(60)
                list(stream)

        threads = [threading.Thread(target=hold_a_stream) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            opened.wait(60)
            during = connections()
        finally:
            release.set()
            for thread in threads:
                thread.join(60)
    assert before >= 1 and during == before, (before, during)


def test_stream_of_multibyte_text(codegen):
    prompt = "# naïve café → 日本語\n"
    unary = codegen.complete(prompt, 12)
    assert unary.text.startswith(prompt)
    assert "".join(codegen.stream(prompt, 12)) == unary.completion


def test_server_errors_carry_the_servers_message(codegen):
    words = "exceeds the model's context"
    with pytest.raises(CodegenError, match=words) as caught:
        codegen.complete(PROMPT, 100_000)
    assert not isinstance(caught.value, ServerUnavailableError)
    stream = codegen.stream(PROMPT, 100_000)  # validated locally, refused by the server
    with pytest.raises(CodegenError, match=words):
        next(stream)


def test_health_and_metadata(codegen):
    assert codegen.is_live() and codegen.is_ready()
    assert codegen.is_ready("ensemble") and codegen.is_ready("ensemble_stream")
    health = codegen.health()
    assert health.serving and health.live and health.ready
    assert health.url == codegen.url
    assert health.server_version
    served = {m.name for m in health.models if m.state == "READY"}
    models = {"ensemble", "ensemble_stream", "preprocessing", "gptj", "postprocessing", "engine"}
    assert models <= served
    metadata = codegen.model_metadata()
    inputs = {s.name for s in (*ENSEMBLE_INPUTS, STOP_INPUT)}
    assert {i["name"] for i in metadata["inputs"]} == inputs
    outputs = {s.name for s in (*ENSEMBLE_OUTPUTS, *RESULT_OUTPUTS)}  # the seed's and the account
    assert {o["name"] for o in metadata["outputs"]} == outputs
    assert health.to_dict()["streaming"] is True


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_that_goes_away_stops_the_generation(server, protocol):
    """Read two pieces of a long stream, close it, and watch the engine's own counters: the
    sequence must finish cancelled, having generated far fewer than the tokens asked for. By
    construction: the engine holds after 16 steps, then advances 4 tokens at a time until the
    engine (which serves the stream) has seen the client leave and dropped the sequence."""
    asked = 480
    before = engine_counters(server)
    client = CodegenClient(url_of(server, protocol), protocol, timeout=60)
    with engine_held(server, after_steps=16):
        with client.stream(PROMPT, asked) as stream:
            for _, _piece in zip(range(2), stream, strict=False):
                pass
        advance_until(
            server,
            lambda: dropped_since(server, before),
            "the client's departure never reached the engine as a cancellation",
        )
    wait_for(
        lambda: engine_counters(server)[names.ENGINE_REQUESTS] > before[names.ENGINE_REQUESTS],
        "the abandoned sequence never finished",
    )
    after = engine_counters(server)
    generated = after[names.ENGINE_GENERATED_TOKENS] - before[names.ENGINE_GENERATED_TOKENS]
    # the sequence was dropped as cancelled, before it reached its max_tokens (16 steps, then
    # at most 100 advances of 4: fewer than asked)
    assert after[names.ENGINE_CANCELLED] - before[names.ENGINE_CANCELLED] == 1
    assert generated < asked, f"{generated:.0f} of {asked} tokens generated for nobody"
