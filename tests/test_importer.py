"""Checkpoint import: CodeGen -> GPT-J conversion, GPT-J copy, tokenizer, hub-id handling.

Everything runs offline on tiny randomly initialised models saved to a temporary folder.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from modelbuild import importer
from modelbuild.importer import (
    CheckpointImportError,
    import_checkpoint,
    merge_gptj_qkv,
    split_codegen_qkv,
)

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPT = "def hello_world():\n    "
CORPUS = [
    "def hello_world():\n    print('hello world')\n",
    "import os\nfor i in range(10):\n    pass\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
] * 10


def make_tokenizer():
    """A tiny byte-level BPE tokenizer (256 byte symbols + a few merges + end of text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def codegen(tmp_path_factory, tokenizer):
    """A random CodeGen model saved in the layout of Salesforce/codegen-350M-mono."""
    torch.manual_seed(0)
    config = transformers.CodeGenConfig(
        vocab_size=len(tokenizer),
        n_positions=128,
        n_ctx=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        initializer_range=0.1,  # larger than default so logits are far from uniform
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = transformers.CodeGenForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("codegen")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: bsd-3-clause\n---\n# tiny codegen\n")
    return model, folder


@pytest.fixture(scope="module")
def imported_codegen(codegen, tmp_path_factory):
    _, folder = codegen
    dest = tmp_path_factory.mktemp("installed") / "checkpoint"
    return import_checkpoint(str(folder), dest, force=False)


def prompt_ids(tokenizer) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(PROMPT)])


# ---------------------------------------------------------------------------------------------
# the qkv layout


def test_split_codegen_qkv_follows_the_shard_layout():
    n_head, head_dim, mp = 8, 2, 4
    embed = n_head * head_dim
    # row r of the fused matrix holds the value r in every column
    fused = torch.arange(3 * embed, dtype=torch.float32)[:, None].repeat(1, 5)
    query, key, value = split_codegen_qkv(fused, n_head, mp)
    local = embed // mp  # rows per shard and per kind
    for shard in range(mp):
        base = shard * 3 * local
        rows = slice(shard * local, (shard + 1) * local)
        # inside a shard CodeGen stores q, then v, then k
        assert torch.equal(query[rows, 0], torch.arange(base, base + local, dtype=torch.float32))
        assert torch.equal(
            value[rows, 0], torch.arange(base + local, base + 2 * local, dtype=torch.float32)
        )
        assert torch.equal(
            key[rows, 0], torch.arange(base + 2 * local, base + 3 * local, dtype=torch.float32)
        )
    assert torch.equal(merge_gptj_qkv(query, key, value, mp), fused)


def test_split_rejects_shapes_that_do_not_divide():
    with pytest.raises(CheckpointImportError):
        split_codegen_qkv(torch.zeros(3 * 6, 6), n_head=6)


# ---------------------------------------------------------------------------------------------
# CodeGen import: same logits, same greedy tokens


def test_codegen_import_writes_a_gptj_folder(imported_codegen):
    names = {p.name for p in imported_codegen.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "MODEL_CARD.md"} <= names
    config = json.loads((imported_codegen / "config.json").read_text())
    assert config["model_type"] == "gptj"
    assert config["architectures"] == ["GPTJForCausalLM"]
    assert (config["n_layer"], config["n_embd"], config["n_head"], config["rotary_dim"]) == (
        2,
        64,
        4,
        8,
    )
    assert config["n_positions"] == 128
    keys = load_file(imported_codegen / "model.safetensors").keys()
    assert keys == importer.expected_gptj_keys(2)
    card = (imported_codegen / "MODEL_CARD.md").read_text()
    assert "qkv_proj" in card and "bsd-3-clause" in card


def test_codegen_import_matches_logits_and_greedy_tokens(codegen, imported_codegen, tokenizer):
    original, _ = codegen
    converted = transformers.GPTJForCausalLM.from_pretrained(imported_codegen).eval()
    ids = prompt_ids(tokenizer)
    with torch.no_grad():
        expected = original(ids).logits
        got = converted(ids).logits
    assert expected.abs().max() > 0.1  # the model is not trivially flat
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    gen = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tokenizer.eos_token_id}
    assert torch.equal(converted.generate(ids, **gen), original.generate(ids, **gen))


def test_codegen_import_loads_in_our_engine(codegen, imported_codegen, tokenizer):
    from engine.gptj import GPTJ, KVCache

    original, _ = codegen
    engine = GPTJ.from_checkpoint(imported_codegen)
    ids = prompt_ids(tokenizer)
    cache = KVCache.empty(engine.config, torch.float32)
    cache.reserve(1, ids.shape[1])
    last = torch.tensor([ids.shape[1] - 1])
    logits = engine(ids, torch.tensor([0]), last, cache, slice(0, 1))
    with torch.no_grad():
        expected = original(ids).logits[:, -1]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_a_naive_qkv_split_would_be_caught(codegen, imported_codegen, tokenizer):
    """Negative control: chunking qkv_proj as plain q|k|v gives different logits."""
    original, _ = codegen
    state = load_file(imported_codegen / "model.safetensors")
    for layer in range(2):
        fused = original.transformer.h[layer].attn.qkv_proj.weight.detach()
        q, k, v = fused.chunk(3, dim=0)
        prefix = f"transformer.h.{layer}.attn."
        state |= {prefix + "q_proj.weight": q, prefix + "k_proj.weight": k}
        state[prefix + "v_proj.weight"] = v
    naive = transformers.GPTJForCausalLM.from_pretrained(imported_codegen).eval()
    naive.load_state_dict(state, strict=False)
    ids = prompt_ids(tokenizer)
    with torch.no_grad():
        diff = (naive(ids).logits - original(ids).logits).abs().max()
    assert diff > 1e-3


