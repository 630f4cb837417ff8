"""Gemma 3 (``gemma3_text``) end to end on a tiny random checkpoint: `make model`'s import of an
HF folder, the torch engine's module (engine/gemma3.py) against transformers' logits, prefill and
every cached step, past the sliding window, and greedy tokens through ``TorchEngine`` and the
OpenVINO export against transformers' ``generate`` (float32)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from engine_runs import run_concurrently
from llama_checkpoints import project_tokenizer, save_source
from test_llama_family import check_greedy, check_logits, hf_greedy, prompts

from engine import GenerationRequest, TorchEngine
from engine.cache import KVCache, split_long_rows
from engine.gemma3 import Gemma3, Gemma3Config
from engine.models import load_model, read_config
from engine.openvino_model import ModelShape, require_export
from modelbuild.importer import import_checkpoint
from modelbuild.openvino_export import ensure_export

WINDOW = 8  # shorter than the sequences below, so the sliding layers do cut
# 3 layers: sliding, full, sliding; 4 query heads share 2 key/value heads; head_dim 16 != 64/4
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "sliding_window": WINDOW,
    "query_pre_attn_scalar": 16,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "initializer_range": 0.1,
}
ATOL = 1e-4


def random_gemma3(vocab: int, eos: int, **overrides) -> transformers.Gemma3ForCausalLM:
    """A random tiny Gemma 3 (seed 0), its norms random too (they start at zero: 1 + w)."""
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        **{**SHAPE, **overrides},
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return project_tokenizer()


@pytest.fixture(scope="module")
def gemma(tokenizer, tmp_path_factory):
    """(transformers model, imported checkpoint folder)."""
    model = random_gemma3(len(tokenizer), tokenizer.eos_token_id)
    source = save_source(model, tokenizer, tmp_path_factory.mktemp("gemma3-source"))
    return model, import_checkpoint(str(source), tmp_path_factory.mktemp("gemma3") / "checkpoint")


def test_the_import_installs_the_checkpoint_unchanged(gemma, tokenizer):
    model, checkpoint = gemma
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == WINDOW
    loaded = transformers.Gemma3ForCausalLM.from_pretrained(checkpoint).eval()
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key
    assert "(gemma3_text checkpoint)" in (checkpoint / "MODEL_CARD.md").read_text()
    shape = ModelShape.read(checkpoint)
    assert (shape.n_layer, shape.n_embd, shape.context) == (3, 64, 256)
    assert shape.eos_token_id == tokenizer.eos_token_id


def test_the_config_reads_layer_types_and_each_rotary_base(gemma):
    _, checkpoint = gemma
    config = read_config(checkpoint)
    assert isinstance(config, Gemma3Config)
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.rope["full_attention"]["rope_theta"] == 1e6
    assert config.rope["sliding_attention"]["rope_theta"] == 1e4
    assert config.n_positions == 256  # the window masks; it does not cut the context


def test_the_window_changes_transformers_logits_so_the_tests_below_exercise_it(tokenizer):
    ids = torch.randint(1, len(tokenizer), (1, 3 * WINDOW))
    with torch.no_grad():
        windowed = random_gemma3(len(tokenizer), 0)(ids).logits[0]
        whole = random_gemma3(len(tokenizer), 0, sliding_window=256)(ids).logits[0]
    assert (windowed[:WINDOW] - whole[:WINDOW]).abs().max() < ATOL
    assert (windowed[WINDOW:] - whole[WINDOW:]).abs().max() > 1e-2


def test_logits_match_transformers_for_prefill_and_each_cached_step(gemma, tokenizer):
    hf, checkpoint = gemma
    model = load_model(checkpoint)
    assert isinstance(model, Gemma3)
    check_logits(model, hf, len(tokenizer), [12, 7, 3, 20], decode_steps=6)


def test_decode_attends_long_rows_alone_and_matches_transformers(gemma, tokenizer):
    hf, checkpoint = gemma
    lengths = [3, 40, 5, 2, 30, 4]
    assert split_long_rows([n + 1 for n in lengths])[1]  # this batch does take rows out
    check_logits(load_model(checkpoint), hf, len(tokenizer), lengths, decode_steps=2)


def test_every_step_of_a_prompt_past_the_window_matches_transformers(gemma, tokenizer):
    hf, checkpoint = gemma
    model = load_model(checkpoint)
    ids = torch.randint(1, len(tokenizer), (2, 4 * WINDOW))
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(2, ids.shape[1])
    logits = model(ids, torch.tensor([0, 0]), None, cache, slice(0, 2))
    with torch.no_grad():
        expected = hf(ids).logits
    assert (logits - expected).abs().max() < ATOL


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 2e4},
            }
        },
        {"final_logit_softcapping": 3.0},
        {"num_key_value_heads": 1, "layer_types": None, "sliding_window_pattern": 2},
    ],
    ids=["linear-rope-on-full-layers", "final-softcap", "one-kv-head-pattern"],
)
def test_variants_match_transformers(overrides, tokenizer, tmp_path):
    hf = random_gemma3(len(tokenizer), tokenizer.eos_token_id, **overrides)
    hf.save_pretrained(tmp_path)
    check_logits(load_model(tmp_path), hf, len(tokenizer), [15, 4], decode_steps=3)


def test_an_older_config_with_flat_rope_keys_is_read(tmp_path):
    raw = {
        "model_type": "gemma3_text",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window_pattern": 6,
    }
    config = Gemma3Config.from_dict(raw)
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert config.rope["full_attention"] == {
        "rope_type": "linear",
        "factor": 8.0,
        "rope_theta": 1e6,
    }
    assert config.rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not implemented"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}},
            "rope type 'yarn' .full_attention. is not implemented",
        ),
    ],
    ids=["attention-softcap", "bidirectional", "activation", "yarn"],
)
def test_what_the_module_does_not_implement_is_refused_at_load(tmp_path, change, message):
    raw = {**SHAPE, "model_type": "gemma3_text", "vocab_size": 300, **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        read_config(tmp_path)


def test_bfloat16_and_int8_load(gemma):
    _, checkpoint = gemma
    half = load_model(checkpoint, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16 and half.cos.dtype == torch.float32
    quantized = load_model(checkpoint, quantize="int8")
    cache = KVCache.empty(quantized.config, torch.float32)
    cache.reserve(1, 8)
    ids = torch.tensor([[5, 6, 7]])
    assert quantized(ids, torch.tensor([0]), torch.tensor([2]), cache, slice(0, 1)).isfinite().all()


def test_torch_engine_greedy_matches_transformers_generate(gemma, tokenizer):
    hf, checkpoint = gemma
    engine = TorchEngine(load_model(checkpoint), max_batch_size=8).start()
    try:
        batch = prompts(6, 20, len(tokenizer))
        new = [3, 24, 9, 1, 17, 12]
        assert max(len(p) + n for p, n in zip(batch, new, strict=True)) > 2 * WINDOW
        requests = [GenerationRequest(p, n) for p, n in zip(batch, new, strict=True)]
        results = run_concurrently(engine, requests)
    finally:
        engine.stop()
    check_greedy(hf, batch, new, results)


def test_openvino_export_greedy_matches_transformers_generate(gemma, tokenizer):
    """The export (made in .venv-export, as `make model` makes it) past the window."""
    from engine.openvino_backend import OpenVINOBackend

    hf, checkpoint = gemma
    ensure_export(checkpoint)
    backend = OpenVINOBackend(require_export(checkpoint), ModelShape.read(checkpoint)).start()
    try:
        batch = prompts(5, 30, len(tokenizer), seed=2)
        new = [30, 3, 25, 12, 20]
        assert max(len(p) + n for p, n in zip(batch, new, strict=True)) > 4 * WINDOW
        requests = [GenerationRequest(p, n) for p, n in zip(batch, new, strict=True)]
        results = run_concurrently(backend, requests)
    finally:
        backend.stop()
    for prompt, n, result in zip(batch, new, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, n)
