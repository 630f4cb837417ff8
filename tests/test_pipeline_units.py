"""Tokenization, word lists, detokenization, tensor mapping and the configs, without a server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, BeamParams, InvalidRequestError
from contract.words import decode_words, encode_words, split_word_list, word_list
from engine import Beam, GenerationResult
from engine.tensors import (
    requests_from_tensors,
    tensors_from_results,
)
from modelbuild.__main__ import main as modelbuild_main
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.tokenize import Preprocessor

# -- word lists --------------------------------------------------------------------------------


def test_word_list_uses_the_fastertransformer_layout():
    layout = word_list([[[11, 12], [13]], [[7]]])
    assert layout.dtype == np.int32 and layout.shape == (2, 2, 3)
    np.testing.assert_array_equal(layout[0], [[11, 12, 13], [2, 3, -1]])
    np.testing.assert_array_equal(layout[1], [[7, 0, 0], [1, -1, -1]])
    assert split_word_list(layout[0]) == [[11, 12], [13]]
    assert split_word_list(layout[1]) == [[7]]


def test_empty_word_list_is_one_padded_column():
    layout = word_list([[], []])
    assert layout.shape == (2, 2, 1)
    np.testing.assert_array_equal(layout[:, 1], [[-1], [-1]])
    assert split_word_list(layout[0]) == []


def test_words_travel_as_csv_with_quoting():
    words = ["print", "a,b", 'say "hi"', "\n\n"]
    assert decode_words(encode_words(words)) == words
    assert encode_words([]) == ""
    assert decode_words("print,exit") == ["print", "exit"]
    assert decode_words("\n\n,return") == ["\n\n", "return"]


# -- preprocessing / postprocessing on a real (tiny) tokenizer ---------------------------------


@pytest.fixture(scope="module")
def pre(tiny_checkpoint) -> Preprocessor:
    return Preprocessor(tiny_checkpoint)


@pytest.fixture(scope="module")
def post(tiny_checkpoint) -> Postprocessor:
    return Postprocessor(tiny_checkpoint)


def request(queries, bad=b"", stop=b"", output_len=8) -> dict[str, np.ndarray]:
    """The preprocessing model's inputs for one request of len(queries) prompts."""
    n = len(queries)
    return {
        "QUERY": np.array([[q] for q in queries], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.full((n, 1), output_len, dtype=np.uint32),
        "BAD_WORDS_DICT": np.array([[bad]] * n, dtype=np.object_),
        "STOP_WORDS_DICT": np.array([[stop]] * n, dtype=np.object_),
        # the prompt whole: these tests check tokenization (test_token_healing.py, healing)
        "token_healing": np.zeros((n, 1), dtype=np.bool_),
    }


def test_prompts_are_padded_with_their_lengths(pre):
    out = pre.tensors(request([b"import os", b"def f(x):\n    return x"]))
    ids, lengths = out["INPUT_ID"], out["REQUEST_INPUT_LEN"]
    assert ids.dtype == np.uint32 and lengths.dtype == np.uint32
    assert lengths.shape == (2, 1)
    for row, text in enumerate(["import os", "def f(x):\n    return x"]):
        expected = pre.encode(text)
        assert lengths[row, 0] == len(expected)
        assert ids[row, : len(expected)].tolist() == expected
        assert not ids[row, len(expected) :].any()
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[8], [8]]


def test_bad_text_is_refused_with_the_input_named(pre):
    with pytest.raises(InvalidRequestError, match="INPUT_0 row 1 is an empty prompt"):
        pre.tensors(request([b"x", b""]))
    with pytest.raises(InvalidRequestError, match="not valid UTF-8"):
        pre.tensors(request([b"\xff"]))


def test_stop_words_are_tokenized_per_row(pre):
    layout = pre.tensors(request([b"a", b"b"], stop=b"return,yield"))["STOP_WORDS_IDS"]
    assert split_word_list(layout[0]) == [pre.encode("return"), pre.encode("yield")]
    assert split_word_list(pre.tensors(request([b"a"]))["STOP_WORDS_IDS"][0]) == []


