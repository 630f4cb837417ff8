"""Token healing (contract/healing.py): which token the tokenizer stage holds back, that the
torch engine's greedy text equals transformers' ``generate(token_healing=True)``, that the first
token always starts with the held-back text (sampling and beams too), that a stream never
repeats it, and what the openvino backend does."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from contract.healing import TokenExtensions
from contract.options import BeamParams, InvalidRequestError, SamplingParams
from engine import TorchEngine
from engine.gptj import GPTJ
from engine.interface import GenerationRequest, NotHonouredError
from engine.openvino_backend import OpenVINOBackend
from engine.openvino_healing import DETOKENIZER
from engine.openvino_model import ModelShape, require_export
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.tokenize import Preprocessor

CODE = [
    "def f(x):\n    return x\n",
    "class A:\n    def g(self):\n        pass\n",
    "for i in range(3):\n    print(i)\n",
    "if x:\n    y = 1\nelse:\n    y = 2\n",
] * 20


@pytest.fixture(scope="module")
def merged_newlines(tmp_path_factory, tiny_checkpoint) -> Path:
    """A byte-level BPE that merges a newline with the next line's indentation (SmolLM2's
    'ĊĠĠĠ' tokens), in a copy of the tiny checkpoint (the tiny one splits lines apart)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CODE, trainer)
    path = tmp_path_factory.mktemp("merged") / "checkpoint"
    shutil.copytree(tiny_checkpoint, path, ignore=shutil.ignore_patterns("openvino", "token*"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    return path


def inputs(prompt: str, healing: bool | None = None, suffix: str | None = None) -> dict:
    arrays = {
        "QUERY": np.array([[prompt.encode()]], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.array([[8]], dtype=np.uint32),
        "BAD_WORDS_DICT": np.array([[b""]], dtype=np.object_),
        "STOP_WORDS_DICT": np.array([[b""]], dtype=np.object_),
    }
    if healing is not None:
        arrays["token_healing"] = np.array([[healing]], dtype=np.bool_)
    if suffix is not None:
        arrays["suffix"] = np.array([[suffix.encode()]], dtype=np.object_)
    return arrays


def tokenized(pre: Preprocessor, prompt: str, **options) -> tuple[list[int], int]:
    out = pre.tensors(inputs(prompt, **options))
    n = int(out["REQUEST_INPUT_LEN"][0, 0])
    return out["INPUT_ID"][0, :n].tolist(), int(out["HELD_BACK_ID"][0, 0])


def test_a_bare_newline_is_held_back_where_newline_and_indentation_merge(merged_newlines):
    pre = Preprocessor(merged_newlines)
    ids = pre.encode("def f(x):\n")
    newline = ids[-1]
    assert pre.extensions.texts[newline] == "\n"
    allowed = pre.extensions.allowed(newline)
    # GPT-2's pre-tokenizer leaves the last space to the next word, as SmolLM2's 'ĊĠĠĠĠĠĠĠ'
    assert allowed[0] == newline and "\n   " in {pre.extensions.texts[i] for i in allowed[1:]}
    assert tokenized(pre, "def f(x):\n") == (ids[:-1], newline)
    assert tokenized(pre, "def f(x):\n", healing=False) == (ids, -1)


def test_only_a_proper_prefix_of_another_token_is_held_back(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    texts = pre.extensions.texts
    special = set(pre.tokenizer.all_special_ids)
    for prompt in (
        "def f(x):\n    re",
        "x = ",
        "import os\nim",
        "def is_prime(n):",
        "a<|endoftext|>",
    ):
        ids = pre.encode(prompt)
        longer = any(
            t != texts[ids[-1]] and t.startswith(texts[ids[-1]])
            for i, t in enumerate(texts)
            if i not in special
        )
        held = ids[-1] if longer and ids[-1] not in special else -1
        assert tokenized(pre, prompt) == ((ids[:-1], held) if held >= 0 else (ids, -1)), prompt
    assert tokenized(pre, "def f(x):\n    re")[1] >= 0  # 're' starts 'return'
    for token in pre.extensions.allowed(pre.encode("x = ")[-1]):
        assert token not in special and texts[token].startswith(" ")


def test_a_one_token_prompt_keeps_its_token(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    (token,) = pre.encode("re")
    assert pre.extensions.heals(token)
    assert tokenized(pre, "re") == ([token], -1)  # nothing before it to condition on


@pytest.mark.parametrize("order", ["spm", "psm"])
def test_fill_in_the_middle_heals_the_prefix_end_inside_its_layout(tiny_checkpoint, order):
    """The prefix's last token is held back wherever the layout puts the prefix (SPM: at the
    end; PSM: before the suffix), the layout built from the rest, and nothing else changes
    (measured: docs/generation.md#token-healing)."""
    pre = Preprocessor(tiny_checkpoint, fim_order=order)
    prefix, suffix = "def f(x):\n    re", "\n"
    before, after = pre.encode(prefix), pre.encode(suffix)
    ids, held = tokenized(pre, prefix, suffix=suffix)
    assert held == before[-1] and ids == pre.fim.prompt(before[:-1], after)
    whole, none = tokenized(pre, prefix, suffix=suffix, healing=False)
    assert (whole, none) == (pre.fim.prompt(before, after), -1)
    # a one-token prefix has the layout and the suffix to condition on
    (token,) = pre.encode("re")
    assert tokenized(pre, "re", suffix=suffix) == (pre.fim.prompt([], after), token)
    # the unary output: the layout's visible text is the user's prefix and the middle
    post = Postprocessor(tiny_checkpoint)
    respelled = [held, *pre.encode("turn x")]  # a first token that spells the held text
    sequence = np.array([[ids + respelled]], dtype=np.uint32)
    assert post.batch(sequence, None)[0].decode().startswith(prefix + "turn x")
    decoder = IncrementalDecoder(post, ids, held)  # a stream: only what follows the prefix
    assert "".join([decoder.push(t) for t in respelled] + [decoder.flush()]) == "turn x"


def test_the_index_skips_special_and_partial_tokens():
    index = TokenExtensions(["a", "ab", "<s>", "abc\ufffd", ""], special=[2])
    assert index.allowed(0) == (0, 1) and index.heals(0)
    assert index.allowed(1) == (1,) and not index.heals(1)
    assert index.allowed(2) == index.allowed(3) == index.allowed(4) == ()


PROMPTS = ("def f(x):\n    re", "import os\nim", "for i in ra", "x =")


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tokenizer.pad_token = tokenizer.eos_token  # heal_tokens pads its re-tokenized prompts
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    model = GPTJ.from_checkpoint(tiny_checkpoint)
    eng = TorchEngine(model, max_batch_size=8, extensions=pre.extensions).start()
    yield pre, eng
    eng.stop()


def test_torch_greedy_equals_transformers_token_healing(engine, reference):
    pre, eng = engine
    tokenizer, model = reference
    for prompt in PROMPTS:
        ids, held = tokenized(pre, prompt)
        assert held >= 0, prompt
        result = eng.generate(GenerationRequest(ids, 13, held_back=held))
        assert pre.extensions.texts[result.output_ids[0]].startswith(pre.extensions.texts[held])
        encoded = tokenizer(prompt, return_tensors="pt")
        theirs = model.generate(
            **encoded, max_new_tokens=12, do_sample=False, token_healing=True, tokenizer=tokenizer
        )  # its healed token is part of the prompt it returns: 12 more
        assert tokenizer.decode(ids + result.output_ids) == tokenizer.decode(theirs[0]), prompt


def test_make_evals_reference_heals_as_the_engine_does(engine, tiny_checkpoint):
    """`make eval`'s transformers-alone side (evaluation/local.py: transformers' generate with
    a first-token logits processor) gives the torch engine's healed text, and the text after
    the prompt; without healing it answers the whole prompt."""
    from evaluation.local import LocalModel

    pre, eng = engine
    post = Postprocessor(tiny_checkpoint)
    local = LocalModel(tiny_checkpoint, healing=True)
    for prompt in PROMPTS:
        ids, held = tokenized(pre, prompt)
        result = eng.generate(GenerationRequest(ids, 12, held_back=held))
        served = post.decode(ids + result.output_ids)[len(prompt) :]
        assert local.complete(prompt, 12, ()) == served, prompt
        whole = eng.generate(GenerationRequest([*ids, held], 12))
        assert local.complete(prompt, 12, (), heal=False) == post.decode(whole.output_ids)


def first_token_is_no_stop(backend, pre, prompt: str) -> None:
    """A stop word that is the healed first token does not end the answer there: that token
    starts with the user's own held-back text (a newline held back and re-spelled as
    itself, Gemma's case with `stop: ["\\n"]`, ended every answer empty)."""
    ids, held = tokenized(pre, prompt)
    free = backend.generate(GenerationRequest(ids, 6, held_back=held))
    first = free.output_ids[0]
    stopped = backend.generate(GenerationRequest(ids, 6, stop_words=[[first]], held_back=held))
    assert len(stopped.output_ids) > 1, (prompt, stopped)
    assert stopped.output_ids == free.output_ids[: len(stopped.output_ids)]


def test_a_stop_word_never_ends_a_healed_answer_at_its_first_token(engine):
    pre, eng = engine
    for prompt in PROMPTS:
        first_token_is_no_stop(eng, pre, prompt)


def test_every_first_token_starts_with_the_held_back_text(engine):
    pre, eng = engine
    ids, held = tokenized(pre, "x =")
    text = pre.extensions.texts[held]
    for seed in range(12):
        sampling = SamplingParams(top_k=50, temperature=5.0, seed=seed)
        result = eng.generate(GenerationRequest(ids, 3, sampling, held_back=held))
        assert pre.extensions.texts[result.output_ids[0]].startswith(text)
    width = min(len(pre.extensions.allowed(held)), 4)
    assert width >= 2
    request = GenerationRequest(ids, 4, beam=BeamParams(width), held_back=held)
    beams = eng.generate(request).beams
    assert beams and all(pre.extensions.texts[b.output_ids[0]].startswith(text) for b in beams)
    with pytest.raises(InvalidRequestError, match="token_healing false, or fewer beams"):
        eng.validate(GenerationRequest(ids, 4, beam=BeamParams(width + 1), held_back=held))


def test_an_engine_without_the_index_refuses_a_held_back_token(tiny_checkpoint):
    bare = TorchEngine(GPTJ.from_checkpoint(tiny_checkpoint), max_batch_size=2)
    with pytest.raises(InvalidRequestError, match="token healing"):
        bare.validate(GenerationRequest([1, 2], 4, held_back=3))


def test_a_stream_never_repeats_the_held_back_text(engine, tiny_checkpoint):
    pre, eng = engine
    post = Postprocessor(tiny_checkpoint)
    for prompt in PROMPTS:
        ids, held = tokenized(pre, prompt)
        result = eng.generate(GenerationRequest(ids, 12, held_back=held))
        whole = post.decode(ids + result.output_ids)
        assert whole.startswith(prompt)
        decoder = IncrementalDecoder(post, ids, held)
        pieces = [decoder.push(t) for t in result.output_ids] + [decoder.flush()]
        assert prompt + "".join(pieces) == whole, prompt


def test_openvino_heals_with_the_export_tokenizer_and_refuses_without(tiny_checkpoint, tmp_path):
    pre = Preprocessor(tiny_checkpoint)
    shape = ModelShape.read(tiny_checkpoint)
    export = require_export(tiny_checkpoint)
    backend = OpenVINOBackend(export, shape, max_batch_size=2, extensions=pre.extensions).start()
    try:
        for prompt in PROMPTS:
            ids, held = tokenized(pre, prompt)
            result = backend.generate(GenerationRequest(ids, 8, held_back=held))
            assert result.error is None and pre.tokenizer.decode(
                ids + result.output_ids
            ).startswith(prompt), prompt
            first_token_is_no_stop(backend, pre, prompt)
    finally:
        backend.stop()
    bare = tmp_path / "openvino"
    shutil.copytree(export, bare, ignore=shutil.ignore_patterns(DETOKENIZER))
    old = OpenVINOBackend(bare, shape, max_batch_size=2, extensions=pre.extensions)
    with pytest.raises(NotHonouredError, match="token healing") as refusal:
        old.validate(GenerationRequest([1, 2], 4, held_back=pre.encode("re")[0]))
    assert refusal.value.reason == "token_healing"
