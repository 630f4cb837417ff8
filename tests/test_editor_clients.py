"""The OpenAI API as editor clients call it, on the real server of the test session: the exact
request shapes of Tabby's ``openai/completion`` backend and of Continue's autocomplete (OpenAI
provider, legacy completions endpoint), ``suffix`` through the official ``openai`` client, and
``/v1/models`` as a client that takes the first model sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from api_server import ApiServer, openai_client
from transformers import PreTrainedTokenizerFast

from client import CodegenClient, CompletionRequest
from openai_api import Settings
from preprocessing.tokenize import Preprocessor

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n    return total\n"
CONTINUE_PROMPT = f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"  # its StarCoder template
KEY = "editor-secret"
# what Continue's default (StarCoder-style) autocomplete template stops on
CONTINUE_STOPS = [
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<file_sep>",
    "<|endoftext|>",
    "</fim_middle>",
    "</code>",
]


@pytest.fixture(scope="module")
def keyed_api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    settings = Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint, api_key=KEY)
    with ApiServer(settings) as running:
        yield running


@pytest.fixture(scope="module")
def greedy_middle(server) -> str:
    """The middle the server's own client gets for PREFIX/SUFFIX, greedy, 12 tokens."""
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        request = CompletionRequest(PREFIX, max_tokens=12, temperature=0.0, suffix=SUFFIX)
        return codegen.send(request)[0].completion


@pytest.fixture(scope="module")
def template_middle(server) -> str:
    """What the server's own client gets, greedy, for Continue's rendered StarCoder template
    (PSM in text; a ``suffix`` request gets SPM when the checkpoint trained it)."""
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        request = CompletionRequest(CONTINUE_PROMPT, max_tokens=12, temperature=0.0)
        shown = codegen.send(request)[0].completion  # a FIM sequence shows prefix + middle
        assert shown.startswith(PREFIX)
        return shown.removeprefix(PREFIX)


def sse_events(response: httpx.Response) -> tuple[list[dict], list[str]]:
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    payloads = [line.removeprefix("data: ") for line in lines]
    return [json.loads(p) for p in payloads if p != "[DONE]"], payloads


def check_chunks(events: list[dict], model: str) -> str:
    """Every chunk as an OpenAI completion chunk, one choice; the text they carry."""
    assert events
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    for event in events:
        assert event["object"] == "text_completion" and event["model"] == model
        assert isinstance(event["created"], int)
        (choice,) = event["choices"]
        assert choice["index"] == 0 and choice["logprobs"] is None
        assert isinstance(choice["text"], str)
    reasons = [e["choices"][0]["finish_reason"] for e in events]
    assert reasons[-1] in ("stop", "length") and set(reasons[:-1]) <= {None}
    return "".join(e["choices"][0]["text"] for e in events)


def test_models_lists_one_model_that_completes_and_the_first_one_works(keyed_api):
    client = openai_client(keyed_api, KEY)
    models = client.models.list().data
    assert [m.id for m in models] == ["codegen"]
    assert models[0].model_extra["aliases"] == ["ensemble", "ensemble_stream"]
    result = client.completions.create(model=models[0].id, prompt="x = ", max_tokens=2)
    assert result.model == "codegen" and result.choices[0].finish_reason in ("stop", "length")
    for alias in ("ensemble", "ensemble_stream"):
        assert client.completions.create(model=alias, prompt="x", max_tokens=1).model == alias


def test_tabby_openai_completion_backend(server, keyed_api, greedy_middle):
    """Tabby's `openai/completion` body (model, prompt, suffix, max_tokens, temperature,
    stream: true, presence_penalty) with its Bearer key; it reads choices[0].text of each SSE
    event until one has a finish_reason."""
    body = {
        "model": "codegen",
        "prompt": PREFIX,
        "suffix": SUFFIX,
        "max_tokens": 12,
        "temperature": 0.0,
        "stream": True,
        "presence_penalty": 0.0,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{keyed_api.url}/v1/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events, payloads = sse_events(response)
    assert payloads[-1] == "[DONE]"
    assert check_chunks(events, "codegen") == greedy_middle
    # no FIM: Tabby sends "suffix": null
    with httpx.stream(
        "POST", url, json=body | {"suffix": None}, headers=headers, timeout=120
    ) as response:
        assert response.status_code == 200
        plain = check_chunks(sse_events(response)[0], "codegen")
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        assert plain == codegen.send(CompletionRequest(PREFIX, 12, temperature=0.0))[0].completion
    # Tabby's presence_penalty is a setting: non-zero is refused, naming it
    refused = httpx.post(url, json=body | {"presence_penalty": 0.5}, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "presence_penalty"
    # and the key is required
    assert httpx.post(url, json=body).status_code == 401
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_continue_autocomplete_with_its_starcoder_template(keyed_api, template_middle):
    """Continue's autocomplete through its OpenAI provider: the legacy completions endpoint,
    the prompt rendered with its default template (the default model's own sentinels), its stop
    words, temperature 0.01, stream: true, a Bearer key."""
    body = {
        "model": "codegen",
        "max_tokens": 12,
        "temperature": 0.01,
        "stream": True,
        "stop": CONTINUE_STOPS,
        "prompt": CONTINUE_PROMPT,
    }
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"{keyed_api.url}/v1/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        events, payloads = sse_events(response)
    assert payloads[-1] == "[DONE]"
    text = check_chunks(events, "codegen")
    assert not any(stop in text for stop in CONTINUE_STOPS)
    # the template's sentinels are the model's FIM tokens: greedy, the middle is the client's
    with httpx.stream(
        "POST", url, json=body | {"temperature": 0}, headers=headers, timeout=120
    ) as response:
        assert check_chunks(sse_events(response)[0], "codegen") == template_middle


@pytest.mark.parametrize("stream", [False, True])
def test_suffix_through_the_official_openai_client(
    keyed_api, greedy_middle, tiny_checkpoint, stream
):
    client = openai_client(keyed_api, KEY)
    options = {"model": "codegen", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12}
    if stream:
        chunks = list(client.completions.create(**options, temperature=0, stream=True))
        text = "".join(c.choices[0].text for c in chunks)
    else:
        result = client.completions.create(**options, temperature=0)
        text = result.choices[0].text
        assert result.usage.completion_tokens >= 1
        # the prompt tokens are the FIM prompt's: prefix, suffix and three sentinels, less the
        # prefix's last token when healing holds it back (docs/generation.md#token-healing)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
        fim = f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"
        pre = Preprocessor(tiny_checkpoint)
        held = pre.extensions.heals(pre.encode(PREFIX)[-1])
        expected = len(tokenizer.encode(fim, add_special_tokens=False)) - held
        assert result.usage.prompt_tokens == expected
        echoed = client.completions.create(**options, temperature=0, echo=True)
        assert echoed.choices[0].text == PREFIX + greedy_middle
    assert text == greedy_middle


def test_a_bad_suffix_is_a_400_naming_it(keyed_api):
    body = {"model": "codegen", "prompt": PREFIX, "suffix": 3, "max_tokens": 4}
    response = httpx.post(
        f"{keyed_api.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "suffix"
