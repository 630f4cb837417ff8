"""Install a Hugging Face checkpoint where the model repository reads it.

Three source layouts are understood:

* GPT-J (``model_type: gptj``, the layout of ``moyix/codegen-350M-mono-gptj``): the weights are
  already named as ``GPTJForCausalLM`` expects; they are copied into one ``model.safetensors``.
* CodeGen (``model_type: codegen``, the layout of ``Salesforce/codegen-350M-mono``): the same
  network as GPT-J except that each layer keeps query, key and value in one ``qkv_proj`` matrix,
  cut for 4 model-parallel shards, each shard holding its own heads in the order q, v, k. The
  rows are unpacked into GPT-J's ``q_proj`` / ``k_proj`` / ``v_proj``.
* The Llama family (``model_type`` ``llama``, ``qwen2``, ``mistral`` or ``starcoder2``) and
  Gemma 3 (``gemma3_text``): installed unchanged (modelbuild/llama_import.py).

The source is a local folder (works offline) or a Hugging Face hub id (downloaded with
``huggingface_hub`` where the network allows; otherwise the import fails at once, telling the
user to pass a local folder). The result is written to a temporary sibling folder and renamed into
place, so a failed import never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors.torch import load_file, save_file

from engine.families import HF_LAYOUT, IMPORTED_TYPES
from modelbuild import llama_import
from modelbuild.checkpoint_files import (
    TOKENIZER_FILES,
    CheckpointImportError,
    install_tokenizer,
    write_model_card,
)

# the shard count CodeGen's qkv_proj was trained with (``mp_num`` in transformers' CodeGen)
CODEGEN_MP_NUM = 4

# configuration keys that mean the same in a CodeGen and a GPT-J config.json
SHARED_CONFIG_KEYS = (
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "rotary_dim",
    "n_inner",
    "activation_function",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "layer_norm_epsilon",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "README.md",
    "LICENSE*",
    *TOKENIZER_FILES,
]


# ----------------------------------------------------------------------------------------------
# reading a source checkpoint


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face folder: safetensors (single or sharded) or pytorch_model."""
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        for file in files:
            state.update(load_file(file))
        return state
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise CheckpointImportError(
            f"{folder} holds no *.safetensors or pytorch_model*.bin weights"
        )
    for file in bins:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointImportError(
            f"{folder} has no config.json: not a Hugging Face checkpoint folder"
        )
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------
# CodeGen -> GPT-J


def split_codegen_qkv(
    qkv: torch.Tensor, n_head: int, mp_num: int = CODEGEN_MP_NUM
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpack CodeGen's fused ``qkv_proj.weight`` [3*E, E] into GPT-J's q, k, v weights [E, E].

    CodeGen computes ``qkv = x @ W.T`` and views the 3*E outputs as [mp_num, 3, E/mp_num]:
    shard s holds its query block, then its value block, then its key block, each covering heads
    s*(H/mp_num) .. (s+1)*(H/mp_num)-1 in order. Concatenating one kind over the shards gives
    that projection's rows for heads 0..H-1, which is GPT-J's layout.
    """
    out_dim, in_dim = qkv.shape
    embed = out_dim // 3
    if out_dim != 3 * embed or embed % mp_num or n_head % mp_num:
        raise CheckpointImportError(
            f"qkv_proj of shape {tuple(qkv.shape)} cannot be split into {mp_num} shards "
            f"of {n_head} heads"
        )
    shards = qkv.reshape(mp_num, 3, embed // mp_num, in_dim)
    query, value, key = (shards[:, i].reshape(embed, in_dim) for i in range(3))
    return query.contiguous(), key.contiguous(), value.contiguous()


def merge_gptj_qkv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mp_num: int = CODEGEN_MP_NUM
) -> torch.Tensor:
    """The inverse of :func:`split_codegen_qkv` (used by the tests to round-trip)."""
    embed, in_dim = query.shape
    parts = [t.reshape(mp_num, embed // mp_num, in_dim) for t in (query, value, key)]
    return torch.stack(parts, dim=1).reshape(3 * embed, in_dim)


def gptj_config_from_codegen(raw: Mapping) -> dict:
    """A GPT-J config.json for a CodeGen one (same hyper-parameters, different model_type)."""
    config = {k: raw[k] for k in SHARED_CONFIG_KEYS if k in raw}
    config["n_positions"] = raw.get("n_positions", raw.get("n_ctx", 2048))
    config.update(
        architectures=["GPTJForCausalLM"],
        model_type="gptj",
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        use_cache=True,
    )
    if "torch_dtype" in raw or "dtype" in raw:
        config["torch_dtype"] = raw.get("torch_dtype", raw.get("dtype"))
    return config


def expected_gptj_keys(n_layer: int) -> set[str]:
    keys = {
        "transformer.wte.weight",
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        "lm_head.weight",
        "lm_head.bias",
    }
    per_layer = (
        "ln_1.weight",
        "ln_1.bias",
        "attn.q_proj.weight",
        "attn.k_proj.weight",
        "attn.v_proj.weight",
        "attn.out_proj.weight",
        "mlp.fc_in.weight",
        "mlp.fc_in.bias",
        "mlp.fc_out.weight",
        "mlp.fc_out.bias",
    )
    for layer in range(n_layer):
        keys.update(f"transformer.h.{layer}.{name}" for name in per_layer)
    return keys


def _finish_state(state: dict[str, torch.Tensor], config: Mapping) -> dict[str, torch.Tensor]:
    """Drop buffers, fill a tied/bias-less head, and check the key set is exactly GPT-J's."""
    state = {
        k: v
        for k, v in state.items()
        if not k.endswith((".attn.bias", ".attn.masked_bias", ".attn.causal_mask"))
    }
    if "lm_head.weight" not in state:  # tied embeddings
        state["lm_head.weight"] = state["transformer.wte.weight"]
    if "lm_head.bias" not in state:
        state["lm_head.bias"] = torch.zeros(
            state["lm_head.weight"].shape[0], dtype=state["lm_head.weight"].dtype
        )
    expected = expected_gptj_keys(int(config["n_layer"]))
    missing, extra = expected - state.keys(), state.keys() - expected
    if missing or extra:
        raise CheckpointImportError(
            f"checkpoint does not match GPT-J with {config['n_layer']} layers: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}"
        )
    # safetensors refuses shared or strided storage: give every tensor its own contiguous copy
    return {k: v.detach().clone().contiguous() for k, v in sorted(state.items())}


def convert_codegen_state(state: Mapping[str, torch.Tensor], config: Mapping) -> dict:
    """CodeGenForCausalLM weights -> GPTJForCausalLM weights."""
    n_head = int(config["n_head"])
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".attn.qkv_proj.weight"):
            prefix = name[: -len("qkv_proj.weight")]
            query, key, value = split_codegen_qkv(tensor, n_head)
            converted[prefix + "q_proj.weight"] = query
            converted[prefix + "k_proj.weight"] = key
            converted[prefix + "v_proj.weight"] = value
        else:
            converted[name] = tensor
    return converted


