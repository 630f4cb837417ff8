"""A GGUF becomes a plain float32 Hugging Face checkpoint, with a model card.

transformers loads the GGUF dequantized to float32, and since ``save_pretrained`` refuses a
GGUF-loaded model, its state dict goes into a plain ``*ForCausalLM`` of the same config. The
special ids (BOS, end, padding) come from the GGUF's tokenizer metadata, never from a family's
usual numbering; Gemma 3 also ends at ``<end_of_turn>`` (its upstream generation config lists
both), so generation_config.json carries both end ids.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.fim import CODEGEN2_TOKENS, STARCODER_TOKENS
from contract.model_tokens import CODELLAMA_TOKENS, DEEPSEEK_TOKENS, QWEN_TOKENS
from modelbuild.wheels import PretrainedError

# transformers' special-token ids, and the GGUF tokenizer metadata keys they come from
SPECIAL_IDS = {
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "padding_token_id",
}
# GGUF general.architecture -> the transformers class it is saved as
ARCHITECTURES = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# further end tokens a family's generation stops at, where the vocabulary has them
EXTRA_END_TOKENS = {"gemma3": ("<end_of_turn>",)}
FIM_TOKENS = (*STARCODER_TOKENS, *CODEGEN2_TOKENS[:3], *CODELLAMA_TOKENS[:3])
FIM_TOKENS += (*QWEN_TOKENS, *DEEPSEEK_TOKENS)


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF facts the conversion needs: architecture, special token ids and their text.
    Read with transformers' own metadata reader, which leaves the arrays it is not asked for
    unread: the gguf package's reader parses all of them (Gemma's 262k tokens, scores and
    types) and took a minute on a busy 2-core machine."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    fields, _ = read_gguf_metadata(str(path), ("tokenizer.ggml.tokens",))
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or fields.get("tokenizer.ggml.eos_token_id") is None:
        raise PretrainedError(f"{path} holds no tokenizer with an end token (tokenizer.ggml.*)")
    ids = {name: fields.get(f"tokenizer.ggml.{key}") for name, key in SPECIAL_IDS.items()}
    meta = {
        "architecture": fields.get("general.architecture"),
        "ids": {name: int(found) for name, found in ids.items() if found is not None},
        "vocab": [str(token) for token in tokens],
    }
    meta["eos_token_id"] = meta["ids"]["eos_token_id"]
    meta["eos_token"] = meta["vocab"][meta["eos_token_id"]]
    index = {token: i for i, token in enumerate(meta["vocab"])}
    extra = [index[t] for t in EXTRA_END_TOKENS.get(meta["architecture"], ()) if t in index]
    meta["end_ids"] = list(dict.fromkeys([meta["eos_token_id"], *extra]))
    return meta


@dataclass
class Converted:
    """A plain (saveable) model, its tokenizer, and the GGUF facts it was made from."""

    model: Any  # LlamaForCausalLM or Gemma3ForCausalLM
    tokenizer: Any
    meta: dict[str, Any]


def convert(gguf: Path) -> Converted:
    """Load the GGUF with transformers (float32) and move its weights into a plain model."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.initialization import no_init_weights
    from transformers.utils import logging

    logging.disable_progress_bar()  # the step lines say where it is
    meta = gguf_metadata(gguf)
    if meta["architecture"] not in ARCHITECTURES:
        raise PretrainedError(
            f"{gguf} is a {meta['architecture']!r} GGUF; only {', '.join(ARCHITECTURES)} "
            "are handled"
        )
    plain_class = getattr(transformers, ARCHITECTURES[meta["architecture"]])
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if not isinstance(loaded, plain_class):
        raise PretrainedError(
            f"transformers loaded {gguf} as {type(loaded).__name__}, not {plain_class.__name__}"
        )
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32
    for key, token_id in meta["ids"].items():
        setattr(config, key, token_id)
    with no_init_weights():  # every weight is loaded below: random init would cost ~15 s
        plain = plain_class(config)
    try:
        plain.load_state_dict(loaded.state_dict(), strict=True)
        plain.tie_weights()  # tied outputs are one tensor again (no_init_weights left two)
    except RuntimeError as err:
        raise PretrainedError(
            f"the GGUF's weights do not fit {plain_class.__name__}: {err}"
        ) from err
    plain.eval()
    ends = meta["end_ids"]
    plain.generation_config = GenerationConfig(
        **{**meta["ids"], "eos_token_id": ends if len(ends) > 1 else ends[0]}
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.eos_token_id != meta["eos_token_id"]:
        tokenizer.eos_token = meta["eos_token"]
    return Converted(plain, tokenizer, meta)


def architecture(config: Any) -> str:
    """One line of the model card: the class, its shape and, for Gemma 3, its attention."""
    line = (
        f"{config.architectures[0] if config.architectures else config.model_type}, "
        f"{config.num_hidden_layers} layers, {config.hidden_size} hidden, "
        f"{config.num_attention_heads} heads ({config.num_key_value_heads} key/value heads), "
        f"vocabulary {config.vocab_size}, context {config.max_position_embeddings}"
    )
    if getattr(config, "layer_types", None):
        full = config.layer_types.count("full_attention")
        line += (
            f"; {len(config.layer_types) - full} sliding-window layers (window "
            f"{config.sliding_window}) and {full} global ones"
        )
    return line


def model_card(
    model: Any, converted: Converted, size: int, wheels: list[str], notices: list[str]
) -> str:
    """What the checkpoint is, where it came from (``wheels``: one line each), its licence and
    the terms beside it (``notices``), and what it is good and bad at. ``model`` is the
    installer's table entry (modelbuild/pretrained.py's ``PretrainedModel``)."""
    config = converted.model.config
    params = sum(p.numel() for p in converted.model.parameters())
    vocab = set(converted.meta["vocab"])
    fim = [t for t in FIM_TOKENS if t in vocab]
    tied = "; the output layer is the token embedding" if config.tie_word_embeddings else ""
    vocab_list = converted.meta["vocab"]
    ends = ", ".join(f"`{vocab_list[i]}` (id {i})" for i in converted.meta["end_ids"])
    bos = converted.meta["ids"].get("bos_token_id")
    lines = [
        f"# {Path(model.gguf).stem} (from PyPI `{model.spec}`)",
        "",
        "- Source (PyPI, each wheel pinned by its sha256):",
        *[f"  - {line}" for line in wheels],
        f"- GGUF: `{model.gguf}` (sha256 `{model.gguf_sha256}`)",
        f"- Upstream model: `{model.upstream}`",
        f"- Licence: {model.license}",
        *[f"- {line}" for line in notices],
        f"- Weights: {model.quantization} in the GGUF, dequantized to float32 here: the values "
        "are the quantized ones, not the upstream bf16 weights",
        f"- Parameters: {params:,} ({params / 1e6:.1f}M){tied}",
        f"- Size on disk: {size / 1e6:.0f} MB (float32 safetensors, tokenizer, configs)",
        f"- Architecture: {architecture(config)}",
        f"- Start token: {'none' if bos is None else f'`{vocab_list[bos]}` (id {bos})'}",
        f"- End tokens: {ends} (from the GGUF's tokenizer metadata)",
        f"- Fill-in-the-middle tokens: {', '.join(fim) if fim else 'none'}",
        f"- Installed by `make model MODEL={model.name}` (modelbuild/pretrained.py)",
        "",
        "## What it can do",
        "",
        *[f"- {line}" for line in model.can],
        "",
        "## What it cannot do",
        "",
        *[f"- {line}" for line in model.cannot],
        "",
    ]
    return "\n".join(lines)
