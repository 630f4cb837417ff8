"""SentencePiece's leading space, which CodeLlama's suffix goes without.

A SentencePiece-style tokenizer (Llama 2, CodeLlama, Mistral) puts a ``▁`` before a text's
first word, so ``"return"`` alone encodes as ``"▁return"``: what a prompt needs, and what
CodeLlama's FIM prefix gets, but its suffix is encoded without it (Meta's
``encode_infilling``; transformers' ``CodeLlamaTokenizer`` builds the same: ``<SUF>{suffix}``
with no space between). The tokenizers library adds it in the normalizer (a ``Prepend``: the
"legacy" conversion) or the ``Metaspace`` pre-tokenizer (``prepend_scheme``); a copy without
either encodes the suffix as the model saw it. Byte-level BPE (GPT-2, StarCoder, Qwen,
DeepSeek) adds no space, and needs no copy.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer

SPACE = "▁"


def _without(node: object) -> tuple[object, bool]:
    """(the normalizer or pre-tokenizer without its leading space, whether it had one)."""
    if not isinstance(node, dict):
        return node, False
    kind = node.get("type")
    if kind == "Prepend" and node.get("prepend") == SPACE:
        return None, True
    if kind == "Metaspace":
        adds = node.get("prepend_scheme", "always") != "never" or node.get("add_prefix_space")
        node = {**node, "prepend_scheme": "never"}
        if "add_prefix_space" in node:
            node["add_prefix_space"] = False
        return node, bool(adds)
    if kind == "Sequence":
        key = "normalizers" if "normalizers" in node else "pretokenizers"
        parts = [_without(part) for part in node.get(key, [])]
        kept = [part for part, _ in parts if part is not None]
        return {**node, key: kept}, any(had for _, had in parts)
    return node, False


def without_leading_space(backend: Tokenizer) -> Tokenizer | None:
    """A copy of ``backend`` that adds no leading ``▁``; None when it adds none anyway."""
    state = json.loads(backend.to_str())
    changed = False
    for key in ("normalizer", "pre_tokenizer"):
        state[key], had = _without(state.get(key))
        changed |= had
    return Tokenizer.from_str(json.dumps(state)) if changed else None
