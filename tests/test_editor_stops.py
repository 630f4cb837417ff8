"""Editor stop rules (single_line, n_indent, t_max_predict_ms): decided on each token in both
backends' loops, so the answer ends at its stop with nothing generated past it, and its row is
freed; then through the server, the client and the OpenAI API."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import httpx
import pytest
from engine_runs import random_gptj
from server_metrics import sample, scrape

from client import CodegenClient
from contract import metrics as names
from contract.options import BeamParams, EditorStops, InvalidRequestError
from contract.tensors import ENGINE_MODEL
from engine import TorchEngine, editor_stops
from engine.editor_stops import LineStops
from engine.gptj import GPTJ
from engine.interface import GenerationRequest
from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import ModelShape, require_export
from modelbuild.openvino_export import ensure_export

VOCAB = 300
PROMPT = [5, 17, 99, 23, 5, 8]


def verdicts(
    rules: EditorStops, pieces: list[str], clock=None, held_back: int | None = None
) -> list[tuple[bool, str | None]]:
    """Each piece as one token's text, fed until a rule ends the answer (``held_back``: the
    index of a piece that stands for the prompt's held-back token; not fed)."""
    stops, out = LineStops(rules, pieces, held_back, clock), []
    tokens = [t for t in range(len(pieces)) if t != held_back]
    for token in tokens:
        out.append(stops.verdict(token))
        if out[-1][1] is not None:
            break
    return out


def test_single_line_ends_at_the_token_that_carries_the_first_newline():
    got = verdicts(EditorStops(single_line=True), ["x", " = ", "1)\n", "    y"])
    assert got == [(True, None), (True, None), (True, "single_line")]


def test_n_indent_ends_before_a_later_line_under_the_indentation():
    pieces = ["x", "\n", "    ", "y", "\n", "  ", "z", "\n", "w"]
    got = verdicts(EditorStops(n_indent=4), pieces)
    assert got[-1] == (False, "n_indent") and len(got) == 7  # "z", at column 2
    assert verdicts(EditorStops(n_indent=4), ["\n", "    y", "\n", "\n"])[-1] == (
        False,
        "n_indent",
    )  # a blank line counts, as in llama.cpp
    # the first line continues the cursor's: never checked
    assert verdicts(EditorStops(n_indent=8), ["y", "z"]) == [(True, None), (True, None)]


def test_the_time_budget_ends_the_answer_once_it_has_a_newline():
    ticks = itertools.count(0.0, 0.010)  # 10 ms a token, by construction
    got = verdicts(
        EditorStops(t_max_predict_ms=25), ["a", "b", "c", "d", "\n", "e"], ticks.__next__
    )
    assert got[-1] == (True, "time_budget") and len(got) == 5  # past 25 ms at "d", ends at "\n"
    ticks = itertools.count(0.0, 0.010)
    got = verdicts(EditorStops(t_max_predict_ms=25), ["\n", "a", "b", "c", "d"], ticks.__next__)
    assert got[-1] == (True, "time_budget") and len(got) == 4  # has a newline: ends at 30 ms


def test_the_held_back_text_of_a_healed_answer_is_the_prompts_not_the_answers():
    """Healing held back the prompt's newline and the first token re-spells it with the next
    line's indentation: the newline is the user's, so single_line ends at the next one."""
    pieces = ["\n", "\n    for", " x", ":\n", "    y"]  # piece 0: the held-back token
    got = verdicts(EditorStops(single_line=True), pieces, held_back=0)
    assert got == [(True, None), (True, None), (True, "single_line")]
    assert verdicts(EditorStops(single_line=True), pieces[1:])[0] == (True, "single_line")
    # n_indent: the first line continues the cursor's, as without healing
    got = verdicts(EditorStops(n_indent=4), ["\n", "\n", "  y", "\n", "z"], held_back=0)
    assert got == [(True, None), (True, None), (True, None), (False, "n_indent")]  # at "z"


