"""Installing a Llama-family checkpoint (``llama``, ``qwen2``, ``mistral``, ``starcoder2``) or a
Gemma 3 one (``gemma3_text``).

Nothing is converted: the torch engine (engine/llama.py, engine/gemma3.py) and the OpenVINO
export both read transformers' own layout. config.json and generation_config.json are copied as
they are; safetensors weights are copied file by file (shards and their index too, so a large
model is never held in memory), and ``pytorch_model*.bin`` weights are rewritten as one
``model.safetensors``. Either way the weights are checked against the config's layer count.

Mistakes are ValueErrors, which modelbuild/importer.py reports as a CheckpointImportError
(this module does not import it: the importer imports this one).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
LAYER = re.compile(r"^model\.layers\.(\d+)\.")
EMBEDDING = "model.embed_tokens.weight"
ROTARY_BUFFER = "rotary_emb.inv_freq"  # saved by some older Llama checkpoints; not a weight


def install(
    src: Path,
    dest: Path,
    raw: Mapping,
    read_state: Callable[[Path], dict[str, torch.Tensor]],
) -> dict:
    """Write ``src``'s config, generation config and weights into ``dest``; return the config.
    ``read_state`` reads pytorch_model*.bin weights (the importer's reader)."""
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    config = dict(raw)
    if sorted(src.glob("*.safetensors")):
        keys = copy_safetensors(src, dest)
    else:
        keys = save_state(read_state(src), dest)
    check_weights(keys, int(config["num_hidden_layers"]))
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (src / "generation_config.json").is_file():
        shutil.copy2(src / "generation_config.json", dest / "generation_config.json")
    return config


def copy_safetensors(src: Path, dest: Path) -> set[str]:
    """Copy every *.safetensors file (and a shard index); the tensor names they hold."""
    keys: set[str] = set()
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            keys.update(weights.keys())
        shutil.copy2(file, dest / file.name)
    for index in src.glob("*.safetensors.index.json"):
        shutil.copy2(index, dest / index.name)
    return keys


def save_state(state: Mapping[str, torch.Tensor], dest: Path) -> set[str]:
    """Write ``state`` as one model.safetensors (less rotary buffers); the names written."""
    # safetensors refuses shared or strided storage: give every tensor its own contiguous copy
    kept = {
        name: tensor.detach().clone().contiguous()
        for name, tensor in sorted(state.items())
        if not name.endswith(ROTARY_BUFFER)
    }
    save_file(kept, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return set(kept)


def check_weights(keys: set[str], n_layer: int) -> None:
    """The weights must be transformers' layout with exactly the config's layers."""
    layers = {int(match.group(1)) for key in keys if (match := LAYER.match(key))}
    if EMBEDDING not in keys or layers != set(range(n_layer)):
        raise ValueError(
            f"the weights do not match a {n_layer}-layer model in transformers' layout "
            f"({EMBEDDING} {'present' if EMBEDDING in keys else 'missing'}; layers found: "
            f"{len(layers)})"
        )


def architecture(config: Mapping) -> str:
    """One line for the model card."""
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads")
    return (
        f"{config['model_type']}, {config['num_hidden_layers']} layers, "
        f"{config['hidden_size']} hidden, {heads} heads ({kv_heads or heads} key/value), "
        f"vocabulary {config['vocab_size']}, context {config['max_position_embeddings']}"
    )
