"""``POST /v1/chat/completions`` against the real server of the test session (the tiny model),
its chat template given by the API's copy of the checkpoint: the official ``openai`` client,
plain and streamed, with exact usage; the body Continue sends; each bad input's 400 or 413 with
a plain request answered after them; a model with no template refused by name; a client that
leaves stops its generation."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from api_server import ApiServer, openai_client
from chat_checkpoint import END_OF_TURN, with_chat_template
from engine_hold import advance_until, engine_held, wait_for
from server_metrics import dropped_since, engine_counters
from test_client_cancel import assert_dropped, departure_seen, waits_at_engine

from client import CodegenClient, cli
from contract.tensors import ENGINE_MODEL
from openai_api import Settings

MESSAGES = [
    {"role": "system", "content": "You complete Python."},
    {"role": "user", "content": "def fib(n):\n"},
]
PROMPT = "### system\nYou complete Python.<fim_middle>\n### user\ndef fib(n):\n<fim_middle>\n"
PROMPT += "### assistant\n"
# what Continue's "openai" provider posts for a chat message (docs/api.md shows it)
CONTINUE_BODY = {
    "messages": [
        {"role": "system", "content": "You are an expert software developer."},
        {"role": "user", "content": [{"type": "text", "text": "def add(a, b):\n"}]},
    ],
    "model": "codegen",
    "max_tokens": 24,
    "temperature": 0,
    "top_p": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "stream": True,
    "stop": ["<|im_end|>"],
}


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The served checkpoint with a chat template in its tokenizer_config.json."""
    return with_chat_template(tiny_checkpoint, tmp_path_factory.mktemp("chat") / "checkpoint")


@pytest.fixture(scope="module")
def api(server, chat_checkpoint) -> Iterator[ApiServer]:
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=chat_checkpoint)) as running:
        yield running


@pytest.fixture(scope="module")
def plain_api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    """The served checkpoint as it is: no chat template."""
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


def chat(api: ApiServer, max_tokens: int = 24, **extra):
    options = {"temperature": 0, **extra}
    return openai_client(api).chat.completions.create(
        model="codegen", messages=MESSAGES, max_tokens=max_tokens, **options
    )


def reference(server, max_tokens: int):
    """The rendered prompt sent as a plain completion, streamed (the server's own counts)."""
    with CodegenClient(server.grpc_url, timeout=60) as codegen:
        options = {"temperature": 0.0, "stop_words": (END_OF_TURN,)}
        with codegen.stream(PROMPT, max_tokens, **options) as stream:
            text = "".join(stream)
    return text, stream.completion


def test_the_openai_chat_client_gets_the_templates_answer_with_exact_usage(server, api):
    result = chat(api)
    (choice,) = result.choices
    text, done = reference(server, 24)
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content == text
    assert result.usage.prompt_tokens == done.prompt_tokens
    assert result.usage.completion_tokens == done.completion_tokens
    assert result.usage.total_tokens == done.prompt_tokens + done.completion_tokens
    assert choice.finish_reason == ("length" if done.completion_tokens == 24 else "stop")
    # max_completion_tokens, the newer name, is the same limit
    newer = openai_client(api).chat.completions.create(
        model="codegen", messages=MESSAGES, max_completion_tokens=24, temperature=0
    )
    assert newer.choices[0].message.content == text