def test_bad_rules_are_refused_by_name():
    with pytest.raises(InvalidRequestError, match="n_indent"):
        EditorStops(n_indent=-1)
    with pytest.raises(InvalidRequestError, match="t_max_predict_ms"):
        EditorStops(t_max_predict_ms=-5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("editor-gptj")
    random_gptj().save_pretrained(path)
    ensure_export(path)
    return path


@pytest.fixture(scope="module", params=["openvino", "torch"])
def make_engine(request, checkpoint):
    def make(texts):
        if request.param == "torch":
            return TorchEngine(
                GPTJ.from_checkpoint(checkpoint), max_batch_size=4, token_texts=texts
            )
        shape = ModelShape.read(checkpoint)
        return OpenVINOBackend(
            require_export(checkpoint), shape, max_batch_size=4, token_texts=texts
        )

    return make


def texts_with(marks: dict[int, str]) -> list[str]:
    """Every token reads "a" but the ``marks``."""
    return [marks.get(token, "a") for token in range(VOCAB)]


def first_new(tokens: list[int], after: int = 1) -> int:
    """The first position past ``after`` whose token did not come before it."""
    return next(k for k in range(after, len(tokens)) if tokens[k] not in tokens[:k])


@pytest.mark.parametrize("rule", ["single_line", "n_indent", "time_budget"])
def test_each_rule_ends_the_answer_in_the_engine_with_nothing_past_it(
    make_engine, rule, monkeypatch
):
    free_engine = make_engine(texts_with({})).start()
    try:
        free = free_engine.generate(GenerationRequest(PROMPT, 24)).output_ids
    finally:
        free_engine.stop()
    at = first_new(free, 2)  # this token carries the answer's first newline; every other
    marks = {free[at]: "\n"}  # reads "a", so the next line starts at column 0
    rules = {
        "single_line": EditorStops(single_line=True),
        "n_indent": EditorStops(n_indent=2),
        "time_budget": EditorStops(t_max_predict_ms=1),
    }[rule]
    ticks = itertools.count(0.0, 1.0)  # a second a token: the budget is spent at once
    monkeypatch.setattr(editor_stops, "now", ticks.__next__)
    engine = make_engine(texts_with(marks)).start()
    try:
        result = engine.generate(GenerationRequest(PROMPT, 24, editor=rules))
        assert engine.running == 0  # its row is free
    finally:
        engine.stop()
    assert result.finish_reason == rule
    # single_line and the spent budget end at the newline; n_indent before the next line's
    # first token, under the indentation: the same tokens, and not one more
    assert result.output_ids == free[: at + 1]
    assert result.tokens_past_stop == 0


def test_rules_need_token_texts_and_one_beam(make_engine):
    engine = make_engine(None)
    with pytest.raises(InvalidRequestError, match="token_texts"):
        engine.validate(GenerationRequest(PROMPT, 8, editor=EditorStops(single_line=True)))
    request = GenerationRequest(PROMPT, 8, editor=EditorStops(n_indent=4))
    with pytest.raises(InvalidRequestError, match="beam_width 1"):
        engine.validate(replace(request, beam=BeamParams(2)))


def engine_count(server, name: str) -> float:
    return sample(scrape(server), name, ENGINE_MODEL) or 0.0


def wait_count(server, name: str, at_least: float, timeout: float = 30.0) -> float:
    """The counter once it reached ``at_least`` (metrics are sent every 50 ms)."""
    deadline = time.monotonic() + timeout
    while (value := engine_count(server, name)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def sampled_with_a_newline(client: CodegenClient, prompt: str) -> dict:
    """Sampling options whose answer has a newline before its end (the tiny model writes runs
    of spaces when greedy): the first seed that gives one."""
    for seed in range(1, 40):
        options = {"max_tokens": 48, "top_p": 1.0, "temperature": 1.5, "seed": seed}
        if "\n" in client.complete(prompt, **options).completion[:-1]:
            return options
    raise AssertionError("no seed of 39 gave a line break: the model writes none")


@pytest.mark.parametrize("server_name", ["server", "openvino_server"])
def test_single_line_through_the_server_counts_its_stop_and_nothing_past_it(request, server_name):
    server = request.getfixturevalue(server_name)
    prompt = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"
    before = engine_count(server, names.ENGINE_EDITOR_STOPS)
    with CodegenClient(server.grpc_url) as client:
        options = sampled_with_a_newline(client, prompt)
        free = client.complete(prompt, **options)
        line = client.complete(prompt, single_line=True, **options)
        with client.stream(prompt, single_line=True, **options) as stream:
            streamed = "".join(stream)
    # the same seed draws the same tokens up to the stop, which ends the answer at its newline
    assert line.completion == free.completion[: free.completion.index("\n") + 1] == streamed
    # and the engine says so, with its own counts, unary and streamed alike (issue 39)
    assert line.finish_reason == stream.completion.finish_reason == "single_line"
    assert free.finish_reason in ("length", "end_id")
    assert line.prompt_tokens == free.prompt_tokens == stream.completion.prompt_tokens
    assert line.completion_tokens == stream.completion.completion_tokens
    assert line.prompt_tokens + line.completion_tokens == line.total_tokens
    assert wait_count(server, names.ENGINE_EDITOR_STOPS, before + 2) >= before + 2
    assert engine_count(server, names.ENGINE_TOKENS_PAST_STOP) == 0


def test_the_openai_api_and_infill_take_the_rules(server, tiny_checkpoint):
    from api_server import ApiServer

    from openai_api import Settings

    prompt = "import os\n\n\ndef main():\n"
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as api:
        with CodegenClient(server.grpc_url) as client:
            options = sampled_with_a_newline(client, prompt)
        body = {
            "model": "codegen",
            "prompt": prompt,
            "max_tokens": 48,
            "seed": options["seed"],
            "temperature": options["temperature"],
            "top_p": options["top_p"],
        }
        free = httpx.post(f"{api.url}/v1/completions", json=body, timeout=60).json()
        text = free["choices"][0]["text"]
        line = httpx.post(
            f"{api.url}/v1/completions", json=body | {"single_line": True}, timeout=60
        ).json()["choices"][0]["text"]
        assert "\n" in text[:-1] and line == text[: text.index("\n") + 1]
        bad = httpx.post(f"{api.url}/v1/completions", json=body | {"n_indent": -2}, timeout=60)
        assert bad.status_code == 400 and "n_indent" in bad.text
        infill = {"input_prefix": prompt, "n_predict": 48, "temperature": 0, "n_indent": 4}
        answer = httpx.post(f"{api.url}/infill", json=infill, timeout=60)
        assert answer.status_code == 200, answer.text
