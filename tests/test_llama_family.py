"""The Llama family (llama, qwen2, mistral, starcoder2), end to end on a tiny random checkpoint of
each: `make model`'s import, the torch engine's module (engine/llama.py) against transformers'
logits, prefill and the KV-cache path alike, and greedy tokens through ``TorchEngine`` and the
OpenVINO backend against transformers' ``generate`` (float32)."""

from __future__ import annotations

import json

import pytest
import torch
from engine_runs import run_concurrently
from llama_checkpoints import FAMILIES, SHAPE, WINDOW, project_tokenizer, random_model, save_source
from safetensors import safe_open

from engine import GenerationRequest, TorchEngine
from engine.cache import KVCache, split_long_rows
from engine.families import UnsupportedModelError
from engine.llama import Llama, LlamaConfig
from engine.models import load_model, read_config
from engine.openvino_model import ModelShape, require_export
from modelbuild.importer import CheckpointImportError, import_checkpoint
from modelbuild.openvino_export import ensure_export

ATOL = 1e-4
TINY_CONFIG = {
    key: SHAPE[key]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
    )
}


@pytest.fixture(scope="module")
def tokenizer():
    return project_tokenizer()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tokenizer, tmp_path_factory):
    """(name, transformers model, imported checkpoint folder) for each family."""
    name = request.param
    model = random_model(name, tokenizer.eos_token_id, len(tokenizer))
    source = save_source(model, tokenizer, tmp_path_factory.mktemp(f"{name}-source"))
    checkpoint = import_checkpoint(str(source), tmp_path_factory.mktemp(name) / "checkpoint")
    return name, model, checkpoint


def prompts(count: int, longest: int, vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, longest, (count,), generator=gen).tolist()
    return [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]


def requests(batch: list[list[int]], new: list[int]) -> list[GenerationRequest]:
    return [GenerationRequest(prompt, n) for prompt, n in zip(batch, new, strict=True)]


