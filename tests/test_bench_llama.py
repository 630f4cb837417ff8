"""The benchmark on a Llama-family default model (SmolLM2's family): the checkpoint is read
through engine/models.py, the engine and transformers load it by its model_type, every end
token of the model is kept out, and the served path bans the model's own end token by name."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from llama_checkpoints import SHAPE, random_model

from bench.beams import run_beams
from bench.load import ServedTarget
from bench.models import describe_checkpoint, random_prompts
from bench.settings import make_plan
from bench.systems import EngineRunner, TransformersRunner, generate, unsupported

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, tiny_checkpoint) -> Path:
    """A random Llama (grouped-query attention, tied embeddings, SmolLM2's plain rotary
    embeddings) with the tiny GPT-J's tokenizer, saved as transformers saves it."""
    eos = json.loads((tiny_checkpoint / "config.json").read_text())["eos_token_id"]
    vocab = json.loads((tiny_checkpoint / "config.json").read_text())["vocab_size"]
    folder = tmp_path_factory.mktemp("llama") / "checkpoint"
    rope = {"rope_type": "default", "rope_theta": 1e5}
    model = random_model("llama", eos, vocab, tie_word_embeddings=True, rope_parameters=rope)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tiny_checkpoint / name).is_file():
            shutil.copy(tiny_checkpoint / name, folder / name)
    return folder


def test_a_llama_checkpoint_is_described_by_its_own_config(tiny_llama):
    info = describe_checkpoint("default", "tiny-llama", tiny_llama)
    assert info.family == "llama"
    assert info.n_positions == SHAPE["max_position_embeddings"]  # not GPT-J's n_positions
    assert info.end_ids == (info.eos_token_id,) and info.banned == (info.eos_token_id,)
    assert "llama, 2 layers x 64, 4 heads (2 key/value)" in info.description
    assert info.parameters > 0


def test_engine_and_transformers_agree_on_a_llama(tiny_llama):
    """Greedy tokens equal across both, each loaded by the checkpoint's family, and every
    system makes every token asked for."""
    info = describe_checkpoint("default", "tiny-llama", tiny_llama)
    prompts = random_prompts(3, 12, info.vocab_size, info.banned, seed=3)
    runners = [
        TransformersRunner(tiny_llama, "float32", "cpu"),
        EngineRunner(tiny_llama, "float32", "cpu", max_batch_size=4, prompt_tokens=12),
    ]
    try:
        assert "LlamaForCausalLM" in runners[0].detail and "Llama" in runners[1].detail
        outputs = [r.generate_ids(prompts, 16, sampled=False, seed=0) for r in runners]
        assert outputs[1] == outputs[0], "engine greedy differs from transformers"
        for runner in runners:
            assert generate(runner, prompts, 16, sampled=True, seed=1) == [16, 16, 16]
    finally:
        for runner in runners:
            runner.close()


def test_int8_runs_on_the_loader_every_family_uses(tiny_llama):
    assert unsupported("engine", "int8", "cpu") is None
    runner = EngineRunner(tiny_llama, "int8", "cpu", max_batch_size=2, prompt_tokens=8)
    try:
        assert "quantize=int8" in runner.detail
        assert generate(runner, [[5] * 8], 4, sampled=False, seed=0) == [4]
    finally:
        runner.close()


def test_beams_on_a_llama_match_transformers(tiny_llama):
    plan = replace(make_plan(quick=True), beam_widths=(1, 3), beam_prompts=2, beam_tokens=6)
    rows = run_beams(plan, describe_checkpoint("default", "t", tiny_llama), lambda _: None)
    assert [row["best_beams_agree"] for row in rows] == [2, 2]


def _word_level_llama(folder: Path, end_ids: list[int]) -> Path:
    """A config-only Llama folder whose tokenizer names its end tokens as SmolLM2's does
    (``<|im_end|>`` at 2, GPT-2's ``<|endoftext|>`` an ordinary token at 0)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    folder.mkdir()
    words = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|eot|>",
        *(f"w{i}" for i in range(60)),
    ]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|endoftext|>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>").save_pretrained(
        folder
    )
    config = {**SHAPE, "model_type": "llama", "vocab_size": len(words), "eos_token_id": end_ids}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_server_is_sent_the_models_own_end_tokens(tmp_path):
    info = describe_checkpoint("default", "d", _word_level_llama(tmp_path / "m", [2, 3]))
    assert info.eos_token_id == 2 and info.banned == (2, 3)
    assert info.end_words() == ("<|im_end|>", "<|eot|>")
    target = ServedTarget("x", ["a"], [1], end_words=info.end_words())
    assert target.end == {"bad_words": ("<|im_end|>", "<|eot|>")}


def test_random_prompts_hold_none_of_several_end_ids():
    prompts = random_prompts(16, 50, vocab_size=12, eos_id=[9, 2, 5], seed=0)
    flat = {t for p in prompts for t in p}
    assert flat == set(range(12)) - {2, 5, 9}
    assert random_prompts(2, 5, 20, 7, seed=1) == random_prompts(2, 5, 20, [7], seed=1)
