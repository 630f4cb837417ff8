"""GPT-J in plain PyTorch, on the batched key/value cache of engine/cache.py (continuous batching).

The weights and their names are those of transformers' ``GPTJForCausalLM``, so any Hugging Face
GPT-J checkpoint (``codegen-350M-mono-gptj`` included) loads unchanged. What differs from the
transformers implementation is the cache: one tensor per layer holding every running sequence in
a *row*, each at its own length. A decode step for all rows is one forward pass, and rows can
join (prefill) or leave (finish) between steps without touching the others. A pass may hold
several segments (the decode rows and the prompts joining them): the linear layers run once over
all their tokens, flattened, and each segment attends on its own rows.

Per step the model does only what it needs: one fused q|k|v matmul per layer, rotary tables
precomputed per position, in-place cache writes, and torch's scaled_dot_product_attention over
the span the batch needs; a decode step attends the few much longer rows on their own, so a
long request does not make every short one pay for its length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from engine.cache import (
    KVCache,
    Segment,
    StepPlan,
    plan_segment,
    split_long_rows,
    wanted_tokens,
)
from engine.weights import FromCheckpoint, check_quantize, placed, read_safetensors

__all__ = ["GPTJ", "GPTJConfig", "KVCache", "Segment", "StepPlan", "split_long_rows"]


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
    def n_kv_head(self) -> int:
        """Key/value heads, what the cache holds: all of them (the Llama family has fewer)."""
        return self.n_head

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


def rotary_tables(config: GPTJConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of every position, [n_positions, rotary_dim], already interleaved.

    GPT-J rotates pairs (x[2i], x[2i+1]); with each angle repeated for both members of its pair
    and the sign of the first member folded into sin, a rotation is ``x*cos + swap(x)*sin``.
    """
    dim = config.rotary_dim or config.head_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    angles = torch.arange(config.n_positions, dtype=torch.int64).float()[:, None] * inv_freq
    sign = torch.tensor([-1.0, 1.0]).repeat(dim // 2)
    cos = torch.cos(angles).repeat_interleave(2, dim=-1)
    sin = torch.sin(angles).repeat_interleave(2, dim=-1) * sign
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate the interleaved pairs of x [..., R] in place; cos/sin broadcast to x."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    x.copy_(torch.addcmul(x * cos, swapped, sin))


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The GPTJForCausalLM weights of a checkpoint folder (all *.safetensors shards), with
    tied embeddings untied and transformers' non-weight buffers left out."""
    state = read_safetensors(path, leave_out=(".attn.bias", ".masked_bias"))
    if "lm_head.weight" not in state:  # tied embeddings
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


class Attention(nn.Module):
    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv_proj = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # q|k|v fused
        self.out_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        """x [N, C]: the tokens of every segment, one after another. Each segment's keys and
        values are written into its cache rows and it attends only to those rows."""
        qkv = self.qkv_proj(x)  # one matmul for every token of the pass
        outs, offset = [], 0
        for plan in plans:
            outs.append(
                self._attend(qkv[offset : offset + plan.tokens], cache_keys, cache_values, plan)
            )
            offset += plan.tokens
        return self.out_proj(outs[0] if len(outs) == 1 else torch.cat(outs))

    def _attend(self, qkv, cache_keys, cache_values, plan: StepPlan) -> torch.Tensor:
        cfg = self.config
        batch, steps = plan.positions.shape
        qkv = qkv.view(batch, steps, 3, cfg.n_head, cfg.head_dim)
        rot = cfg.rotary_dim or cfg.head_dim
        apply_rotary(qkv[:, :, :2, :, :rot], plan.cos, plan.sin)  # q and k at once
        q, k, v = qkv.unbind(2)
        layer_keys, layer_values = cache_keys[plan.rows], cache_values[plan.rows]
        # cache[row, head, position] = this step's key/value, for every (row, step) at once
        layer_keys[plan.row_index, :, plan.positions] = k
        layer_values[plan.row_index, :, plan.positions] = v
        q = q.transpose(1, 2)
        keys = layer_keys[:, :, : plan.key_len]
        values = layer_values[:, :, : plan.key_len]
        if plan.mask is None:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=plan.mask)
        for row, length in plan.long_rows:
            out[row : row + 1] = F.scaled_dot_product_attention(
                q[row : row + 1],
                layer_keys[row : row + 1, :, :length],
                layer_values[row : row + 1, :, :length],
            )
        return out.transpose(1, 2).reshape(batch * steps, cfg.n_embd)


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

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        h = self.ln_1(x)
        out = self.mlp(h)
        out += self.attn(h, cache_keys, cache_values, plans)
        return out.add_(x)


