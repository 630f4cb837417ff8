"""Repository context (``input_extra``) and warm-up requests: the fitting rule on its own (a
counting function made for the test), what the API parses, and against the real openvino test
server that a warmed prompt is reused by the next keystroke and that what does not fit is
dropped by the rule and reported."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import httpx
import pytest
import tritonclient.grpc as grpcclient
from api_server import ApiServer
from server_metrics import sample, settled_scrape

from client import CodegenClient, CompletionRequest
from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from openai_api import Settings
from openai_api.capabilities import count_tokens
from openai_api.errors import OpenAIError
from openai_api.infill import parse_infill
from openai_api.repo_context import ContextChunk, fit_context, parse_chunks, with_chunks
from openai_api.request import parse_completion


class WordCounter:
    """Counts words plus one (a BOS) per prompt, and two for a suffix; remembers each call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, prompts: Sequence[str], suffix: str) -> list[int]:
        self.calls.append(list(prompts))
        return [len(p.split()) + 1 + (len(suffix.split()) + 2 if suffix else 0) for p in prompts]


CHUNKS = tuple(ContextChunk(f"f{i}.py", " ".join(["w"] * 10)) for i in range(4))


def test_everything_that_fits_goes_in_first_with_one_count():
    count = WordCounter()
    fitted = fit_context(CHUNKS, "def f(", "", budget=100, count=count)
    assert fitted.prompt == "w " * 9 + "w\n" + ("w " * 9 + "w\n") * 3 + "def f("
    assert (fitted.chunks_sent, fitted.chunks_used, fitted.prompt_tokens) == (4, 4, 43)
    assert len(count.calls) == 1
    assert fitted.usage() == {"input_extra_chunks": 4, "input_extra_chunks_used": 4}


@pytest.mark.parametrize(("budget", "used"), [(42, 3), (32, 2), (27, 2), (26, 1), (17, 1), (16, 0)])
def test_chunks_are_dropped_from_the_end_and_the_prefix_never_cut(budget, used):
    count = WordCounter()
    fitted = fit_context(CHUNKS, "def f(", "x y", budget=budget, count=count)
    assert fitted.chunks_used == used
    assert fitted.prompt == with_chunks(CHUNKS[:used], "def f(")
    assert fitted.prompt.endswith("def f(")  # the prefix whole, even when nothing else fits
    if used:  # the prompt sent is counted exactly and within the budget
        assert fitted.prompt_tokens == count([fitted.prompt], "x y")[0] <= budget


def test_no_chunks_means_no_count():
    count = WordCounter()
    fitted = fit_context((), "def f(", "", budget=1, count=count)
    assert (fitted.prompt, fitted.usage(), count.calls) == ("def f(", {}, [])


def test_the_api_parses_context_and_warm_ups():
    body = {
        "prompt": "def f(",
        "max_tokens": 0,
        "input_extra": [{"filename": "a.py", "text": "A = 1"}, {"text": "B = 2\n"}],
    }
    job = parse_completion(body)
    assert job.chunks == (ContextChunk("a.py", "A = 1"), ContextChunk("", "B = 2\n"))
    assert job.warm_only and job.requests[0].max_tokens == 1  # one token computed, not returned
    assert job.requests[0].prompts == ("def f(",)  # the context goes in once it is fitted
    infill = parse_infill({"input_prefix": "x = ", "n_predict": 0, "cache_prompt": True})
    assert infill.warm_only and infill.request.max_tokens == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 0, "stream": True}, "max_tokens"),
        ({"prompt": ["x", "y"], "input_extra": [{"text": "A"}]}, "input_extra"),
        ({"prompt": "x", "input_extra": {"text": "A"}}, "input_extra"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(body, param):
    with pytest.raises(OpenAIError) as caught:
        parse_completion(body)
    assert caught.value.param == param, caught.value.message


def test_infill_refuses_a_streamed_warm_up_and_cache_prompt_false():
    for change, param in (({"stream": True}, "stream"), ({"cache_prompt": False}, "cache_prompt")):
        with pytest.raises(OpenAIError) as caught:
            parse_infill({"input_prefix": "x", "n_predict": 0, **change})
        assert caught.value.param == param
    with pytest.raises(OpenAIError):
        parse_chunks({"input_extra": [{"text": 3}]})


# -- against the openvino test server (prefix cache on) ---------------------------------------

EXTRA = [
    {"filename": f"lib/mod{i}.py", "text": f"def helper_{i}(value):\n    return value * {i}\n" * 6}
    for i in range(3)
]
PREFIX = "import os\n\n\ndef main(argv):\n    total = 0\n"


@pytest.fixture(scope="module")
def api(openvino_server) -> Iterator[ApiServer]:
    with ApiServer(Settings(triton_url=openvino_server.grpc_url, checkpoint=None)) as running:
        yield running


def delta(before: str, after: str, name: str) -> float:
    return sample(after, name, ENGINE_MODEL) - sample(before, name, ENGINE_MODEL)


def test_a_warm_up_fills_the_cache_for_the_keystrokes_after_it(openvino_server, api):
    warm = {"input_extra": EXTRA, "input_prefix": PREFIX, "n_predict": 0}
    answer = httpx.post(f"{api.url}/infill", json=warm, timeout=120)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert (data["content"], data["tokens_predicted"]) == ("", 0)
    assert data["usage"] == {"input_extra_chunks": 3, "input_extra_chunks_used": 3}
    assert data["truncated"] is False
    before = settled_scrape(openvino_server)
    typed = {"input_extra": EXTRA, "input_prefix": PREFIX + "    fo", "n_predict": 4}
    answer = httpx.post(f"{api.url}/infill", json={**typed, "temperature": 0}, timeout=120)
    assert answer.status_code == 200, answer.text
    after = settled_scrape(openvino_server)
    evaluated = answer.json()["tokens_evaluated"]
    # the context and the prefix were computed by the warm-up: all but the last block reused
    assert delta(before, after, names.ENGINE_PROMPT_TOKENS) == evaluated
    assert delta(before, after, names.ENGINE_PROMPT_TOKENS_REUSED) >= evaluated - 32


def test_what_does_not_fit_is_dropped_by_the_rule_and_reported(openvino_server):
    budget = 160
    settings = Settings(triton_url=openvino_server.grpc_url, checkpoint=None, context_tokens=budget)
    body = {"prompt": PREFIX, "max_tokens": 8, "temperature": 0, "input_extra": EXTRA}
    with ApiServer(settings) as small:
        answer = httpx.post(f"{small.url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["input_extra_chunks"] == 3
    assert 0 < usage["input_extra_chunks_used"] < 3
    assert usage["prompt_tokens"] + 8 <= budget
    chunks = tuple(ContextChunk(c["filename"], c["text"]) for c in EXTRA)
    kept = chunks[: usage["input_extra_chunks_used"]]
    with CodegenClient(openvino_server.grpc_url) as codegen:
        (reference,) = codegen.send(
            CompletionRequest((with_chunks(kept, PREFIX),), max_tokens=8, temperature=0.0)
        )
    assert answer.json()["choices"][0]["text"] == reference.completion
    # as many as fit: one chunk more would not have (counted by the server's tokenizer)
    one_more = with_chunks(chunks[: usage["input_extra_chunks_used"] + 1], PREFIX)
    triton = grpcclient.InferenceServerClient(openvino_server.grpc_url.removeprefix("grpc://"))
    try:
        assert count_tokens(triton, [one_more], "")[0] + 8 > budget
    finally:
        triton.close()
