"""The bench's openvino side: CPU flags, the stand-in end id,
the targets table, the openvino tables, and the openvino runners on the tiny checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import report
from bench.load import BareTarget, ServedTarget
from bench.models import END_OF_TEXT, random_prompts
from bench.quality import agreement
from bench.settings import make_plan
from bench.systems import (
    OpenVINORunner,
    PipelineGenerate,
    TransformersRunner,
    generate,
    served_dtype,
    stand_in_end_id,
    unsupported,
)
from bench.targets import held_at, target_rows, targets_table
from bench.traffic import key, mirrored, target_length
from engine.interface import GenerationRequest, Handle


def test_arrivals_measure_each_system_twice_in_mirrored_order():
    assert mirrored(["bare", "served", "pipeline"]) == [
        "bare",
        "served",
        "pipeline",
        "pipeline",
        "served",
        "bare",
    ]
    assert mirrored(["bare"]) == ["bare", "bare"]


def test_the_served_dtype_follows_native_bfloat16():
    assert served_dtype(["avx512_bf16"]) == "bfloat16"
    assert served_dtype(["avx2", "fma", "avx512f"]) == "float32"


def test_stand_in_end_id_is_in_the_vocabulary_and_never_the_end_token():
    assert stand_in_end_id(4096, 0) == 4095
    assert stand_in_end_id(300, 299) == 298
    with pytest.raises(ValueError, match="no stand-in"):
        stand_in_end_id(1, 0)


def test_plan_has_openvino_everywhere_and_backends_can_be_chosen():
    for plan in (make_plan(), make_plan(quick=True)):
        assert "openvino" in plan.systems and plan.backends == ("openvino", "torch")
    assert make_plan(backends="openvino").backends == ("openvino",)
    with pytest.raises(ValueError, match="unknown backends"):
        make_plan(backends="tensorrt")
    assert make_plan(device="cuda").backends == ("torch",)  # openvino is CPU-only here
    with pytest.raises(ValueError, match="CPU only"):
        make_plan(device="cuda", backends="torch,openvino")
    assert unsupported("openvino", "int8", "cpu") is not None
    assert unsupported("openvino", "bfloat16", "cuda") is not None
    assert unsupported("openvino", "bfloat16", "cpu") is None


def test_result_keys_and_target_length():
    assert key("torch", "bare") == "bare" and key("openvino", "served") == "openvino_served"
    assert target_length((8, 32, 128, 512)) == 128 and target_length((8, 32)) == 32
    assert held_at([8, 32, 128, 512], 512) == 512 and held_at([8, 32], 128) == 32
    assert held_at([], 128) is None


class _Engine:
    """Records what a target submits and answers at once with ``new`` tokens."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    def submit(self, request, listener) -> Handle:
        from engine.interface import GenerationResult

        self.requests.append(request)
        listener.on_finish(
            GenerationResult(request.prompt_ids, [1] * request.max_new_tokens, [], "length")
        )
        return Handle()


def test_bare_targets_keep_the_end_token_out_each_backends_way():
    torch_engine, ov_engine = _Engine(), _Engine()
    assert BareTarget(torch_engine, [[5, 6]], eos=0).request(0, 4) == 4
    assert BareTarget(ov_engine, [[5, 6]], eos=0, end_id=4095, name="openvino_bare").request(1, 4)
    banned, stand_in = torch_engine.requests[0], ov_engine.requests[0]
    assert banned.bad_words == [[0]] and banned.end_id is None
    assert stand_in.bad_words == [] and stand_in.end_id == 4095
    assert not stand_in.return_log_probs  # the bench measures generation, not scoring
    assert stand_in.sampling.temperature == 0.8 and stand_in.sampling.top_k == 40


def test_served_targets_send_bad_words_or_the_stand_in():
    assert ServedTarget("x", ["a"], [1]).end == {"bad_words": (END_OF_TEXT,)}
    assert ServedTarget("x", ["a"], [1], end_id=7, name="openvino_served").end == {"end_id": 7}


def test_agreement_counts_tokens_before_the_first_difference():
    share, equal = agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 9, 7, 8]])
    assert share == pytest.approx((4 + 1) / 8) and equal == 1


def _results() -> dict:
    plan = make_plan()
    kernels = [
        {
            "model": "default",
            "plan_key": "default",
            "dtype": d,
            "system": s,
            "batch": b,
            "mode": "greedy",
            "tokens_per_s": v,
        }
        for d in ("float32", "bfloat16")
        for b in (16, 64)
        for s, v in (("engine", 1000.0), ("openvino", 2000.0 if b == 16 else 1200.0))
    ]
    arrival = {
        "length": 128,
        "bare_tokens_per_s": 1000.0,
        "served_tokens_per_s": 950.0,
        "served_over_bare": 0.95,
        "openvino_bare_tokens_per_s": 2000.0,
        "openvino_served_tokens_per_s": 1700.0,
        "openvino_served_over_bare": 0.85,
        "pipeline_tokens_per_s": 2000.0,
        "transformers_static_tokens_per_s": 800.0,
        "transformers_static_dtype": "bfloat16",
    }
    return {
        "machine": {"cores": 2, "cpu_flags": ["avx512_bf16"], "bf16_native": True},
        "machine_label": "2 cores, Test CPU",
        "plan": plan.to_dict(),
        "models": [{"name": "default", "description": "tiny", "path": "/x"}],
        "notes": [],
        "kernels": kernels,
        "load_settings": {"model": "default", "dtype": "float32", "openvino_dtype": "bfloat16"},
        "arrivals": [arrival, {"length": 512, "openvino_served_over_bare": 0.95}],
        "mixed": [{"path": "openvino_served", "slowdown": 2.5}],
        "single": {
            "openvino_bare_median_ms": 10.0,
            "openvino_served_median_ms": 14.0,
            "openvino_served_overhead_ms": 4.0,
            "repeats": 3,
        },
        "prefix_served": [
            {
                "model": "350m",
                "path": "engine (stream)",
                "dtype": "bfloat16",
                "prompt_tokens": 1000,
                "new": 16,
                "cold_first_s": 0.5,
                "cold_total_s": 0.9,
                "resent_first_s": 0.08,
                "resent_total_s": 0.45,
            },
            {
                "model": "default",
                "path": "ensemble (unary)",
                "dtype": "bfloat16",
                "prompt_tokens": 650,
                "new": 16,
                "cold_total_s": 0.3,
                "resent_total_s": 0.1,
                "cold_over_resent": 3.0,
            },
        ],
    }


