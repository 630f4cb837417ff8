"""The bench's systems on real (tiny) checkpoints: the CTranslate2 conversion and the engine
generate what transformers generates, the forward ceiling, the beams, and what a missing
CTranslate2 says."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bench import report
from bench.beams import run_beams
from bench.load import forward_ceiling
from bench.models import build_random_gptj, convert_ct2, describe_checkpoint, random_prompts
from bench.settings import make_plan
from bench.systems import CT2Runner, EngineRunner, TransformersRunner, generate
from engine.gptj import GPTJ


def _greedy_equal_everywhere(checkpoint, tmp_path, eos: int, vocab: int) -> None:
    """CTranslate2's conversion and our engine greedy-generate transformers' tokens, and every
    system makes exactly the tokens asked for (the end token is banned)."""
    prompts = random_prompts(3, 12, vocab, eos, seed=3)
    converted = convert_ct2(checkpoint, tmp_path / "ct2", "float32", progress=lambda _: None)
    assert (converted / "model.bin").is_file()
    runners = [
        TransformersRunner(checkpoint, "float32", "cpu"),
        CT2Runner(converted, "float32", "cpu"),
        EngineRunner(checkpoint, "float32", "cpu", max_batch_size=4, prompt_tokens=12),
    ]
    try:
        outputs = [r.generate_ids(prompts, 20, sampled=False, seed=0) for r in runners]
        assert outputs[1] == outputs[0], "CTranslate2 greedy differs from transformers"
        assert outputs[2] == outputs[0], "engine greedy differs from transformers"
        for runner in runners:
            assert generate(runner, prompts, 20, sampled=True, seed=1) == [20, 20, 20]
    finally:
        for runner in runners:
            runner.close()
    # converted once: a second call reuses the folder
    stamp = (converted / "model.bin").stat().st_mtime
    convert_ct2(checkpoint, tmp_path / "ct2", "float32", progress=lambda _: None)
    assert (converted / "model.bin").stat().st_mtime == stamp


def test_ct2_conversion_of_the_tiny_checkpoint_generates_transformers_tokens(
    tiny_checkpoint, tmp_path
):
    info = describe_checkpoint("default", "tiny", tiny_checkpoint)
    assert info.parameters > 0
    _greedy_equal_everywhere(tiny_checkpoint, tmp_path, info.eos_token_id, info.vocab_size)


def test_random_model_with_word_level_vocabulary_converts_too(tmp_path):
    """The 350M-shaped model's path (random GPT-J + made-up vocabulary), at a tiny shape."""
    shape = {"vocab_size": 300, "n_positions": 128, "n_embd": 32, "n_layer": 2, "n_head": 4,
             "rotary_dim": 4}  # fmt: skip
    folder = build_random_gptj(tmp_path / "random", shape, eos_id=299, progress=lambda _: None)
    info = describe_checkpoint("350m", "random", folder)
    assert info.eos_token_id == 299 and info.vocab_size == 300
    torch.manual_seed(0)
    _greedy_equal_everywhere(folder, tmp_path, 299, 300)


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
    assert report.throughput_verdict({"length": 8, "bare_tokens_per_s": 10.0}) == "—"
    assert report.throughput_verdict({"length": 128, "bare_tokens_per_s": 2000.0}) == "MISSED"
    assert report.throughput_verdict({"length": 128, "bare_tokens_per_s": 2500.0}) == "ok"


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


def test_a_missing_ctranslate2_is_reported_as_not_installed(monkeypatch):
    """Not as "no float32 on this cpu": the run says what is missing and how to install it."""
    from bench import systems

    real = systems.importlib.util.find_spec
    monkeypatch.setattr(
        systems.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ctranslate2" else real(name, *a),
    )
    reason = systems.unsupported("ct2", "float32", "cpu")
    assert reason is not None and "not installed" in reason and "pip install ctranslate2" in reason
    assert systems.unsupported("engine", "float32", "cpu") is None
