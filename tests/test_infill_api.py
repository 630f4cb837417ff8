"""The llama.cpp-compatible ``/infill`` route: what a llama.vim-shaped request becomes (no
server), and its answers against the real test server, whole and streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from api_server import ApiServer

from client import CodegenClient
from openai_api import Settings
from openai_api.errors import OpenAIError
from openai_api.infill import parse_infill
from openai_api.repo_context import with_chunks

LLAMA_VIM = {  # the fields llama.vim sends that this server takes (docs/api.md)
    "input_prefix": "import os\n\n",
    "input_suffix": "\n    return total\n",
    "input_extra": [{"filename": "util.py", "text": "def helper():\n    pass"}],
    "prompt": "def add(a, b):",
    "n_predict": 12,
    "top_k": 40,
    "top_p": 0.9,
    "stream": False,
}


def test_a_llama_vim_request_maps_onto_fill_in_the_middle():
    job = parse_infill({**LLAMA_VIM, "stop": ["\n\n"], "seed": 7, "cache_prompt": True})
    request = job.request
    # the prefix, then llama's `prompt`; the extra context goes before it once fitted
    assert request.prompts == ("import os\n\ndef add(a, b):",)
    assert with_chunks(job.chunks, request.prompts[0]) == (
        "def helper():\n    pass\nimport os\n\ndef add(a, b):"  # each chunk ends a line
    )
    assert request.suffix == ("\n    return total\n",)
    assert (request.max_tokens, request.top_k, request.top_p) == (12, 40, 0.9)
    assert request.seed == 7 and job.stops == ("\n\n",) and request.stop_words == ("\n\n",)
    assert job.stream is False and not job.warm_only
    assert parse_infill({**LLAMA_VIM, "seed": -1}).request.seed is None  # llama.cpp: random
    editor = parse_infill({**LLAMA_VIM, "n_indent": 4, "t_max_predict_ms": 250}).request
    assert (editor.n_indent, editor.t_max_predict_ms) == (4, 250)  # llama.vim's, honoured


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"samplers": ["top_k"]}, "samplers"),
        ({"t_max_predict_ms": -1}, "t_max_predict_ms"),
        ({"n_indent": "four"}, "n_indent"),
        ({"n_predict": -1}, "n_predict"),
        ({"cache_prompt": False}, "cache_prompt"),
        ({"input_extra": [{"filename": "a.py"}]}, "input_extra"),
        ({"input_extra": [{"text": "x", "chunk": 1}]}, "input_extra"),
        ({"input_prefix": 3}, "input_prefix"),
        ({"stop": [""]}, "stop"),
        ({"top_p": 2.0}, "top_p"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(change, named):
    with pytest.raises(OpenAIError) as caught:
        parse_infill({**LLAMA_VIM, **change})
    assert caught.value.status == 400
    assert caught.value.param == named, caught.value.message


@pytest.fixture(scope="module")
def api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


def reference(server, body: dict) -> str:
    job = parse_infill(body)  # its context fits the default budget whole
    request = replace(job.request, prompts=(with_chunks(job.chunks, job.request.prompts[0]),))
    with CodegenClient(server.grpc_url, timeout=60) as codegen:
        return codegen.send(request)[0].completion


def test_infill_answers_like_llama_cpp(server, api):
    body = {**LLAMA_VIM, "temperature": 0.0}
    answer = httpx.post(f"{api.url}/infill", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["stop"] is True
    assert data["content"] == reference(server, body)
    assert 0 < data["tokens_predicted"] <= 12 and data["tokens_evaluated"] > 0
    assert data["usage"] == {"input_extra_chunks": 1, "input_extra_chunks_used": 1}


def test_infill_streams_like_llama_cpp(server, api):
    body = {**LLAMA_VIM, "temperature": 0.0, "stream": True}
    with httpx.stream("POST", f"{api.url}/infill", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [
            json.loads(line.removeprefix("data: "))
            for line in answer.iter_lines()
            if line.startswith("data: ")
        ]
    assert all(event["stop"] is False for event in events[:-1])
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] > 0
    content = "".join(event["content"] for event in events)
    assert content == reference(server, {**body, "stream": False})


def test_infill_refusals_reach_the_client(api):
    answer = httpx.post(f"{api.url}/infill", json={**LLAMA_VIM, "samplers": ["top_k"]})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "samplers"