def check_greedy(hf, batch: list[list[int]], new: list[int], results) -> None:
    """Each result is transformers' greedy answer, and they are not all cut short by the end
    token (which would compare nothing)."""
    for prompt, n, result in zip(batch, new, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, n)
    assert sum(len(result.output_ids) for result in results) > sum(new) // 2


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    """transformers' greedy tokens, up to the end token (which the engines do not return)."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=model.config.eos_token_id,
    )[0, len(prompt) :].tolist()
    eos = model.config.eos_token_id
    return out[: out.index(eos)] if eos in out else out


def hf_last_logits(model, ids: list[int] | torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.as_tensor(ids)[None]).logits[0, -1]


# -- import and shape ---------------------------------------------------------------------------


def test_import_installs_config_weights_and_tokenizer_unchanged(family, tokenizer):
    name, model, checkpoint = family
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == name
    assert config["num_key_value_heads"] == 2
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
        for key, tensor in model.state_dict().items():
            if key in names:
                assert torch.equal(weights.get_tensor(key), tensor), key
    assert {k for k in model.state_dict() if k != "lm_head.weight"} <= names
    assert (checkpoint / "generation_config.json").is_file()
    text = "def add(a, b):\n    return a + b\n"
    loaded = type(tokenizer).from_pretrained(checkpoint)
    assert loaded.encode(text) == tokenizer.encode(text)
    assert f"({name} checkpoint)" in (checkpoint / "MODEL_CARD.md").read_text()


def test_model_shape_reads_the_family(family, tokenizer):
    _, _, checkpoint = family
    shape = ModelShape.read(checkpoint)
    assert (shape.n_layer, shape.n_embd, shape.vocab_size) == (2, 64, len(tokenizer))
    assert (shape.context, shape.eos_token_id) == (256, tokenizer.eos_token_id)


def test_a_list_of_end_ids_or_none_is_read(tmp_path):
    config = {
        "model_type": "llama",
        "vocab_size": 300,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "max_position_embeddings": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": [7, 9]}))
    assert ModelShape.read(tmp_path).eos_token_id == 7
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert ModelShape.read(tmp_path).eos_token_id == 5


# -- the torch module against transformers ------------------------------------------------------


def check_logits(model, hf, vocab: int, lengths: list[int], decode_steps: int = 4) -> None:
    """Prefill right-padded prompts of ``lengths``, then decode ``decode_steps`` tokens on the
    cache; every step's logits equal transformers' full forward over the sequence so far."""
    ids = torch.randint(1, vocab, (len(lengths), max(lengths)))
    rows = slice(0, len(lengths))
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(len(lengths), max(lengths) + decode_steps)
    start = torch.zeros(len(lengths), dtype=torch.long)
    sequences = [ids[row, :n].tolist() for row, n in enumerate(lengths)]
    logits = model(ids, start, torch.tensor(lengths) - 1, cache, rows)
    for step in range(decode_steps + 1):
        for row, sequence in enumerate(sequences):
            expected = hf_last_logits(hf, sequence)
            assert (logits[row] - expected).abs().max() < ATOL, (step, row)
        if step == decode_steps:
            break
        chosen = logits.argmax(-1)
        for sequence, token in zip(sequences, chosen.tolist(), strict=True):
            sequence.append(token)
        positions = torch.tensor([len(s) - 1 for s in sequences])
        logits = model(chosen[:, None], positions, start, cache, rows)


def test_logits_match_transformers_for_prefill_and_each_cached_step(family, tokenizer):
    _, hf, checkpoint = family
    model = load_model(checkpoint)
    assert isinstance(model, Llama)
    check_logits(model, hf, len(tokenizer), [12, 7, 3, 20])


def test_decode_attends_long_rows_alone_and_matches_transformers(family, tokenizer):
    _, hf, checkpoint = family
    lengths = [3, 40, 5, 2, 30, 4]
    assert split_long_rows([n + 1 for n in lengths])[1]  # this batch does take rows out
    check_logits(load_model(checkpoint), hf, len(tokenizer), lengths, decode_steps=2)


def test_every_step_of_a_prompt_matches_transformers(family, tokenizer):
    _, hf, checkpoint = family
    model = load_model(checkpoint)
    ids = torch.randint(1, len(tokenizer), (1, 16))
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(1, 16)
    logits = model(ids, torch.tensor([0]), None, cache, slice(0, 1))
    with torch.no_grad():
        expected = hf(ids).logits
    assert (logits - expected).abs().max() < ATOL


@pytest.mark.parametrize(
    "overrides",
    [
        {"attention_bias": True, "mlp_bias": True},
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}},
        {"head_dim": 32},
        {"num_key_value_heads": 4},
        {"num_key_value_heads": 1, "tie_word_embeddings": True},
    ],
    ids=["biases", "linear-rope", "head-dim", "no-gqa", "one-kv-head-tied"],
)
def test_llama_variants_match_transformers(overrides, tokenizer, tmp_path):
    hf = random_model("llama", tokenizer.eos_token_id, len(tokenizer), **overrides)
    hf.save_pretrained(tmp_path)
    check_logits(load_model(tmp_path), hf, len(tokenizer), [9, 4], decode_steps=2)


def test_bfloat16_and_int8_load(family):
    _, _, checkpoint = family
    half = load_model(checkpoint, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16
    quantized = load_model(checkpoint, quantize="int8")
    cache = KVCache.empty(quantized.config, torch.float32)
    cache.reserve(1, 8)
    ids = torch.tensor([[5, 6, 7]])
    assert quantized(ids, torch.tensor([0]), torch.tensor([2]), cache, slice(0, 1)).isfinite().all()


# -- greedy generation: torch engine and OpenVINO backend ---------------------------------------


def test_torch_engine_greedy_matches_transformers_generate(family, tokenizer):
    """Within the window (the torch engine's context stops there; see engine/llama.py)."""
    _, hf, checkpoint = family
    engine = TorchEngine(load_model(checkpoint), max_batch_size=8).start()
    try:
        batch = prompts(6, 20, len(tokenizer))
        new = [3, 24, 9, 1, 17, 12]
        results = run_concurrently(
            engine, [GenerationRequest(p, n) for p, n in zip(batch, new, strict=True)]
        )
    finally:
        engine.stop()
    check_greedy(hf, batch, new, results)


@pytest.fixture(scope="module")
def openvino(family):
    """The family's OpenVINO export (made in .venv-export, as `make model` makes it), served."""
    from engine.openvino_backend import OpenVINOBackend

    _, _, checkpoint = family
    ensure_export(checkpoint)
    backend = OpenVINOBackend(require_export(checkpoint), ModelShape.read(checkpoint))
    yield backend.start()
    backend.stop()


def test_openvino_greedy_matches_transformers_generate(family, openvino, tokenizer):
    """Sequences up to 80 tokens: past qwen2's and starcoder2's window (WINDOW), which the
    export honours for them."""
    _, hf, _ = family
    batch = prompts(6, 40, len(tokenizer), seed=2)
    new = [40, 3, 25, 40, 1, 33]
    assert max(len(p) + n for p, n in zip(batch, new, strict=True)) > WINDOW
    results = run_concurrently(
        openvino, [GenerationRequest(p, n) for p, n in zip(batch, new, strict=True)]
    )
    for prompt, n, result in zip(batch, new, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, n)


# -- windows and refusals -----------------------------------------------------------------------


def test_a_sliding_window_limits_the_context_where_it_is_not_computed(tmp_path):
    """The torch engine stops every windowed model's context at its window; the OpenVINO
    backend mistral's only (its export did not match transformers past the window)."""
    base = {**TINY_CONFIG, "vocab_size": 300}
    for kind, extra, openvino_context in [
        ("mistral", {"sliding_window": 32}, 32),
        ("starcoder2", {"sliding_window": 32}, 256),
        ("qwen2", {"sliding_window": 32, "use_sliding_window": True}, 256),
        ("qwen2", {"sliding_window": 32, "use_sliding_window": False}, 256),
        ("mistral", {"sliding_window": None}, 256),
    ]:
        raw = {**base, "model_type": kind, **extra}
        (tmp_path / "config.json").write_text(json.dumps(raw))
        windowed = extra["sliding_window"] and extra.get("use_sliding_window", True)
        assert LlamaConfig.from_dict(raw).n_positions == (32 if windowed else 256), raw
        assert ModelShape.read(tmp_path).context == openvino_context, raw


def test_an_unsupported_model_type_is_refused_by_name_everywhere(tmp_path):
    source = tmp_path / "gpt2"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 300}))
    with pytest.raises(CheckpointImportError, match=r"'gpt2' model.*llama, qwen2, mistral"):
        import_checkpoint(str(source), tmp_path / "out")
    with pytest.raises(UnsupportedModelError, match=r"'gpt2' model.*gptj, llama, qwen2"):
        ModelShape.read(source)
    with pytest.raises(UnsupportedModelError, match="'gpt2' model"):
        load_model(source)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
            "rope type 'yarn' is not implemented",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"partial_rotary_factor": 0.5}, "partial rotary factor"),
    ],
    ids=["yarn", "old-style-dynamic", "activation", "partial-rotary"],
)
def test_what_the_torch_module_does_not_implement_is_refused_at_load(tmp_path, change, message):
    raw = {**TINY_CONFIG, "model_type": "llama", "vocab_size": 300}
    (tmp_path / "config.json").write_text(json.dumps({**raw, **change}))
    with pytest.raises(ValueError, match=message):
        read_config(tmp_path)


def test_pytorch_bin_weights_are_imported_as_safetensors(tokenizer, tmp_path):
    hf = random_model("mistral", tokenizer.eos_token_id, len(tokenizer))
    source = tmp_path / "source"
    hf.config.save_pretrained(source)
    tokenizer.save_pretrained(source)
    torch.save(hf.state_dict(), source / "pytorch_model.bin")
    checkpoint = import_checkpoint(str(source), tmp_path / "checkpoint")
    assert not list(checkpoint.glob("*.bin"))
    check_logits(load_model(checkpoint), hf, len(tokenizer), [6, 3], decode_steps=1)


def test_weights_that_do_not_match_the_config_are_refused(tokenizer, tmp_path):
    hf = random_model("llama", tokenizer.eos_token_id, len(tokenizer))
    source = save_source(hf, tokenizer, tmp_path / "source")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointImportError, match="3-layer model"):
        import_checkpoint(str(source), tmp_path / "checkpoint")
