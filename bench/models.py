"""The checkpoints a run compares on: ``default``, the served model (``make model``) of any
family the engine serves, and ``350m``, a random ``GPTJForCausalLM`` with codegen-350M's shapes
(speed does not depend on the weights' values: no download), built once in a git-ignored folder.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from contract.model_tokens import end_ids
from engine import read_config
from serving.paths import BUILD_DIR, DEFAULT_CHECKPOINT

CACHE = BUILD_DIR / "bench"
RANDOM_350M = CACHE / "gptj-350m-random"  # the 350M shape's random checkpoint, built once
END_OF_TEXT = "<|endoftext|>"

# codegen-350M-mono's architecture (its GPT-J conversion): 356M parameters.
SHAPE_350M = {
    "vocab_size": 51200,
    "n_positions": 2048,
    "n_embd": 1024,
    "n_layer": 20,
    "n_head": 16,
    "rotary_dim": 32,
}
EOS_350M = 50256  # where CodeGen's tokenizer has <|endoftext|>

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelInfo:
    """A checkpoint folder and what a table says about it."""

    key: str  # "default" or "350m": which KernelPlan applies
    name: str
    path: Path
    description: str
    parameters: int
    eos_token_id: int  # the engine's end token (the first of end_ids)
    vocab_size: int
    n_positions: int  # the context the engine serves
    family: str = "gptj"  # config.json's model_type
    end_ids: tuple[int, ...] = ()  # every id that ends generation (contract/model_tokens.py)

    @property
    def banned(self) -> tuple[int, ...]:
        """The ids kept out so that every request makes every token asked for: all end ids."""
        return self.end_ids or (self.eos_token_id,)

    def end_words(self) -> tuple[str, ...]:
        """The end tokens as text, for the server's ``bad_words`` (SmolLM2's ``<|im_end|>``)."""
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(self.path))
        return tuple(tokenizer.convert_ids_to_tokens(list(self.banned)))


# safetensors entries that are buffers, not parameters (GPT-J's masks, old Llama rotary tables)
_BUFFERS = (".attn.bias", ".masked_bias", "rotary_emb.inv_freq")


def describe_checkpoint(key: str, name: str, path: Path) -> ModelInfo:
    """Read a checkpoint's architecture (engine/models.py, any served family) and count its
    parameters from the safetensors headers."""
    config = read_config(path)
    family = json.loads((path / "config.json").read_text()).get("model_type", "gptj")
    parameters = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "np") as tensors:  # reads the header only
            names = [name for name in tensors.keys() if not name.endswith(_BUFFERS)]  # noqa: SIM118
            parameters += sum(math.prod(tensors.get_slice(name).get_shape()) for name in names)
    kv = f" ({config.n_kv_head} key/value)" if config.n_kv_head != config.n_head else ""
    heads = f"{config.n_head} heads{kv}"
    description = (
        f"{family}, {config.n_layer} layers x {config.n_embd}, {heads}, vocab "
        f"{config.vocab_size}, context {config.n_positions}, {parameters / 1e6:.1f}M parameters"
    )
    ends = tuple(end_ids(path))
    eos = ends[0] if ends else config.eos_token_id
    return ModelInfo(
        key,
        name,
        path,
        description,
        parameters,
        int(eos or 0),
        int(config.vocab_size),
        int(config.n_positions),
        family,
        ends,
    )


def word_level_tokenizer(vocab_size: int, eos_id: int):
    """A tokenizer with one made-up token per id: a random model needs a vocabulary of the
    right size, not a real one."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    del vocab[f"t{eos_id}"]
    vocab[END_OF_TEXT] = eos_id
    backend = Tokenizer(WordLevel(vocab, unk_token=END_OF_TEXT))
    backend.pre_tokenizer = WhitespaceSplit()
    ends = dict.fromkeys(("bos_token", "eos_token", "unk_token"), END_OF_TEXT)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **ends)


def build_random_gptj(
    folder: Path,
    shape: dict[str, int] = SHAPE_350M,
    eos_id: int = EOS_350M,
    progress: Progress = print,
    seed: int = 0,
) -> Path:
    """Write (once) a randomly initialised GPT-J of ``shape`` with a word-level tokenizer of
    its vocabulary size into ``folder``; the 350M-shaped model by default."""
    if (folder / "config.json").is_file() and list(folder.glob("*.safetensors")):
        return folder
    from transformers import GPTJConfig, GPTJForCausalLM

    started = time.perf_counter()
    progress(f"building a random GPT-J {shape} in {folder} (once) ...")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    torch.manual_seed(seed)
    config = GPTJConfig(**shape, bos_token_id=eos_id, eos_token_id=eos_id)
    GPTJForCausalLM(config).eval().save_pretrained(partial)
    word_level_tokenizer(shape["vocab_size"], eos_id).save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    progress(f"built in {time.perf_counter() - started:.0f}s")
    return folder


def resolve_models(
    names: tuple[str, ...], default: Path = DEFAULT_CHECKPOINT, progress: Progress = print
) -> list[ModelInfo]:
    """The checkpoints of ``names``, building the 350M-shaped one when it is missing."""
    if "default" in names and not (default / "config.json").is_file():
        raise FileNotFoundError(f"no model at {default}: run `make model` first (about 5 minutes)")
    return [
        describe_checkpoint("default", "default", default)
        if name == "default"
        else describe_checkpoint(
            "350m", "350m-random", build_random_gptj(RANDOM_350M, progress=progress)
        )
        for name in names
    ]


def random_prompts(
    count: int, length: int, vocab_size: int, eos_id: int | Collection[int], seed: int
) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` random token ids (never an end token: one id, or
    every end id of a model with several): equal lengths keep padding out of the static-batch
    comparison."""
    ends = sorted({eos_id} if isinstance(eos_id, int) else set(eos_id))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size - len(ends), (count, length), generator=generator)
    for end in ends:  # ascending: each shift moves past one end id, as one id more is skipped
        ids[ids >= end] += 1
    return ids.tolist()