# ----------------------------------------------------------------------------------------------
# sources: folder or hub id


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub (or HTTPS proxy) opens within ``timeout`` seconds."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or _hub_endpoint())
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    # a thread bounds the DNS look-up too, which socket timeouts do not cover
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return bool(result and result[0])


def offline_message(source: str, reason: str) -> str:
    return (
        f"cannot download {source!r} from the Hugging Face hub ({reason}). "
        "Pass a local folder instead: make model MODEL=/path/to/checkpoint-folder "
        "(a folder with config.json, the weights and the tokenizer files)."
    )


def download_from_hub(repo_id: str, cache_dir: Path) -> Path:
    """Fetch a hub checkpoint, failing fast with a clear message when offline."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise CheckpointImportError(offline_message(repo_id, "HF_HUB_OFFLINE is set"))
    if not hub_reachable():
        raise CheckpointImportError(offline_message(repo_id, f"{_hub_endpoint()} is not reachable"))
    try:
        from huggingface_hub import snapshot_download
    except ModuleNotFoundError as err:  # pragma: no cover - it ships with transformers
        raise CheckpointImportError(
            offline_message(repo_id, "huggingface_hub is not installed")
        ) from err
    try:
        path = snapshot_download(
            repo_id, local_dir=cache_dir, allow_patterns=HUB_PATTERNS, etag_timeout=10
        )
    except Exception as err:  # network errors, unknown repo, gated repo...
        raise CheckpointImportError(
            offline_message(repo_id, f"{type(err).__name__}: {err}")
        ) from err
    return Path(path)


def resolve_source(source: str, scratch: Path) -> Path:
    """A local folder for ``source``: itself if it is a folder, else a hub download."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointImportError(f"{source} is a file; pass the checkpoint folder")
    looks_like_path = source.startswith((".", "/", "~")) or source.count("/") > 1
    if looks_like_path or not HUB_ID.match(source):
        raise CheckpointImportError(f"{source}: no such folder, and not a Hugging Face hub id")
    return download_from_hub(source, scratch / "hub")


# ----------------------------------------------------------------------------------------------
# the import


def convert_folder(src: Path, dest: Path, source_name: str) -> str:
    """Write a servable checkpoint for the HF folder ``src`` into the empty folder ``dest``."""
    raw = read_config(src)
    kind = raw.get("model_type")
    if kind not in IMPORTED_TYPES:
        raise CheckpointImportError(
            f"{source_name} is a {kind!r} model; only GPT-J, CodeGen, Llama-family and "
            f"Gemma 3 checkpoints can be served (model_type {', '.join(IMPORTED_TYPES)})"
        )
    if kind in HF_LAYOUT:
        try:
            config = llama_import.install(src, dest, raw, read_state_dict)
        except ValueError as err:
            raise CheckpointImportError(f"{source_name} ({kind}): {err}") from err
    else:
        config = _install_gptj(src, dest, raw)
    install_tokenizer(src, dest)
    write_model_card(src, dest, source_name, kind, config)
    return kind


def _install_gptj(src: Path, dest: Path, raw: dict) -> dict:
    """GPT-J weights as they are, CodeGen's converted to GPT-J; returns the config written."""
    state = read_state_dict(src)
    if raw["model_type"] == "gptj":
        config = dict(raw)
        config.setdefault("architectures", ["GPTJForCausalLM"])
    else:
        config = gptj_config_from_codegen(raw)
        state = convert_codegen_state(state, config)
    state = _finish_state(state, config)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def import_checkpoint(source: str, dest: Path, force: bool = False) -> Path:
    """Install ``source`` (folder or hub id) as a servable checkpoint folder at ``dest``.

    Refuses to replace a non-empty ``dest`` unless ``force``. Returns ``dest``.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()) and not force:
        raise CheckpointImportError(
            f"{dest} already holds a checkpoint; pass --force (make model ... FORCE=1) "
            "to replace it"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        scratch = Path(tmp)
        src = resolve_source(source, scratch)
        staged = scratch / "checkpoint"
        staged.mkdir()
        convert_folder(src, staged, source)
        if dest.exists():
            shutil.rmtree(dest)
        staged.rename(dest)
    return dest
