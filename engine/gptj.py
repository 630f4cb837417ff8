"""GPT-J in plain PyTorch, with a batched key/value cache built for continuous batching.

The weights and their names are those of transformers' ``GPTJForCausalLM``, so any Hugging Face
GPT-J checkpoint (``codegen-350M-mono-gptj`` included) loads unchanged. What differs from the
transformers implementation is the cache: one tensor per layer holding every running sequence in
a *row*, each at its own length. A decode step for all rows is one forward pass, and rows can
join (prefill) or leave (finish) between steps without touching the others.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F  # noqa: N812


@dataclass(frozen=True)
class GPTJConfig:
    """The architecture, named as in a Hugging Face GPT-J ``config.json``."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    rotary_dim: int | None = None
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def inner_dim(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @classmethod
    def from_dict(cls, raw: dict) -> GPTJConfig:
        if raw.get("model_type", "gptj") != "gptj":
            raise ValueError(
                f"checkpoint is a {raw.get('model_type')!r} model, not GPT-J; "
                "import it with `make model MODEL=<folder>` to convert it"
            )
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> GPTJConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))


def rotary_table(config: GPTJConfig) -> torch.Tensor:
    """sin and cos of every position, [n_positions, rotary_dim] (sin half then cos half)."""
    dim = config.rotary_dim or config.head_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    angles = torch.arange(config.n_positions, dtype=torch.int64).float()[:, None] * inv_freq
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)


def apply_rotary(x: torch.Tensor, sincos: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [B, T, H, R] by the angles in sincos [B, T, R]."""
    sin, cos = sincos.to(x.dtype).chunk(2, dim=-1)
    sin = sin.repeat_interleave(2, dim=-1)[:, :, None, :]
    cos = cos.repeat_interleave(2, dim=-1)[:, :, None, :]
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@dataclass
class KVCache:
    """Keys and values of every running sequence: [n_layer, rows, n_head, capacity, head_dim].

    Grows on demand (rows and length) so memory follows what is actually running.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def empty(
        cls, config: GPTJConfig, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> KVCache:
        shape = (config.n_layer, 0, config.n_head, 0, config.head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def reserve(self, rows: int, length: int) -> None:
        """Make room for at least ``rows`` sequences of ``length`` positions."""
        if rows <= self.rows and length <= self.capacity:
            return
        new_rows = max(rows, self.rows)
        new_len = max(length, self.capacity)
        new_len = 1 << max(6, math.ceil(math.log2(new_len)))  # powers of two: few reallocations
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_zeros((old.shape[0], new_rows, old.shape[2], new_len, old.shape[4]))
            grown[:, : old.shape[1], :, : old.shape[3]] = old
            setattr(self, name, grown)

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src`` into row ``dst`` (used to keep running rows contiguous)."""
        self.keys[:, dst, :, :length] = self.keys[:, src, :, :length]
        self.values[:, dst, :, :length] = self.values[:, src, :, :length]


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The GPTJForCausalLM weights of a checkpoint folder (all *.safetensors shards), with
    tied embeddings untied and transformers' non-weight buffers left out."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}; run `make model`")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".masked_bias"))}
    if "lm_head.weight" not in state:  # tied embeddings
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


class Attention(nn.Module):
    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.config = config
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.k_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.out_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, sincos, layer_keys, layer_values, row_index, positions, allowed):
        """x [B, T, C] at ``positions`` [B, T]; keys/values are written into the cache rows."""
        cfg = self.config
        batch, steps, _ = x.shape
        shape = (batch, steps, cfg.n_head, cfg.head_dim)
        q, k, v = (proj(x).view(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
        rot = cfg.rotary_dim or cfg.head_dim
        q = torch.cat((apply_rotary(q[..., :rot], sincos), q[..., rot:]), dim=-1)
        k = torch.cat((apply_rotary(k[..., :rot], sincos), k[..., rot:]), dim=-1)
        # cache[row, head, position] = this step's key/value, for every (row, step) at once
        layer_keys[row_index, :, positions] = k
        layer_values[row_index, :, positions] = v
        key_len = allowed.shape[-1]
        keys = layer_keys[:, :, :key_len]
        values = layer_values[:, :, :key_len]
        # attention in float32, as transformers' GPT-J does
        scores = q.transpose(1, 2).float() @ keys.float().transpose(-1, -2)
        scores = scores / math.sqrt(cfg.head_dim)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        weights = F.softmax(scores, dim=-1).to(values.dtype)
        out = (weights @ values).transpose(1, 2).reshape(batch, steps, cfg.n_embd)
        return self.out_proj(out)


class MLP(nn.Module):
    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        if config.activation_function not in ("gelu_new", "gelu"):
            raise ValueError(f"unsupported activation {config.activation_function!r}")
        self.approximate = "tanh" if config.activation_function == "gelu_new" else "none"
        self.fc_in = nn.Linear(config.n_embd, config.inner_dim)
        self.fc_out = nn.Linear(config.inner_dim, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate=self.approximate))


class Block(nn.Module):
    """GPT-J's parallel block: attention and MLP both read the same normalised input."""

    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, x, sincos, layer_keys, layer_values, row_index, positions, allowed):
        h = self.ln_1(x)
        attn = self.attn(h, sincos, layer_keys, layer_values, row_index, positions, allowed)
        return x + attn + self.mlp(h)


class Transformer(nn.Module):
    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPTJ(nn.Module):
    """GPT-J for causal LM; state-dict keys match ``GPTJForCausalLM``."""

    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)
        self.register_buffer("sincos", rotary_table(config), persistent=False)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> GPTJ:
        """Load a Hugging Face GPT-J folder (config.json + *.safetensors) onto ``device``."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no checkpoint at {path}: run `make model` first")
        config = GPTJConfig.from_checkpoint(path)
        state = load_state_dict(path)
        if "lm_head.bias" not in state:
            state["lm_head.bias"] = torch.zeros(
                config.vocab_size, dtype=state["lm_head.weight"].dtype
            )
        model = cls(config)
        model.load_state_dict(state, strict=True)
        model = model.to(dtype)
        model.sincos = model.sincos.float()  # angles stay float32 whatever the weights' dtype
        return model.to(device).eval()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        last: torch.Tensor,
        cache: KVCache,
        rows: slice,
    ) -> torch.Tensor:
        """Run ``tokens`` [B, T] for cache ``rows``, the first token of each at ``start`` [B].

        Returns float32 logits [B, vocab] at step ``last`` [B] of each row, on the CPU, where
        the per-row sampling runs. Prefill passes a
        right-padded prompt batch with start 0; a decode step passes one token per row at its
        current length. Padding beyond a row's real tokens is written to the cache but never
        attended to: a later step overwrites it before any query can see it.
        """
        batch, steps = tokens.shape
        device = tokens.device
        positions = start[:, None] + torch.arange(steps, device=device)
        key_len = int(positions.max()) + 1
        allowed = torch.arange(key_len, device=device)[None, None, :] <= positions[:, :, None]
        sincos = self.sincos[positions]
        row_index = torch.arange(batch, device=device)[:, None]
        x = self.transformer.wte(tokens)
        for layer, block in enumerate(self.transformer.h):
            x = block(
                x,
                sincos,
                cache.keys[layer, rows],
                cache.values[layer, rows],
                row_index,
                positions,
                allowed,
            )
        x = x[torch.arange(batch, device=device), last]
        return self.lm_head(self.transformer.ln_f(x)).float().cpu()