def test_a_batch_is_tokenized_together_and_a_bad_request_fails_alone(pre):
    good = [request([b"import os"]), request([b"x = 1", b"y"], stop=b"\n\n,return")]
    answers = pre.batch([good[0], request([b"\xff"]), good[1]])
    assert isinstance(answers[1], InvalidRequestError)
    for answer, inputs in zip([answers[0], answers[2]], good, strict=True):
        assert not isinstance(answer, Exception)
        alone = pre.tensors(inputs)
        assert answer.keys() == alone.keys()
        for name in alone:
            np.testing.assert_array_equal(answer[name], alone[name])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queries": [b"x" * (MAX_PROMPT_BYTES + 1)]}, "over the limit of 262,144"),
        ({"queries": [b"x"], "stop": ",".join(["w"] * 65).encode()}, "65 words, over the"),
        ({"queries": [b"x"], "bad": b"ab" * 200}, "tokens, over the limit of 32"),
    ],
)
def test_input_caps_are_refused_naming_the_limit(pre, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        pre.tensors(request(**kwargs))


def test_postprocessing_returns_flat_texts_trimmed_to_their_lengths(pre, post):
    first, second = pre.encode("a = 1"), pre.encode("def g():")
    tokens = np.zeros((2, 1, 10), dtype=np.uint32)
    tokens[0, 0, : len(first)] = first
    tokens[1, 0, : len(second)] = second
    lengths = np.array([[len(first)], [len(second)]], dtype=np.uint32)
    out = post.batch(tokens, lengths)
    assert out.shape == (2,)
    assert [t.decode() for t in out] == ["a = 1", "def g():"]


@pytest.mark.parametrize(
    "prompt", ["s = '", "def f():\n    # naïve café: 🚀🚀 über straße\n    return 'ü"]
)
def test_incremental_decoding_never_splits_a_character(pre, post, prompt):
    completion = "héllo wörld 🚀 — ünïcode'\n"
    ids = pre.encode(prompt + completion)
    prompt_ids = pre.encode(prompt)
    assert ids[: len(prompt_ids)] == prompt_ids
    decoder = IncrementalDecoder(post, prompt_ids)
    pieces = [decoder.push(t) for t in ids[len(prompt_ids) :]]
    pieces.append(decoder.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == completion
    assert sum(1 for p in pieces if p) < len(ids) - len(prompt_ids)  # some tokens held back


# -- the model stage's tensors ----------------------------------------------------------------


def test_model_stage_tensors_map_to_engine_requests_and_back():
    arrays = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 0]], dtype=np.uint32),
        "input_lengths": np.array([[3], [2]], dtype=np.uint32),
        "request_output_len": np.array([[4], [6]], dtype=np.uint32),
        "runtime_top_k": np.array([[3], [0]], dtype=np.uint32),
        "random_seed": np.array([[42], [43]], dtype=np.uint64),
        "end_id": np.array([[50256], [50256]], dtype=np.uint32),
        "is_return_log_probs": np.array([[True], [True]]),
        "stop_words_list": word_list([[[1, 2]], []]),
        "bad_words_list": word_list([[], [[4]]]),
    }
    requests, want_log_probs = requests_from_tensors(arrays)
    assert want_log_probs
    assert [r.prompt_ids for r in requests] == [[5, 6, 7], [8, 9]]
    assert [r.max_new_tokens for r in requests] == [4, 6]
    assert requests[0].sampling.top_k == 3 and requests[0].sampling.seed == 42
    assert requests[1].sampling.greedy and requests[1].end_id == 50256
    assert requests[0].stop_words == [[1, 2]] and requests[1].bad_words == [[4]]

    results = [
        GenerationResult([5, 6, 7], [10, 11], [-0.5, -1.0], "end_id"),
        GenerationResult([8, 9], [12, 13, 14], [-0.25, -0.25, -0.5], "length"),
    ]
    out = tensors_from_results(results, return_log_probs=True)
    assert out["output_ids"].shape == (2, 1, 5)
    assert out["output_ids"][0, 0].tolist() == [5, 6, 7, 10, 11]
    assert out["output_ids"][1, 0].tolist() == [8, 9, 12, 13, 14]
    assert out["sequence_length"].tolist() == [[5], [5]]
    np.testing.assert_allclose(out["cum_log_probs"], [[-1.5], [-1.0]])
    np.testing.assert_allclose(out["output_log_probs"][0, 0], [-0.5, -1.0, 0.0])


def test_the_model_stage_tensors_become_the_engine_request_field_for_field():
    """What gptj checks and the engine reads: every option reaches its row."""
    arrays = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 0]], dtype=np.uint32),
        "input_lengths": np.array([[3], [2]], dtype=np.uint32),
        "request_output_len": np.array([[4], [6]], dtype=np.uint32),
        "runtime_top_p": np.array([[0.9], [0.9]], dtype=np.float32),  # not exact in decimal
        "temperature": np.array([[0.7], [0.7]], dtype=np.float32),
        "random_seed": np.array([[2**64 - 1], [0]], dtype=np.uint64),
        "is_return_log_probs": np.array([[True], [True]]),
        "n_indent": np.array([[4], [4]], dtype=np.uint32),
        "t_max_predict_ms": np.array([[250], [250]], dtype=np.uint32),
        "stop_words_list": word_list([[[1, 2], [3]], []]),
        "bad_words_list": word_list([[], [[4]]]),
    }
    parsed, _ = requests_from_tensors(arrays)
    first, second = parsed
    assert (first.prompt_ids, first.max_new_tokens) == ([5, 6, 7], 4)
    assert (second.prompt_ids, second.max_new_tokens) == ([8, 9], 6)
    assert first.sampling.top_p == float(np.float32(0.9))  # the float32 value, kept
    assert first.sampling.temperature == float(np.float32(0.7))
    assert (first.sampling.seed, second.sampling.seed) == (2**64 - 1, 0)
    assert first.return_log_probs and second.return_log_probs
    assert (first.editor.n_indent, first.editor.t_max_predict_ms) == (4, 250)
    assert [list(w) for w in first.stop_words] == [[1, 2], [3]] and not second.stop_words
    assert not first.bad_words and [list(w) for w in second.bad_words] == [[4]]
    bare = {name: arrays[name][:1] for name in ("input_ids", "input_lengths", "request_output_len")}
    (default,), _ = requests_from_tensors(bare)  # every option absent
    assert default.sampling.seed is None and default.held_back is None
    assert default.stop_words == [] and default.editor.n_indent == 0


