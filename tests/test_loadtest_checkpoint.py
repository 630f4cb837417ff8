"""The load test's description of the served checkpoint, whatever its family: a GPT-J that
``make model`` trained (build.json) or a pretrained Llama-family model (SmolLM2: config.json,
pretrained.json and the safetensors headers only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from loadtest.results import MachineInfo, ModelInfo, checkpoint_info
from loadtest.targets import served_lines
from serving.paths import checkpoint_dir

MACHINE = MachineInfo("a CPU", 2, 7.7, "none", "Linux", "3.12", "2.13.0", "2.47", "2.73")


def _repository(tmp_path: Path, files: dict[str, dict]) -> Path:
    folder = checkpoint_dir(tmp_path / "model_repository")
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return tmp_path / "model_repository"


def test_a_pretrained_llama_is_described_from_its_config(tmp_path):
    config = {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
    }
    repo = _repository(tmp_path, {"config.json": config, "pretrained.json": {"name": "smollm2"}})
    weights = {"model.embed_tokens.weight": torch.zeros(10, 4), "model.norm.weight": torch.ones(4)}
    save_file(weights, checkpoint_dir(repo) / "model.safetensors")
    info = checkpoint_info(repo)
    assert info is not None
    assert (info["name"], info["family"], info["parameters"]) == ("smollm2", "llama", 44)
    figures = ("layers", "width", "heads", "context", "vocab")
    assert [info[k] for k in figures] == [30, 576, 9, 8192, 49152]
    line = served_lines(MACHINE, ModelInfo(checkpoint=info))[-1]
    assert line.startswith("- Model: `smollm2` Llama, 30 layers x 576 wide, 9 heads")
    assert "held-out loss" not in line  # a pretrained model has none


def test_a_trained_gptj_keeps_its_build_figures(tmp_path):
    build = {
        "name": "tiny-test-gptj",
        "parameters": 5_250_000,
        "held_out_loss": 1.5,
        "build": {
            "n_layer": 4,
            "n_embd": 256,
            "n_head": 8,
            "n_positions": 1024,
            "vocab_size": 4096,
        },
    }
    repo = _repository(tmp_path, {"build.json": build, "config.json": {"model_type": "gptj"}})
    info = checkpoint_info(repo)
    assert info is not None and info["family"] == "gptj" and info["parameters"] == 5_250_000
    line = served_lines(MACHINE, ModelInfo(checkpoint=info))[-1]
    assert line.startswith("- Model: `tiny-test-gptj` GPT-J, 4 layers x 256 wide, 8 heads")
    assert line.endswith("(held-out loss 1.5)")


def test_no_checkpoint_is_no_description(tmp_path):
    assert checkpoint_info(tmp_path / "model_repository") is None
