"""What every imported checkpoint gets besides its weights: its tokenizer files and a model
card (modelbuild/importer.py writes the weights); and the import's error.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from engine.families import HF_LAYOUT
from modelbuild import llama_import

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",  # sentencepiece (Llama, Mistral): tokenizer.json is built from it if absent
    # the chat template, where transformers saves it apart from tokenizer_config.json (the
    # API's /v1/chat/completions renders it)
    "chat_template.jinja",
    "chat_template.json",
)


class CheckpointImportError(RuntimeError):
    """The checkpoint could not be imported; the message says why and what to do."""


def install_tokenizer(src: Path, dest: Path) -> None:
    """Copy the tokenizer files; build tokenizer.json from vocab/merges when it is missing."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    if not copied:
        raise CheckpointImportError(
            f"{src} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); "
            "the preprocessing and postprocessing models need the checkpoint's tokenizer"
        )
    if not (dest / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(src, use_fast=True)
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            for name in TOKENIZER_FILES:
                if (Path(tmp) / name).is_file() and not (dest / name).is_file():
                    shutil.copy2(Path(tmp) / name, dest / name)
    if not (dest / "tokenizer.json").is_file():
        raise CheckpointImportError(f"could not build tokenizer.json from the tokenizer in {src}")


def write_model_card(src: Path, dest: Path, source: str, kind: str, config: Mapping) -> None:
    if kind in HF_LAYOUT:
        conversion = "none: config, generation config and safetensors weights copied as they are."
        shape = llama_import.architecture(config)
    else:
        conversion = (
            "CodeGen weights converted to GPT-J: each layer's fused `qkv_proj` (4 shards of "
            "q, v, k blocks) was unpacked into `q_proj`, `k_proj`, `v_proj`; everything else is "
            "unchanged."
            if kind == "codegen"
            else "GPT-J weights copied unchanged into model.safetensors."
        )
        shape = (
            f"GPT-J, {config['n_layer']} layers, {config['n_embd']} hidden, "
            f"{config['n_head']} heads, rotary_dim {config.get('rotary_dim')}, "
            f"vocabulary {config['vocab_size']}, context {config['n_positions']}"
        )
    lines = [
        "# Model card",
        "",
        f"- Source: `{source}` ({kind} checkpoint)",
        f"- Architecture: {shape}",
        f"- Conversion: {conversion}",
        "- Installed by `make model` (modelbuild/importer.py).",
        "",
    ]
    readme = src / "README.md"
    if readme.is_file():
        lines += ["## Original model card", "", readme.read_text(errors="replace")]
    else:
        lines += ["The source carried no model card; check its license before serving it.", ""]
    (dest / "MODEL_CARD.md").write_text("\n".join(lines))
    for lic in src.glob("LICENSE*"):
        shutil.copy2(lic, dest / lic.name)
