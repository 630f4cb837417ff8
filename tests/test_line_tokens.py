"""Line-aware tokenization: a resent prefix's ids come from the remembered part before its last
newline, and equal the tokenizer's own, exactly; other tokenizers are never cached that way.
A whole text resent is looked up, for every tokenizer."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from modelbuild.corpus import read_texts, split
from preprocessing.line_tokens import (
    MAX_HEAD_CHARS,
    MIN_HEAD_CHARS,
    LineTokens,
    ResentTexts,
    splits_lines,
)
from preprocessing.tokenize import Preprocessor


@pytest.fixture(scope="module")
def held_out() -> str:
    return max(read_texts(split()[1]), key=len)


def test_cached_ids_equal_the_tokenizers_for_an_editors_resent_prefixes(tiny_checkpoint, held_out):
    pre = Preprocessor(tiny_checkpoint)
    assert pre.lines is not None  # the default build's tokenizer splits lines
    direct = pre._encode_all
    rng = random.Random(0)
    texts = []
    for start in (0, 5_000):  # a visit types on at one place: each text one character longer
        cursor = start + 2_000 + rng.randrange(2_000)
        texts += [held_out[start : cursor + i] for i in range(60)]
    texts += [  # the places a cut could go wrong: CRLF, sentinels, indentation, no newline
        "x = 1\r\n" * 80 + "    y",
        "a\n" * 200 + "\r",
        "<fim_prefix>" + "def f():\n    return 1\n" * 20 + "<fim_suffix>\n<fim_middle>",
        "\t\tz\n" * 100 + "\n        ",
        "no newline " * 50,
    ]
    hits_before = pre.lines.hits
    for text in texts:
        assert pre.encode_all([text]) == direct([text]), repr(text[-40:])
    assert pre.encode_all(texts[:3] + texts[-3:]) == direct(texts[:3] + texts[-3:])
    # every resend within a visit found its head (those that end on a new line miss once)
    assert pre.lines.hits - hits_before >= 100


def test_a_short_head_or_a_tokenizer_without_the_rule_is_not_cached(tiny_checkpoint):
    calls = []

    def encode_all(texts):
        calls.append(list(texts))
        return [[len(t)] for t in texts]

    lines = LineTokens(encode_all)
    lines.encode_all(["a" * 10 + "\nb"])  # head shorter than MIN_HEAD_CHARS: one piece
    assert calls[-1] == ["a" * 10 + "\nb"]
    huge = "a" * (MAX_HEAD_CHARS + 1) + "\nb"  # too long to keep: one piece, nothing kept
    assert lines.encode_all([huge]) == [[len(huge)]] and calls[-1] == [huge]
    head = "a" * MIN_HEAD_CHARS
    assert lines.encode_all([head + "\nb", head + "\nbc"]) == [
        [MIN_HEAD_CHARS, 2],
        [MIN_HEAD_CHARS, 3],
    ]
    assert calls[-1] == [head, "\nb", "\nbc"]  # the head once
    lines.encode_all([head + "\nbcd"])
    assert calls[-1] == ["\nbcd"] and lines.hits == 1

    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.train_from_iterator(["def f():\n    return 1\n"] * 10, trainers.BpeTrainer(vocab_size=300))
    assert not splits_lines(gpt2)  # "\n   " + " return": a newline joins what follows
    assert splits_lines(Preprocessor(tiny_checkpoint).tokenizer.backend_tokenizer)


def test_a_whole_text_resent_is_not_tokenized_again_and_its_ids_are_the_callers_own():
    calls = []

    def encode_all(texts):
        calls.append(list(texts))
        return [[len(t), 0] for t in texts]

    resent = ResentTexts(encode_all)
    prompt, word = "a" * MIN_HEAD_CHARS, "return"
    first = resent.encode_all([prompt, word])
    assert calls == [[prompt, word]]
    first[0].append(99)  # a caller that changes its answer changes nothing remembered
    assert resent.encode_all([prompt, word]) == [[MIN_HEAD_CHARS, 0], [6, 0]]
    assert calls[-1] == [word] and resent.hits == 1  # a short text costs less to tokenize
    huge = "a" * (MAX_HEAD_CHARS + 1)
    resent.encode_all([huge])
    resent.encode_all([huge])
    assert calls[-2:] == [[huge], [huge]]  # too long to keep


def test_the_preprocessor_gives_a_resent_prompt_the_tokenizers_own_ids(tiny_checkpoint, held_out):
    pre = Preprocessor(tiny_checkpoint)
    prompt = held_out[:3_000]
    once = pre.encode_all([prompt])
    assert pre.encode_all([prompt]) == once == pre._encode_all([prompt])
    assert pre.resent.hits == 1