def test_streamed_chat_sends_the_role_first_then_content_then_usage(api):
    whole = chat(api, max_tokens=32)
    chunks = list(chat(api, max_tokens=32, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and not first.delta.content
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 3, "the answer did not come in pieces"
    assert "".join(texts) == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_seed_n_and_stop(api):
    options = {"temperature": 1.0, "seed": 5, "n": 2, "max_tokens": 16}
    first, again = chat(api, **options), chat(api, **options)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 32}
    full = chat(api, **sampled).choices[0].message.content
    cut = next(i for i in range(3, len(full) - 2) if full.find(full[i : i + 2]) == i)
    stopped = chat(api, stop=[full[cut : cut + 2]], **sampled).choices[0]
    assert stopped.message.content == full[:cut] and stopped.finish_reason == "stop"


def test_the_body_continue_sends(api):
    with httpx.stream("POST", f"{api.url}/v1/chat/completions", json=CONTINUE_BODY) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    answer = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    plain = httpx.post(
        f"{api.url}/v1/chat/completions", json=CONTINUE_BODY | {"stream": False}, timeout=60
    )
    assert answer and answer == plain.json()["choices"][0]["message"]["content"]


def test_models_say_which_chats(api, plain_api):
    (chatty,) = openai_client(api).models.list().data
    (plain,) = openai_client(plain_api).models.list().data
    assert (chatty.chat, plain.chat) == (True, False)  # type: ignore[attr-defined]


def test_a_model_without_a_chat_template_is_refused_by_name(plain_api):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client(plain_api).chat.completions.create(model="codegen", messages=MESSAGES)
    message = refused.value.body["message"]  # type: ignore[index]
    assert "has no chat template" in message and "POST /v1/completions" in message
    # and completions go on (greedy: sampled, the tiny model's first token is now and then
    # its end token, and the answer empty)
    plain = openai_client(plain_api).completions.create(
        model="codegen", prompt="def f():\n", max_tokens=4, temperature=0
    )
    assert plain.usage.completion_tokens > 0


@pytest.mark.parametrize(
    ("change", "status", "param", "words"),
    [
        ({"messages": []}, 400, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "role must be"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "messages", "content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "messages",
            "images",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "tool"),
        ({"response_format": {"type": "json_object"}}, 400, "response_format", "not supported"),
        ({"logprobs": True}, 400, "logprobs", "not supported"),
        ({"prompt": "x"}, 400, "prompt", "not of chat"),
        ({"temperature": -1}, 400, "temperature", "temperature"),
        ({"max_tokens": 600}, 413, "prompt", "exceeds the model's context"),
        ({"messages": [{"role": "user", "content": "x " * 600}]}, 413, "messages", "no room"),
    ],
)
def test_bad_input_gets_its_status_and_a_plain_request_is_answered_after(
    api, change, status, param, words
):
    body = {"model": "codegen", "messages": MESSAGES, "stream": False} | change
    for stream in (False, True):
        response = httpx.post(f"{api.url}/v1/chat/completions", json=body | {"stream": stream})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error
    assert chat(api, max_tokens=4).usage.completion_tokens > 0


def test_a_client_that_leaves_mid_stream_stops_its_generation(server, api):
    """As for completions: two events read, the client leaves; the engine, held after 16 steps
    and then let on 4 tokens at a time, drops the sequence far short of the tokens asked."""
    before = engine_counters(server)
    # no max_tokens: the rest of the context (about ASKED tokens), as OpenAI's chat defaults;
    # greedy, so that the answer is the same every run (sampled, the tiny model sometimes ended
    # its turn before the departure reached the engine, and nothing was left to cancel)
    body = {"model": "codegen", "messages": MESSAGES, "stream": True, "temperature": 0}
    url = f"{api.url}/v1/chat/completions"
    with engine_held(server, after_steps=16):
        with httpx.stream("POST", url, json=body, timeout=60) as response:
            assert response.status_code == 200
            events = (line for line in response.iter_lines() if line)
            assert all(next(events).startswith("data: {") for _ in range(2))
        advance_until(
            server,
            lambda: dropped_since(server, before),
            "the API's disconnect never reached the engine as a cancellation",
        )
    assert_dropped(server, before)


def test_a_client_that_leaves_before_the_answer_stops_its_generation(server, api):
    """Non-streamed (streamed from the engine model too): the client leaves while its request
    waits at a held engine."""
    before = engine_counters(server)
    body = json.dumps({"model": "codegen", "messages": MESSAGES}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with engine_held(server):
        sock = socket.create_connection(("127.0.0.1", api.port), timeout=30)
        sock.sendall(head + body)
        wait_for(lambda: waits_at_engine(server, ENGINE_MODEL), "the request never got in")
        sock.close()
        wait_for(lambda: departure_seen(server, ENGINE_MODEL, 0), "the departure was lost")
    assert_dropped(server, before, most=0)


# -- codegen chat ------------------------------------------------------------------------------


def test_codegen_chat_streams_the_answer(api):
    expected = chat(api).choices[0].message.content
    system, question = MESSAGES[0]["content"], MESSAGES[1]["content"]
    argv = ["chat", "--api-url", api.url, "--system", system, "--max-tokens", "24"]
    out = io.StringIO()
    assert cli.main([*argv, "--temperature", "0", question], stdout=out) == 0
    assert out.getvalue() == expected
    piped = io.StringIO()
    code = cli.main([*argv, "--temperature", "0"], stdout=piped, stdin=io.StringIO(question))
    assert code == 0 and piped.getvalue() == expected


def test_codegen_chat_says_why_a_model_cannot_chat(plain_api):
    err = io.StringIO()
    code = cli.main(["chat", "--api-url", plain_api.url, "hi"], stdout=io.StringIO(), stderr=err)
    assert code == cli.EXIT_SERVER_ERROR
    assert "HTTP 400" in err.getvalue() and "has no chat template" in err.getvalue()