def test_imported_tokenizer_round_trips(imported_codegen, tokenizer):
    loaded = transformers.AutoTokenizer.from_pretrained(imported_codegen)
    assert loaded.encode(PROMPT) == tokenizer.encode(PROMPT)
    assert loaded.decode(loaded.encode(PROMPT)) == PROMPT
    assert loaded.eos_token == "<|endoftext|>"


# ---------------------------------------------------------------------------------------------
# GPT-J import (moyix/codegen-350M-mono-gptj layout, pytorch_model.bin weights)


@pytest.fixture(scope="module")
def gptj_folder(tmp_path_factory, tokenizer):
    torch.manual_seed(1)
    config = transformers.GPTJConfig(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        rotary_dim=4,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = transformers.GPTJForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("gptj")
    # the old pickle format, as older hub checkpoints ship it
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, folder


def test_gptj_import_copies_weights_unchanged(gptj_folder, tmp_path):
    model, folder = gptj_folder
    dest = import_checkpoint(str(folder), tmp_path / "ckpt", force=False)
    state = load_file(dest / "model.safetensors")
    expected = {k: v for k, v in model.state_dict().items() if k in importer.expected_gptj_keys(2)}
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    assert json.loads((dest / "config.json").read_text())["model_type"] == "gptj"
    assert (dest / "tokenizer.json").is_file()
    assert "unchanged" in (dest / "MODEL_CARD.md").read_text()


def test_existing_checkpoint_needs_force(gptj_folder, codegen, tmp_path):
    _, gptj = gptj_folder
    _, cg = codegen
    dest = import_checkpoint(str(gptj), tmp_path / "ckpt", force=False)
    with pytest.raises(CheckpointImportError, match="--force"):
        import_checkpoint(str(cg), dest, force=False)
    import_checkpoint(str(cg), dest, force=True)
    assert "qkv_proj" in (dest / "MODEL_CARD.md").read_text()
    leftovers = [p.name for p in dest.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the staging folder is gone


def test_tokenizer_json_is_built_from_vocab_and_merges(gptj_folder, tmp_path):
    _, folder = gptj_folder
    slow = tmp_path / "slow"
    shutil.copytree(folder, slow)
    (slow / "tokenizer.json").unlink()
    (slow / "tokenizer_config.json").unlink()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    vocab = tok.get_vocab()
    (slow / "vocab.json").write_text(json.dumps(vocab))
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (slow / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    dest = import_checkpoint(str(slow), tmp_path / "ckpt", force=False)
    built = transformers.AutoTokenizer.from_pretrained(dest)
    assert (dest / "tokenizer.json").is_file()
    assert built.encode(PROMPT) == tok.encode(PROMPT)


# ---------------------------------------------------------------------------------------------
# refusals and hub ids


def test_unsupported_architecture_is_refused(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    torch.save({}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointImportError, match="only GPT-J"):
        import_checkpoint(str(folder), tmp_path / "out", force=False)
    assert not (tmp_path / "out").exists()


def test_missing_folder_is_not_mistaken_for_a_hub_id(tmp_path):
    with pytest.raises(CheckpointImportError, match="no such folder"):
        import_checkpoint(str(tmp_path / "nope" / "model"), tmp_path / "out", force=False)


def test_hub_id_offline_fails_fast_with_a_local_folder_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(CheckpointImportError, match="Pass a local folder"):
        import_checkpoint("Salesforce/codegen-350M-mono", tmp_path / "out", force=False)
    # no network wait happened: an offline hub lookup would retry for minutes; this bound only
    # separates "at once" from that, with room for a loaded machine
    assert time.monotonic() - start < 30


def test_hub_id_unreachable_fails_fast(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(importer, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(CheckpointImportError, match=r"not reachable.*local folder"):
        import_checkpoint("moyix/codegen-350M-mono-gptj", tmp_path / "out", force=False)


def test_hub_id_downloads_through_huggingface_hub(codegen, tmp_path, monkeypatch):
    """Where the network allows, a hub id is fetched with snapshot_download and imported."""
    import huggingface_hub

    _, folder = codegen
    calls = []

    def fake_snapshot_download(repo_id, *, local_dir, allow_patterns, **kwargs):
        calls.append((repo_id, allow_patterns))
        shutil.copytree(folder, local_dir)
        return str(local_dir)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(importer, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    dest = import_checkpoint("Salesforce/codegen-350M-mono", tmp_path / "ckpt", force=False)
    assert calls and calls[0][0] == "Salesforce/codegen-350M-mono"
    assert "*.safetensors" in calls[0][1] and "tokenizer.json" in calls[0][1]
    assert json.loads((dest / "config.json").read_text())["model_type"] == "gptj"
    assert "Salesforce/codegen-350M-mono" in (dest / "MODEL_CARD.md").read_text()
