"""Tiny random Llama-family checkpoints (llama, qwen2, mistral, starcoder2) with the project's
tokenizer, saved as transformers saves them: the sources `make model MODEL=<folder>` imports."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from conftest import TINY

from modelbuild.corpus import read_texts, split
from modelbuild.tokenizer import train_tokenizer

# 4 query heads share 2 key/value heads (grouped-query attention); a context of 256
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,  # larger than the default, so that logits are far from flat
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
WINDOW = 48  # qwen2's and starcoder2's sliding window: shorter than the OpenVINO tests' sequences
# what each family's checkpoint exercises besides GQA: Llama 3.1's rope scaling; Qwen2's q/k/v
# biases, tied embeddings, rope_theta 1e6 and a window on its second layer; Mistral plain;
# Starcoder2's LayerNorm, GELU MLP, biases, tied embeddings and window
FAMILIES: dict[str, tuple[type, type, dict]] = {
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {"rope_parameters": LLAMA3_ROPE},
    ),
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        {
            "tie_word_embeddings": True,
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        },
    ),
    "mistral": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        {"sliding_window": None},
    ),
    "starcoder2": (
        transformers.Starcoder2Config,
        transformers.Starcoder2ForCausalLM,
        {"sliding_window": WINDOW},
    ),
}


def project_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The tokenizer of the tests' tiny GPT-J (tests/conftest.py's TINY build), trained alone:
    the project's byte-level BPE at the same vocabulary size, on the same corpus."""
    train, _ = split()
    texts, chars = [], 0
    for text in read_texts(train):
        texts.append(text)
        chars += len(text)
        if chars >= TINY.tokenizer_chars:
            break
    return train_tokenizer(texts, TINY.vocab_size)


def random_model(family: str, eos: int, vocab: int, **overrides) -> torch.nn.Module:
    """A random ``family`` model (seed 0) at SHAPE, with the family's settings and overrides."""
    config_class, model_class, settings = FAMILIES[family]
    config = config_class(
        vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, **{**SHAPE, **settings, **overrides}
    )
    torch.manual_seed(0)
    return model_class(config).eval()


def save_source(model: torch.nn.Module, tokenizer, folder: Path) -> Path:
    """The model and tokenizer as transformers saves them, with a model card."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(f"# tiny random {model.config.model_type}\n")
    return folder
