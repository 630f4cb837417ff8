"""The OpenAI-compatible API against the real server of the test session (the tiny model):
the official ``openai`` client, raw curl-shaped HTTP, every error status, a client that leaves a
stream (the playground in a real browser: test_playground.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from api_server import ApiServer, free_port, openai_client
from engine_hold import advance_until, engine_held, wait_for
from server_metrics import dropped_since, engine_counters

from client import CodegenClient
from contract.finish import openai_reason
from openai_api import Settings

PROMPT = "def fib(n):\n"


@pytest.fixture(scope="module")
def api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    """The API as `make api` runs it: the checkpoint's tokenizer at hand (unary path)."""
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


@pytest.fixture(scope="module")
def stream_only_api(server) -> Iterator[ApiServer]:
    """No tokenizer: every request is streamed from the engine model (the server's own counts)."""
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=None)) as running:
        yield running


@pytest.fixture(scope="module")
def strict_api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    """An API key required, and one request in flight at most."""
    settings = Settings(
        triton_url=server.grpc_url,
        checkpoint=tiny_checkpoint,
        api_key="test-secret",
        max_concurrent=1,
    )
    with ApiServer(settings) as running:
        yield running


@pytest.fixture(scope="module")
def down_api() -> Iterator[ApiServer]:
    """Pointed at a port where no Triton answers."""
    with ApiServer(Settings(triton_url=f"localhost:{free_port()}", checkpoint=None)) as running:
        yield running


def greedy(api: ApiServer, prompt: str = PROMPT, max_tokens: int = 24, **extra):
    return openai_client(api).completions.create(
        model="ensemble", prompt=prompt, max_tokens=max_tokens, temperature=0, **extra
    )


# -- the official OpenAI client -----------------------------------------------------------------


def test_greedy_completion_matches_the_client_library_with_exact_usage(server, api):
    result = greedy(api)
    (choice,) = result.choices
    with CodegenClient(server.grpc_url, timeout=60) as codegen:
        reference = codegen.complete(PROMPT, 24, temperature=0.0)
        with codegen.stream(PROMPT, 24, temperature=0.0) as stream:
            "".join(stream)
    assert choice.text == reference.completion
    assert result.object == "text_completion" and result.model == "ensemble"
    # the server's own counts (from the stream) equal the API's
    assert result.usage.prompt_tokens == stream.completion.prompt_tokens
    assert result.usage.completion_tokens == stream.completion.completion_tokens
    assert result.usage.total_tokens == reference.total_tokens
    assert choice.finish_reason == ("length" if result.usage.completion_tokens == 24 else "stop")
    assert choice.finish_reason == openai_reason(reference.finish_reason)


def test_both_paths_give_the_same_text_and_counts(api, stream_only_api):
    unary, streamed = greedy(api, max_tokens=20), greedy(stream_only_api, max_tokens=20)
    assert unary.choices[0].text == streamed.choices[0].text
    assert unary.usage == streamed.usage


