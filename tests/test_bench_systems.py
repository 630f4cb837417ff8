"""The bench's systems on real (tiny) checkpoints: the engine generates what transformers
generates, the forward ceiling, the beams, and what a system cannot run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bench.beams import run_beams
from bench.load import forward_ceiling
from bench.models import build_random_gptj, describe_checkpoint, random_prompts
from bench.settings import make_plan
from bench.systems import EngineRunner, TransformersRunner, generate, unsupported
from bench.tables import throughput_verdict
from engine.gptj import GPTJ


def _greedy_equal_everywhere(checkpoint, eos: int, vocab: int) -> None:
    """The engine greedy-generates transformers' tokens, and every system makes exactly the
    tokens asked for (the end token is banned)."""
    prompts = random_prompts(3, 12, vocab, eos, seed=3)
    runners = [
        TransformersRunner(checkpoint, "float32", "cpu"),
        EngineRunner(checkpoint, "float32", "cpu", max_batch_size=4, prompt_tokens=12),
    ]
    try:
        outputs = [r.generate_ids(prompts, 20, sampled=False, seed=0) for r in runners]
        assert outputs[1] == outputs[0], "engine greedy differs from transformers"
        for runner in runners:
            assert generate(runner, prompts, 20, sampled=True, seed=1) == [20, 20, 20]
    finally:
        for runner in runners:
            runner.close()


def test_the_engine_generates_transformers_tokens_on_the_tiny_checkpoint(tiny_checkpoint):
    info = describe_checkpoint("default", "tiny", tiny_checkpoint)
    assert info.parameters > 0
    _greedy_equal_everywhere(tiny_checkpoint, info.eos_token_id, info.vocab_size)


def test_random_model_with_word_level_vocabulary_generates_too(tmp_path):
    """The 350M-shaped model's path (random GPT-J + made-up vocabulary), at a tiny shape."""
    shape = {
        "vocab_size": 300,
        "n_positions": 128,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "rotary_dim": 4,
    }
    folder = build_random_gptj(tmp_path / "random", shape, eos_id=299, progress=lambda _: None)
    info = describe_checkpoint("350m", "random", folder)
    assert info.eos_token_id == 299 and info.vocab_size == 300
    torch.manual_seed(0)
    _greedy_equal_everywhere(folder, 299, 300)


def test_forward_ceiling_times_decode_passes_at_the_closed_loops_positions(tiny_checkpoint):
    model = GPTJ.from_checkpoint(tiny_checkpoint)
    passes = []
    step = model.step

    def recorded(segments, cache):
        passes.append(segments)
        return step(segments, cache)

    model.step = recorded
    ceiling = forward_ceiling(
        model, [5, 9, 30], rows=6, length=40, repeats=4, budget_s=float("inf")
    )
    assert ceiling > 0
    assert len(passes) == 3 + 4  # warm-up passes, then the timed ones
    for (segment,) in passes:
        assert segment.tokens.shape == (6, 1)  # one decode token per row, no prefill
        positions = segment.start.tolist()
        assert all(5 <= p < 30 + 40 for p in positions) and len(set(positions)) > 1


def test_throughput_target_is_judged_at_its_length_only():
    assert throughput_verdict({"length": 8, "bare_tokens_per_s": 10.0}) == "—"
    assert throughput_verdict({"length": 128, "bare_tokens_per_s": 2000.0}) == "MISSED"
    assert throughput_verdict({"length": 128, "bare_tokens_per_s": 2500.0}) == "ok"


def test_random_prompts_never_hold_the_end_token():
    prompts = random_prompts(8, 50, vocab_size=20, eos_id=7, seed=0)
    assert all(len(p) == 50 for p in prompts)
    flat = {t for p in prompts for t in p}
    assert 7 not in flat and flat <= set(range(20)) and 19 in flat


def test_beam_section_measures_both_systems_on_the_same_beams(tiny_checkpoint):
    plan = replace(make_plan(quick=True), beam_widths=(1, 3), beam_prompts=2, beam_tokens=6)
    model = describe_checkpoint("default", "tiny", tiny_checkpoint)
    rows = run_beams(plan, model, lambda message: None)
    assert [row["width"] for row in rows] == [1, 3]
    for row in rows:
        assert row["best_beams_agree"] == 2  # the engine's best beams are transformers'
        assert row["engine_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0
        every_beam = row["width"] * row["engine_tokens_per_s"]
        assert row["engine_beam_tokens_per_s"] == pytest.approx(every_beam)
    assert rows[1]["kv_cache_peak_mib"] > rows[0]["kv_cache_peak_mib"]  # 3 rows a prompt


def test_what_a_system_cannot_run_is_said():
    assert unsupported("transformers", "int8", "cuda") is not None
    assert unsupported("transformers", "int8", "cpu") is None
    assert unsupported("engine", "float32", "cpu") is None