def test_targets_are_ratios_from_the_run_with_pass_and_fail():
    rows = {(r["target"], r["how"]): r for r in target_rows(_results())}
    by_name: dict[str, list[dict]] = {}
    for (name, _how), row in rows.items():
        by_name.setdefault(name, []).append(row)
    static16 = by_name["openvino >= 1.5x torch, static batch 16"]
    assert [r["verdict"] for r in static16] == ["PASS", "PASS"]  # float32, bfloat16: 2.0x
    assert {r["verdict"] for r in by_name["openvino >= 1.5x torch, static batch 64"]} == {"FAIL"}
    served = by_name["openvino served >= 1.5x torch served"][0]
    assert served["value"] == pytest.approx(1700 / 950) and served["verdict"] == "PASS"
    assert by_name["openvino served >= 2.0x transformers static generate"][0]["verdict"] == "PASS"
    pipeline = by_name["server >= 0.8x the pipeline's own generate, same batch"][0]
    assert pipeline["value"] == pytest.approx(0.85) and pipeline["verdict"] == "PASS"
    ov_bare = [r["verdict"] for r in by_name["served/bare >= 0.9 (openvino)"]]
    assert ov_bare == ["FAIL", "PASS"]  # 0.85 at 128, 0.95 at 512
    torch_bare = [r["verdict"] for r in by_name["served/bare >= 0.9 (torch)"]]
    assert torch_bare == ["PASS", "not measured"]  # no torch row at 512
    assert by_name["resent prompt: first token <= 100 ms"][0]["verdict"] == "PASS"
    assert by_name["resent prompt: 16-token answer <= 400 ms"][0]["verdict"] == "FAIL"
    assert by_name["resent prompt answers >= 2.5x faster than cold"][0]["verdict"] == "PASS"
    mixed = by_name["mixed lengths: short median <= 2x alone (openvino served)"][0]
    assert mixed["verdict"] == "FAIL"
    title = targets_table(_results())[0]
    assert "FAIL" in title and "PASS" in title


def test_targets_without_measurements_say_not_measured():
    results = _results()
    for name in ("kernels", "arrivals", "mixed", "prefix_served"):
        results.pop(name)
    rows = target_rows(results)
    assert rows and {r["verdict"] for r in rows} == {"not measured"}


def test_report_has_openvino_tables_flags_load_and_targets(tmp_path):
    results = _results()
    results.update(started="now", load_start="1.00 0.50 0.25", load_end="2.00 1.00 0.50")
    results["machine"].update(torch="2", transformers="5", tritonclient="2")
    written = report.write_all(tmp_path, results)
    assert {p.name for p in written} == {"results.json", "results.md", "chart.png"}
    md = (tmp_path / "results.md").read_text()
    assert "CPU flags: avx512_bf16 (bfloat16 native: yes)" in md
    assert "at the start 1.00 0.50 0.25, at the end 2.00 1.00 0.50" in md
    assert "## Continuous arrivals: openvino backend vs torch engine, 16 clients" in md
    assert "| 128 | 1,000 | 950 | 2,000 | 1,700 | 0.85 | 1.79 | 2,000 | 800 | 0 |" in md
    assert "| openvino | 10.0 | 14.0 | 4.0 | ok |" in md  # single, the openvino row
    assert "## Prefix through the server" in md and "## Targets: " in md


# -- the runners on the tiny checkpoint (its OpenVINO export: conftest) ------------------------


def test_openvino_runner_makes_every_token_and_float32_matches_transformers(tiny_checkpoint):
    from bench.models import describe_checkpoint

    info = describe_checkpoint("default", "tiny", tiny_checkpoint)
    prompts = random_prompts(3, 12, info.vocab_size, info.eos_token_id, seed=3)
    reference = TransformersRunner(tiny_checkpoint, "float32", "cpu")
    runner = OpenVINORunner(tiny_checkpoint, "float32", "cpu", max_batch_size=4, prompt_tokens=12)
    try:
        expected = reference.generate_ids(prompts, 20, sampled=False, seed=0)
        assert runner.generate_ids(prompts, 20, sampled=False, seed=0) == expected
        assert generate(runner, prompts, 20, sampled=True, seed=1) == [20, 20, 20]
    finally:
        runner.close()
        reference.close()
    pipe = PipelineGenerate(tiny_checkpoint, "float32", max_batch_size=4)
    assert pipe.generate_ids(prompts, 20, sampled=False, seed=0) == expected
    assert [len(ids) for ids in pipe.generate_ids(prompts, 20, sampled=True, seed=1)] == [20] * 3
    assert pipe.rate_over(prompts, 8, sampled=True, seed=2, seconds=0.0) > 0
    pipe.close()
    assert pipe.pipe is None


def test_quick_plan_still_selects_everything():
    quick = make_plan(quick=True)
    assert replace(quick, backends=("torch",)).backends == ("torch",)
    assert quick.prefix_repeats == 1 and make_plan().prefix_repeats == 3
