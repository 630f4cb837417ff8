"""The openvino backend's settings and scores: bfloat16 where the CPU has it, log probs under
temperature and penalty equal to transformers' and the torch engine's, options it ignores as
FasterTransformer does, a stale export, a dead owner thread."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from engine_runs import Collect, prompts
from openvino_gptj import backend, exported_gptj

from contract.options import BeamParams, SamplingParams
from engine import TorchEngine
from engine.gptj import GPTJ
from engine.interface import GenerationRequest
from engine.openvino_model import (
    STAMP,
    PrecisionError,
    compile_properties,
    cpu_capabilities,
    export_problem,
    require_export,
)


@pytest.fixture(scope="module")
def hf_model():
    return exported_gptj()


@pytest.fixture(scope="module")
def engine(hf_model):
    eng = backend(hf_model[1])
    yield eng
    eng.stop()


NATIVE, EMULATED = ["BF16", "FP32", "INT8"], ["FP32", "INT8"]  # AVX-512 BF16 / AVX2 CPUs


def test_bfloat16_runs_the_math_and_the_kv_cache_in_bfloat16_where_the_cpu_has_it():
    assert compile_properties("float32", capabilities=EMULATED)["KV_CACHE_PRECISION"] == "f32"
    properties = compile_properties("bfloat16", capabilities=NATIVE)
    assert properties["INFERENCE_PRECISION_HINT"] == properties["KV_CACHE_PRECISION"] == "bf16"


def test_bfloat16_on_a_cpu_without_it_is_refused_at_load_naming_the_setting_and_flag():
    with pytest.raises(PrecisionError, match=r"dtype bfloat16 needs .*avx512_bf16.*float32"):
        compile_properties("bfloat16", capabilities=EMULATED)


def test_this_cpu_serves_bfloat16_or_refuses_it_as_its_capabilities_say(hf_model):
    """Whichever kind of CPU runs the suite, the real backend takes the branch OpenVINO's
    capabilities choose (the other is covered above, by injection): no crash in a request."""
    if "BF16" not in cpu_capabilities():
        with pytest.raises(PrecisionError, match="avx512_bf16"):
            backend(hf_model[1], dtype="bfloat16")
        return
    eng = backend(hf_model[1], dtype="bfloat16")
    try:
        assert len(eng.generate(GenerationRequest(prompts(1)[0], 8)).output_ids) == 8
    finally:
        eng.stop()


# the options of the load test this project was built from, one beam and all
SEED_SAMPLING = SamplingParams(
    top_k=3, top_p=0.92, temperature=0.5, repetition_penalty=1.1, seed=42
)


def teacher_forced_log_probs(hf, prompt, tokens, temperature, penalty) -> list[float]:
    """Each token's log prob under transformers' logits, penalised (tokens seen so far, the
    prompt's included) and divided by the temperature, over the whole vocabulary."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0].double()
    seen, out = set(prompt), []
    for i, token in enumerate(tokens):
        z = logits[len(prompt) - 1 + i]
        mask = torch.zeros_like(z, dtype=torch.bool)
        mask[list(seen)] = True
        z = torch.where(mask, torch.where(z < 0, z * penalty, z / penalty), z) / temperature
        out.append(float(z[token] - torch.logsumexp(z, 0)))
        seen.add(token)
    return out


def test_log_probs_under_temperature_and_penalty_are_the_drawn_distributions(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=4)[0]
    request = GenerationRequest(prompt, 24, sampling=SEED_SAMPLING, return_log_probs=True)
    result = engine.generate(request)
    assert result.finish_reason == "length" and len(result.log_probs) == 24
    expected = teacher_forced_log_probs(hf, prompt, result.output_ids, 0.5, 1.1)
    assert result.log_probs == pytest.approx(expected, abs=1e-3)
    raw = engine.generate(replace(request, return_log_probs=False))
    assert raw.output_ids == result.output_ids  # scoring changes no token


def test_greedy_log_probs_under_a_penalty_equal_the_torch_engines(hf_model, engine):
    reference = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=2).start()
    try:
        for sampling in (
            SamplingParams(temperature=0.7, repetition_penalty=1.3),
            SamplingParams(repetition_penalty=0.8),
            SamplingParams(temperature=0.0, top_k=1, repetition_penalty=1.2),
        ):
            request = GenerationRequest(prompts(1, seed=6)[0], 16, sampling=sampling)
            expected, got = reference.generate(request), engine.generate(request)
            assert got.output_ids == expected.output_ids
            assert got.log_probs == pytest.approx(expected.log_probs, abs=1e-3)
    finally:
        reference.stop()


def test_a_diversity_rate_without_beams_is_ignored_as_fastertransformer_does(engine):
    request = GenerationRequest(prompts(1, seed=8)[0], 12, sampling=SEED_SAMPLING)
    plain = engine.generate(request)
    rated = engine.generate(replace(request, beam=BeamParams(1, diversity_rate=0.5)))
    assert rated.finish_reason == plain.finish_reason == "length"
    assert rated.output_ids == plain.output_ids


def test_a_stale_or_missing_export_names_what_to_run(hf_model, tmp_path):
    _, path = hf_model
    assert export_problem(path) is None
    assert "no checkpoint" in export_problem(tmp_path / "nothing")
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for file in path.iterdir():
        if file.is_file():
            (copy / file.name).write_bytes(file.read_bytes())
    with pytest.raises(Exception, match="make model"):
        require_export(copy)
    (copy / "openvino").mkdir()
    for file in (path / "openvino").iterdir():
        (copy / "openvino" / file.name).write_bytes(file.read_bytes())
    assert export_problem(copy) is None
    (copy / "tokenizer.json").write_text("{}")  # the tokenizer is not in the fingerprint
    stamp = json.loads((copy / "openvino" / STAMP).read_text())
    (copy / "openvino" / STAMP).write_text(json.dumps({**stamp, "tokenizer": True}))
    assert export_problem(copy) is None
    del stamp["tokenizer"]  # an export from before exports carried the tokenizer
    (copy / "openvino" / STAMP).write_text(json.dumps(stamp))
    assert "tokenizer that token healing needs" in export_problem(copy)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("300", "301"))
    assert "stale" in export_problem(copy)


def test_a_dead_owner_thread_shows_as_not_alive_and_not_stopping(hf_model):
    """What the engine stub watches to exit (backend/engine_stage.py): the thread ended while
    nobody stopped it."""
    eng = backend(hf_model[1], max_batch_size=2)
    real = eng.pipe

    class Dies:
        def __getattr__(self, name):
            return getattr(real, name)

        def step(self):
            raise SystemExit("the owner thread ends")  # not an Exception: escapes the loop

    try:
        eng.pipe = Dies()
        eng.submit(GenerationRequest([1, 2, 3], 10), Collect())
        eng._thread.join(30)
        assert not eng.alive and not eng.stopping
    finally:
        eng.stop()