def test_beam_options_reach_the_engine_and_one_width_per_request():
    arrays = {
        "input_ids": np.array([[5], [6]], dtype=np.uint32),
        "input_lengths": np.array([[1], [1]], dtype=np.uint32),
        "request_output_len": np.array([[4], [4]], dtype=np.uint32),
        "beam_width": np.array([[4], [4]], dtype=np.uint32),
        "len_penalty": np.array([[1.5], [1.5]], dtype=np.float32),
        "beam_search_diversity_rate": np.array([[-0.5], [-0.5]], dtype=np.float32),
    }
    requests, _ = requests_from_tensors(arrays)
    assert [r.beam for r in requests] == [BeamParams(4, 1.5, -0.5)] * 2
    arrays["beam_width"] = np.array([[4], [2]], dtype=np.uint32)
    with pytest.raises(InvalidRequestError, match="beam_width differs between the prompts"):
        requests_from_tensors(arrays)
    arrays["beam_width"] = np.array([[0], [0]], dtype=np.uint32)
    with pytest.raises(InvalidRequestError, match="beam_width must be >= 1, got 0"):
        requests_from_tensors(arrays)


def test_beam_results_are_beam_major_best_first():
    beams = [
        Beam([7, 8], [-0.5, -0.25], -1.0, -1.0, "end_id"),  # the end token's log prob counts
        Beam([9], [-1.5], -1.5, -1.5, "length"),
    ]
    result = GenerationResult([5], [7, 8], [-0.5, -0.25], "end_id", beams=beams)
    out = tensors_from_results([result], return_log_probs=False, beam_width=3)
    assert out["output_ids"].tolist() == [[[5, 7, 8], [5, 9, 0], [5, 0, 0]]]
    assert out["sequence_length"].tolist() == [[3, 2, 1]]  # a missing beam: the prompt alone
    assert out["cum_log_probs"].tolist() == [[-1.0, -1.5, -np.inf]]  # always, they rank beams
    assert not out["output_log_probs"].any()  # only when asked for
    out = tensors_from_results([result], return_log_probs=True, beam_width=3)
    assert out["output_log_probs"][0, :, :2].tolist() == [[-0.5, -0.25], [-1.5, 0.0], [0, 0]]


def test_client_side_validation_names_the_option():
    with pytest.raises(InvalidRequestError, match="max_tokens must be a positive integer"):
        CompletionRequest("x", max_tokens=-1)
    with pytest.raises(InvalidRequestError, match=r"runtime_top_p must be in \[0, 1\]"):
        CompletionRequest("x", top_p=1.5)
    with pytest.raises(InvalidRequestError, match="beam_width must be >= 1, got 0"):
        CompletionRequest("x", beam_width=0)
    with pytest.raises(InvalidRequestError, match="len_penalty must be finite"):
        CompletionRequest("x", beam_width=2, len_penalty=float("nan"))
    tensors = CompletionRequest(("a", "b"), max_tokens=5, stop_words=("x,y",), seed=3).tensors()
    assert tensors["INPUT_0"].shape == (2, 1) and tensors["INPUT_1"].tolist() == [[5], [5]]
    assert decode_words(tensors["INPUT_3"][0, 0].decode()) == ["x,y"]
    assert tensors["random_seed"].dtype == np.uint64


# -- make model --------------------------------------------------------------------------------


def test_model_build_is_deterministic_and_not_redone(tiny_checkpoint, tmp_path, capsys):
    from modelbuild.train import build
    from tests.conftest import TINY

    again = tmp_path / "again"
    build(again, TINY)

    def digest(path: Path) -> str:
        return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()

    assert digest(again) == digest(tiny_checkpoint)
    assert (again / "tokenizer.json").read_text() == (
        tiny_checkpoint / "tokenizer.json"
    ).read_text()
    card = (again / "MODEL_CARD.md").read_text()
    assert "held-out loss" in card and "Greedy completions" in card
    before = (again / "model.safetensors").stat().st_mtime_ns
    assert modelbuild_main(["build", "--out", str(again)]) == 0
    assert "already present" in capsys.readouterr().out
    assert (again / "model.safetensors").stat().st_mtime_ns == before
