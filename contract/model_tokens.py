"""A checkpoint's own special tokens: its fill-in-the-middle sentinels, what its tokenizer puts
before a prompt (BOS), and the ids that end its generation.

Read from the checkpoint, never from GPT-2's numbering: preprocessing, postprocessing and the
API each meet another family's tokens (docs/models.md, "Tokens"). Duck-typed and pure (json
only), so every layer can use it.

The FIM layouts, by the sentinels a vocabulary holds (``contract.fim`` builds the prompts):

- StarCoder/SantaCoder (and the default model): ``<fim_prefix>P<fim_suffix>S<fim_middle>``,
  or SPM ``<fim_prefix><fim_suffix>S<fim_middle>P``; the middle ends with the end token.
- CodeLlama: ``<PRE> {P} <SUF>{S} <MID>`` (Meta's reference ``infilling_prompt_tokens`` and
  transformers' ``CodeLlamaTokenizer``): its vocabulary spells the sentinels ``▁<PRE>``,
  ``▁<SUF>``, ``▁<MID>``, ``▁<EOT>`` (the spaces around them in that string are their ``▁``),
  the prefix is encoded as a prompt is (SentencePiece's leading space: the one after
  ``<PRE>``), the suffix without that space; SPM (``suffix_first``) is
  ``<PRE> <SUF>{S} <MID> {P}``. The model ends a middle with ``<EOT>``.
- Qwen2.5-Coder: ``<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>`` (PSM only); the middle ends
  with ``<|endoftext|>``, the base model's end token; ``<|fim_pad|>`` is never shown.
- DeepSeek-Coder: ``<|fim begin|>P<|fim hole|>S<|fim end|>`` (PSM only; spelled with
  full-width bars and ``▁`` for the space: DEEPSEEK_TOKENS); the middle ends with the model's
  end token.
- CodeGen2: ``P<mask_1>S<|endoftext|><sep><mask_1>`` (Salesforce's model card); the model
  ends a middle with ``<eom>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STARCODER_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
CODELLAMA_TOKENS = ("<PRE>", "<SUF>", "<MID>", "<EOT>")
QWEN_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
QWEN_PAD, QWEN_END = "<|fim_pad|>", "<|endoftext|>"
DEEPSEEK_TOKENS = tuple(f"<\uff5cfim\u2581{part}\uff5c>" for part in ("begin", "hole", "end"))
CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_MASK = "<mask_1>", "<sep>", "<eom>"
CODEGEN2_END_OF_TEXT = "<|endoftext|>"
CODEGEN2_PROMPT = (CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_TEXT)
CODEGEN2_TOKENS = (CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_MASK, CODEGEN2_END_OF_TEXT)
SPIECE_SPACE = "▁"  # SentencePiece's space, which CodeLlama's sentinels start with


@dataclass(frozen=True)
class LayoutTokens:
    """One family's FIM tokens, by name (a layout's ``ids`` are keyed by these names)."""

    style: str
    label: str  # for messages and docs
    required: tuple[str, ...]  # all single tokens of the vocabulary, or not this layout
    optional: tuple[str, ...] = ()  # used when the vocabulary has them
    stop: str | None = None  # ends a middle (a stop word; dropped where it is the end token)
    shown: frozenset[str] = frozenset()  # tokens the tokenizer itself shows or skips
    orders: tuple[str, ...] = ("psm",)
    spaced: bool = False  # the vocabulary may spell each token with a leading ``▁``
    bare_suffix: bool = False  # the suffix is encoded without SentencePiece's leading space

    def spellings(self, name: str) -> tuple[str, ...]:
        return (name, SPIECE_SPACE + name) if self.spaced else (name,)


LAYOUTS = {
    tokens.style: tokens
    for tokens in (
        LayoutTokens("starcoder", "StarCoder-style", STARCODER_TOKENS, orders=("psm", "spm")),
        LayoutTokens(
            "codellama",
            "CodeLlama-style",
            CODELLAMA_TOKENS,
            stop="<EOT>",
            orders=("psm", "spm"),
            spaced=True,
            bare_suffix=True,
        ),
        LayoutTokens(
            "qwen",
            "Qwen2.5-Coder-style",
            QWEN_TOKENS,
            (QWEN_PAD, QWEN_END),
            stop=QWEN_END,
            shown=frozenset({QWEN_END}),
        ),
        LayoutTokens("deepseek", "DeepSeek-Coder-style", DEEPSEEK_TOKENS),
        LayoutTokens(
            "codegen2",
            "CodeGen2-style",
            CODEGEN2_TOKENS,
            stop=CODEGEN2_END_OF_MASK,
            shown=frozenset({CODEGEN2_END_OF_TEXT}),
        ),
    )
}  # detection tries them in this order


def prompt_head(tokenizer, checkpoint: str | Path | None = None) -> list[int]:
    """The ids a tokenizer's own rules put before a prompt's text: Llama's and Mistral's BOS,
    none for GPT-2's. Read from what ``encode`` adds around a probe text (tokenizer.json's
    post-processor template, whatever it holds); where that adds nothing and the checkpoint's
    tokenizer_config.json sets ``add_bos_token``, its BOS (transformers 5 ignores that flag once
    a tokenizer.json exists, where version 4's Llama tokenizers applied it). What a tokenizer
    adds after the text (``add_eos_token``) is not for a prompt that is to be continued."""
    bare = tokenizer.encode("x", add_special_tokens=False)
    full = tokenizer.encode("x", add_special_tokens=True)
    for start in range(1, len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start])
    bos = getattr(tokenizer, "bos_token_id", None)
    if (
        checkpoint is not None
        and isinstance(bos, int)
        and _config(checkpoint, "tokenizer_config.json").get("add_bos_token") is True
    ):
        return [bos]
    return []


def _config(checkpoint: str | Path, name: str) -> dict:
    """A JSON file of the checkpoint ({} when absent or unreadable)."""
    try:
        config = json.loads((Path(checkpoint) / name).read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _ids(value: object) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def end_ids(checkpoint: str | Path) -> list[int]:
    """Every id that ends the checkpoint's generation, the engine's end token first
    (config.json's ``eos_token_id``, its first entry when a list, else generation_config.json's:
    engine/openvino_model.py reads it so), then the other entries of both files' lists (Llama
    3's ``<|eot_id|>``, Qwen2's ``<|im_end|>``), where transformers' ``generate`` stops too.
    Empty for a folder without either file (a tokenizer alone)."""
    lists = [
        _ids(_config(checkpoint, name).get("eos_token_id"))
        for name in ("config.json", "generation_config.json")
    ]
    return list(dict.fromkeys(lists[0] + lists[1]))