def test_streaming_with_the_openai_client(api):
    whole = greedy(api, max_tokens=32)
    chunks = list(
        openai_client(api).completions.create(
            model="ensemble",
            prompt=PROMPT,
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 3, "the text did not come in pieces"
    assert "".join(texts) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_sampling_seed_n_and_several_prompts(api):
    client = openai_client(api)
    options = {"model": "ensemble", "max_tokens": 16, "temperature": 1.0, "seed": 7, "n": 2}
    prompts = ["import os\n", "class Stack:\n"]
    first = client.completions.create(prompt=prompts, **options)
    again = client.completions.create(prompt=prompts, **options)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded
    assert first.choices[0].text != first.choices[1].text  # choice i samples with seed + i
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    single = [client.completions.create(prompt=p, **options | {"n": 1}) for p in prompts]
    # prompt tokens count once per prompt, not once per choice
    assert first.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)
    assert first.choices[0].text == single[0].choices[0].text
    assert first.choices[2].text == single[1].choices[0].text
    unseeded = {
        client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=16).choices[0].text
        for _ in "ab"
    }
    assert len(unseeded) == 2, "temperature 1 by default: sampling, not greedy"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_are_cut_and_end_generation(api, stream):
    sampling = {"model": "ensemble", "prompt": PROMPT, "temperature": 1.0, "seed": 3}
    full = openai_client(api).completions.create(max_tokens=48, **sampling).choices[0].text
    # a stop sequence that first occurs a few characters in
    starts = [i for i in range(4, len(full) - 3) if full.find(full[i : i + 3]) == i]
    assert starts, f"no stop sequence to pick from {full!r}"
    stop = full[starts[0] : starts[0] + 3]
    expected = full[: starts[0]]
    if not stream:
        result = openai_client(api).completions.create(
            max_tokens=48, stop=[stop, "never-produced-😀"], **sampling
        )
        text, usage, reason = result.choices[0].text, result.usage, result.choices[0].finish_reason
    else:
        chunks = list(
            openai_client(api).completions.create(
                max_tokens=48,
                stop=stop,
                stream=True,
                stream_options={"include_usage": True},
                **sampling,
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    assert text == expected
    assert reason == "stop"
    assert usage.completion_tokens < 48


def test_echo_and_logprobs(api):
    echoed = greedy(api, max_tokens=8, echo=True).choices[0]
    plain = greedy(api, max_tokens=8).choices[0]
    assert echoed.text == PROMPT + plain.text
    result = greedy(api, max_tokens=8, logprobs=0)
    logprobs = result.choices[0].logprobs
    assert len(logprobs.token_logprobs) == result.usage.completion_tokens
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert any(lp < 0 for lp in logprobs.token_logprobs)


def test_models_and_health(api):
    models = openai_client(api).models.list()
    assert [m.id for m in models.data] == ["codegen"]  # only what completes (more in
    # tests/test_editor_clients.py); Triton's own models are in /health
    health = httpx.get(f"{api.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["streaming"] is True


# -- curl-shaped raw requests -------------------------------------------------------------------


def test_engines_route_as_copilot_plugins_call_it(api):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{api.url}/v1/engines/copilot-codex/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["choices"][0]["text"] == greedy(api, max_tokens=8).choices[0].text
    assert data["usage"]["completion_tokens"] > 0

    lines = []
    with httpx.stream(
        "POST", f"{api.url}/v1/engines/ensemble/completions", json=body | {"stream": True}
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in stream.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(line.startswith("data: ") for line in lines)
    assert "".join(e["choices"][0]["text"] for e in events) == data["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty is not supported"),
        ({"frequency_penalty": -1}, "frequency_penalty", "frequency_penalty is not supported"),
        ({"top_p": 1.5}, "top_p", "top_p must be in [0, 1], got 1.5"),
        ({"max_tokens": -5}, "max_tokens", "max_tokens must be a positive integer"),
        ({"temperature": -1}, "temperature", "temperature must be >= 0"),
        ({"prompt": ""}, "prompt", "is empty"),
        ({"prompt": [1, 2, 3]}, "prompt", "token-id prompts are not supported"),
        ({"logprobs": 3}, "logprobs", "use logprobs=0"),
        ({"n": 99}, "n", "n must be at least 1"),
        ({"stop": ["\n", ""]}, "stop", "stop must be"),
        ({"seed": -1}, "seed", "seed must be in"),
        ({"echo": True, "logprobs": 0}, "echo", "echo with logprobs"),
    ],
)
def test_a_bad_option_is_a_400_naming_it(api, change, param, words):
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": 4} | change
    response = httpx.post(f"{api.url}/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_the_openai_client_sees_the_400(api):
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        openai_client(api).completions.create(
            model="ensemble", prompt=PROMPT, max_tokens=4, presence_penalty=1.0
        )


def test_invalid_json_and_unknown_model(api):
    response = httpx.post(
        f"{api.url}/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="GET /v1/models"):
        openai_client(api).completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_a_413(api, stream):
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": 600, "stream": stream}
    response = httpx.post(f"{api.url}/v1/completions", json=body)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert "exceeds the model's context" in error["message"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"


def test_a_missing_or_wrong_key_is_a_401(strict_api):
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": 4}
    for headers, words in (
        ({}, "no API key given"),
        ({"Authorization": "Bearer wrong"}, "incorrect API key"),
    ):
        response = httpx.post(f"{strict_api.url}/v1/completions", json=body, headers=headers)
        assert response.status_code == 401
        assert words in response.json()["error"]["message"]
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{strict_api.url}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai_client(strict_api, "wrong").completions.create(**body)
    good = openai_client(strict_api, "test-secret").completions.create(**body)
    assert good.usage.completion_tokens > 0
    assert httpx.get(f"{strict_api.url}/health").status_code == 200  # probes need no key


def test_overloaded_is_a_503(strict_api):
    """One request in flight (the limit): the next is refused at once with 503."""
    headers = {"Authorization": "Bearer test-secret"}
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": 480}
    slots = strict_api.server.config.app.state.slots
    for _attempt in range(5):
        busy = threading.Thread(
            target=httpx.post,
            args=(f"{strict_api.url}/v1/completions",),
            kwargs={"json": body, "headers": headers, "timeout": 120},
        )
        busy.start()
        deadline = time.monotonic() + 10
        while slots.in_use == 0 and busy.is_alive():
            assert time.monotonic() < deadline, "the first request never started"
            time.sleep(0.005)
        response = httpx.post(
            f"{strict_api.url}/v1/completions",
            json=body | {"max_tokens": 1},
            headers=headers,
            timeout=120,
        )
        still_busy = busy.is_alive()
        busy.join()
        if still_busy:  # else the first one finished first: try again
            break
    assert still_busy, "the first request always finished before the second came"
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "overloaded"
    assert "retry later" in response.json()["error"]["message"]
    assert response.headers["retry-after"] == "1"
    assert slots.in_use == 0  # given back
    again = httpx.post(
        f"{strict_api.url}/v1/completions",
        json=body | {"max_tokens": 2},
        headers=headers,
        timeout=120,
    )
    assert again.status_code == 200


def test_triton_down_is_a_503(down_api):
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": 4}
    for stream in (False, True):
        response = httpx.post(f"{down_api.url}/v1/completions", json=body | {"stream": stream})
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "model_server_unavailable" and "make triton" in error["message"]
    assert httpx.get(f"{down_api.url}/health").status_code == 503
    with pytest.raises(openai.InternalServerError):
        openai_client(down_api).models.list()


# -- a client that leaves -----------------------------------------------------------------------


def test_a_client_that_leaves_a_stream_stops_its_generation(server, api):
    """Read two events of a long stream, disconnect, and watch the engine's own counters: the
    sequence must finish cancelled, far short of the tokens asked for. By construction: the
    engine holds after 16 steps and then advances only 4 tokens at a time until the
    cancellation has reached it."""
    asked = 480
    before = engine_counters(server)
    body = {"model": "ensemble", "prompt": PROMPT, "max_tokens": asked, "stream": True}
    with engine_held(server, after_steps=16):
        with httpx.stream("POST", f"{api.url}/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            events = (line for line in response.iter_lines() if line)
            received = [next(events), next(events)]
            assert all(line.startswith("data: {") for line in received)
        # the API learns that its client left when it writes the next piece
        advance_until(
            server,
            lambda: dropped_since(server, before),
            "the API's disconnect never reached the engine as a cancellation",
        )
    wait_for(
        lambda: (
            engine_counters(server)["codegen_engine_requests_total"]
            > before["codegen_engine_requests_total"]
        ),
        "the abandoned sequence never finished",
    )
    after = engine_counters(server)
    generated = (
        after["codegen_engine_generated_tokens_total"]
        - before["codegen_engine_generated_tokens_total"]
    )
    assert after["codegen_engine_cancelled_total"] - before["codegen_engine_cancelled_total"] == 1
    assert generated < asked, f"{generated:.0f} of {asked} tokens generated for nobody"


def test_a_suffix_the_served_model_cannot_fill_is_a_400_naming_suffix():
    """The server's tokenizer decides whether a model does fill-in-the-middle, so a model
    without FIM tokens refuses `suffix` in the stream (before any byte is sent); the API
    answers 400 naming the option, not 500."""
    from client import CodegenError
    from contract.fim import NO_FIM
    from openai_api.errors import from_client_error

    error = from_client_error(CodegenError(f"[StatusCode.INTERNAL] {NO_FIM}"), "127.0.0.1:8001")
    assert (error.status, error.body()["error"]["param"]) == (400, "suffix")
    assert NO_FIM in error.body()["error"]["message"]
