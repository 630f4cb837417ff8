"""The engine model on the openvino backend, through the real Triton server: the same answers as
the torch backend, streaming, stop words, the refusals, the metrics and the prefix-cache reuse.
Tests that apply to both backends run on both servers."""

from __future__ import annotations

import re

import pytest
import torch
from server_metrics import sample, scrape, settled_scrape
from transformers import GPTJForCausalLM, PreTrainedTokenizerFast

from client.client import CodegenClient
from contract import metrics as names
from contract.tensors import ENGINE_MODEL

PROMPT = "def add(a, b):\n"


@pytest.fixture(params=["torch", "openvino"])
def any_server(request):
    """Each backend's server (the torch one is the session's ``server``)."""
    return request.getfixturevalue("server" if request.param == "torch" else "openvino_server")


def complete(server, protocol: str = "grpc", **options):
    prompt = options.pop("prompt", PROMPT)
    with CodegenClient(server.grpc_url if protocol == "grpc" else server.http_url, protocol) as c:
        return c.complete(prompt, **options)


def test_the_engine_model_says_which_backend_it_runs(openvino_server):
    log = openvino_server.log_file.read_text()
    assert re.search(r"engine: serving \S+ \(openvino backend, .*prefix cache on", log)


def test_greedy_answers_equal_the_torch_backends(server, openvino_server):
    for prompt in (PROMPT, "import os\n\n\ndef list_files(path):\n", "class Stack:\n"):
        torch_text = complete(server, prompt=prompt, max_tokens=24).completion
        assert complete(openvino_server, prompt=prompt, max_tokens=24).completion == torch_text


def test_a_stream_gives_the_unary_text_piece_by_piece(any_server):
    unary = complete(any_server, max_tokens=20).completion
    with CodegenClient(any_server.grpc_url, "grpc") as codegen:
        pieces = list(codegen.stream(PROMPT, max_tokens=20))
    assert len(pieces) > 1 and "".join(pieces) == unary


@pytest.fixture(scope="module")
def greedy_tokens(tiny_checkpoint) -> tuple[PreTrainedTokenizerFast, list[int]]:
    """transformers' greedy tokens for PROMPT (the server's, as the greedy tests show)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
    model = GPTJForCausalLM.from_pretrained(str(tiny_checkpoint)).eval()
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0)
    return tokenizer, out[0, ids.shape[1] :].tolist()


def test_stop_words_end_generation_on_both_backends(any_server, greedy_tokens):
    """A stop word ends the answer at the first token whose text completes it, whatever the
    model: the word is a generated token whose text tokenizes back to it, the latest such one
    not seen before it (the engine's match on tokens ends there at the latest; the match on
    the text, where the word's text is inside an earlier token)."""
    tokenizer, generated = greedy_tokens
    free = complete(any_server, max_tokens=30).completion
    assert free == tokenizer.decode(generated)
    at = max(
        k
        for k, token in enumerate(generated[:-1])
        if token not in generated[:k] and tokenizer.encode(tokenizer.decode([token])) == [token]
    )
    word = tokenizer.decode([generated[at]])
    stopped = complete(any_server, max_tokens=30, stop_words=(word, "zzzq"))
    end = next(k for k in range(at + 1) if word in tokenizer.decode(generated[: k + 1]))
    assert stopped.completion == tokenizer.decode(generated[: end + 1])
    assert stopped.finish_reason == "stop_word" and len(stopped.completion) < len(free)


def test_seeded_sampling_repeats_and_log_probs_sum(any_server):
    options = {"max_tokens": 16, "top_k": 8, "seed": 5, "return_log_probs": True}
    first, again = complete(any_server, **options), complete(any_server, "http", **options)
    assert first.completion == again.completion
    assert first.cum_log_prob == pytest.approx(sum(first.log_probs), abs=1e-3)
    assert all(lp < 0 for lp in first.log_probs)


def test_bad_words_are_honoured_by_the_fallback_engine(server, openvino_server):
    """The pipeline has no banned-token list: the request runs on the torch fallback, so its
    answer is the torch backend's (tests/test_fallback.py counts it)."""
    options = {"max_tokens": 12, "bad_words": ("return", ":")}
    assert complete(openvino_server, **options).completion == complete(server, **options).completion
    assert complete(openvino_server, max_tokens=8).completion  # and it keeps serving


def test_log_probs_under_a_temperature_and_penalty_equal_the_torch_backends(
    server, openvino_server
):
    """The contract's log probs (after penalty and temperature), computed beside the
    pipeline, whose own are the model's raw ones; greedy, so both backends pick the same."""
    options = {"max_tokens": 16, "temperature": 0.7, "repetition_penalty": 1.3}
    torch_answer = complete(server, return_log_probs=True, **options)
    answer = complete(openvino_server, return_log_probs=True, **options)
    assert answer.completion == torch_answer.completion
    assert answer.log_probs == pytest.approx(torch_answer.log_probs, abs=1e-3)
    raw = complete(openvino_server, return_log_probs=True, max_tokens=16, repetition_penalty=1.3)
    assert raw.completion == answer.completion  # temperature does not change a greedy choice
    assert raw.log_probs != pytest.approx(answer.log_probs, abs=1e-3)  # but it does the log probs


def test_beam_search_answers_every_beam(any_server):
    completion = complete(any_server, max_tokens=12, beam_width=3, len_penalty=1.0)
    assert len(completion.beams) == 3
    assert completion.completion == completion.beams[0].completion


def test_a_resent_prompt_is_counted_as_reused_and_answers_the_same(openvino_server):
    """An editor resending the file with a few more characters: the prefix cache's blocks."""
    prompt = "import os\nimport sys\n\n\ndef main(argv):\n" * 12
    first = complete(openvino_server, prompt=prompt, max_tokens=8).completion
    before = settled_scrape(openvino_server)
    again = complete(openvino_server, prompt=prompt, max_tokens=8).completion
    complete(openvino_server, prompt=prompt + "    x = 1\n", max_tokens=8)
    after = settled_scrape(openvino_server)
    assert again == first

    def delta(name: str) -> float:
        return sample(after, name, ENGINE_MODEL) - sample(before, name, ENGINE_MODEL)

    received = delta(names.ENGINE_PROMPT_TOKENS)
    reused = delta(names.ENGINE_PROMPT_TOKENS_REUSED)
    assert received > 0 and 0.5 * received < reused < received


def test_the_engine_gauges_are_exported(openvino_server):
    complete(openvino_server, max_tokens=4)
    text = scrape(openvino_server)
    assert sample(text, names.ENGINE_KV_CACHE_BYTES, ENGINE_MODEL) > 0  # kept for the prefix cache
    assert sample(text, names.ENGINE_RUNNING, ENGINE_MODEL) is not None
    assert sample(text, names.ENGINE_LAST_STEP, ENGINE_MODEL) > 0