class Transformer(nn.Module):
    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPTJ(FromCheckpoint, nn.Module):
    """GPT-J for causal LM, loaded from ``GPTJForCausalLM`` weights (q/k/v fused on load)."""

    config_class = GPTJConfig
    read_state = staticmethod(load_state_dict)

    def __init__(self, config: GPTJConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)
        cos, sin = rotary_tables(config)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @classmethod
    def from_state_dict(
        cls,
        config: GPTJConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        quantize: str | None = None,
    ) -> GPTJ:
        """Build from ``GPTJForCausalLM`` weights (see :meth:`from_checkpoint`)."""
        check_quantize(quantize, dtype, device)
        state = fuse_qkv(dict(state), config.n_layer)
        if "lm_head.bias" not in state:
            state["lm_head.bias"] = torch.zeros(
                config.vocab_size, dtype=state["lm_head.weight"].dtype
            )
        return placed(cls(config), state, dtype, device, quantize)

    def plan(self, start: torch.Tensor, steps: int, rows: slice = slice(None)) -> StepPlan:
        """Positions, masks, rotary tables and the long-row split for a segment of ``steps``
        tokens per row, starting at ``start`` [B], in cache ``rows``."""
        return plan_segment(self.cos, self.sin, start, steps, rows)

    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        last: torch.Tensor | None,
        cache: KVCache,
        rows: slice,
    ) -> torch.Tensor:
        """Run ``tokens`` [B, T] for cache ``rows``, the first token of each at ``start`` [B].

        Returns float32 logits [B, vocab] at step ``last`` [B] of each row, on the model's
        device, where the batched sampling runs. Prefill passes a right-padded prompt batch with
        start 0; a decode step passes one token per row at its current length. Padding beyond a
        row's real tokens is written to the cache but never attended to: a later step overwrites
        it before any query can see it. ``last=None`` returns the logits of every step,
        [B, T, vocab] (for quality checks).
        """
        logits = self.step([Segment(tokens, start, last, rows)], cache)
        return logits if last is not None else logits.view(*tokens.shape, -1)

    @torch.inference_mode()
    def step(self, segments: list[Segment], cache: KVCache) -> torch.Tensor:
        """One forward pass over several segments (decode rows and prompts to prefill, say):
        every linear layer runs once over all their tokens, so the weights are read once, and
        each segment attends on its own cache rows. Returns the logits of each segment's rows
        at ``last`` (or at every step where ``last`` is None), one after another."""
        plans = [self.plan(seg.start, seg.tokens.shape[1], seg.rows) for seg in segments]
        tokens = [seg.tokens.reshape(-1) for seg in segments]
        x = self.transformer.wte(tokens[0] if len(tokens) == 1 else torch.cat(tokens))
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache.keys[layer], cache.values[layer], plans)
        x = x[wanted_tokens(segments, plans)]
        return self.lm_head(self.transformer.ln_f(x)).float()


def fuse_qkv(state: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """Replace each layer's q/k/v projections by one [3C, C] weight: one matmul instead of 3."""
    for layer in range(n_layer):
        prefix = f"transformer.h.{layer}.attn."
        parts = [state.pop(f"{prefix}{name}_proj.weight") for name in ("q", "k", "v")]
        state[f"{prefix}qkv_proj.weight"] = torch.cat(parts, dim=0)
    return state
