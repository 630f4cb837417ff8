"""The Llama family (Llama, Qwen2, Mistral, Starcoder2) in plain PyTorch, on the engine's cache.

The same interface as engine/gptj.py (``from_checkpoint``, ``forward``, ``step`` over segments
on the batched :class:`~engine.cache.KVCache`), so the torch engine runs either. The weights
keep transformers' names (``model.layers.N.self_attn.q_proj`` ...); q/k/v and the MLP's
gate/up are fused on load, one matmul each.

How these differ from GPT-J: each block is pre-norm and sequential (attention, then the MLP);
RMSNorm; rotary embeddings over the whole head with its two halves rotated (not interleaved
pairs), at the checkpoint's ``rope_theta``; grouped-query attention (fewer key/value heads
than query heads: the cache holds only those); a SwiGLU MLP. Qwen2 adds q/k/v biases.
Starcoder2 takes the switches: LayerNorm with bias, a plain GELU MLP (``c_fc``/``c_proj``) and
biases everywhere. A sliding window is not implemented: the context stops at the window, so no
sequence ever reaches it (:attr:`LlamaConfig.n_positions`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from engine.cache import KVCache, Segment, StepPlan, plan_segment, wanted_tokens
from engine.families import LLAMA_FAMILY, first_id, model_type, sliding_window
from engine.weights import FromCheckpoint, check_quantize, placed, read_safetensors

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family architecture, read from its Hugging Face config.json (:meth:`from_dict`)
    under the names the engine uses for GPT-J too (n_layer, n_embd, n_head, n_positions)."""

    model_type: str
    vocab_size: int
    n_embd: int  # hidden_size
    n_layer: int  # num_hidden_layers
    n_head: int  # num_attention_heads
    n_kv_head: int  # num_key_value_heads
    head_dim: int
    inner_dim: int  # intermediate_size
    max_positions: int  # max_position_embeddings
    norm_eps: float
    hidden_act: str = "silu"
    rope: Mapping = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 1e4})
    layer_norm: bool = False  # LayerNorm with bias (Starcoder2), else RMSNorm
    gated_mlp: bool = True  # SwiGLU gate/up/down, else c_fc/c_proj (Starcoder2)
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    eos_token_id: int | None = None

    @property
    def n_positions(self) -> int:
        """The context the engine serves: the model's, or its sliding window if shorter."""
        return min(self.max_positions, self.sliding_window or self.max_positions)

    @classmethod
    def from_dict(cls, raw: Mapping, source: object = "checkpoint") -> LlamaConfig:
        """Normalise a config.json of any of the family; refuse (ValueError, naming it) what
        this module does not implement."""
        kind = model_type(raw, source, LLAMA_FAMILY)
        act = raw.get("hidden_act", "gelu_pytorch_tanh" if kind == "starcoder2" else "silu")
        if act not in ACTIVATIONS:
            raise ValueError(f"{source}: hidden_act {act!r} is not one of {sorted(ACTIVATIONS)}")
        heads = raw["num_attention_heads"]
        starcoder = kind == "starcoder2"
        bias = bool(raw.get("use_bias", True)) if starcoder else False
        attention_bias = bool(raw.get("attention_bias", False)) if kind == "llama" else bias
        return cls(
            model_type=kind,
            vocab_size=raw["vocab_size"],
            n_embd=raw["hidden_size"],
            n_layer=raw["num_hidden_layers"],
            n_head=heads,
            n_kv_head=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            inner_dim=raw["intermediate_size"],
            max_positions=raw["max_position_embeddings"],
            norm_eps=raw.get("norm_epsilon", 1e-5) if starcoder else raw.get("rms_norm_eps", 1e-6),
            hidden_act=act,
            rope=rope_parameters(raw, source),
            layer_norm=starcoder,
            gated_mlp=not starcoder,
            qkv_bias=attention_bias or kind == "qwen2",
            out_bias=attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)) if kind == "llama" else bias,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", starcoder)),
            sliding_window=sliding_window(raw),
            eos_token_id=first_id(raw.get("eos_token_id")),
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> LlamaConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()), path)


def rope_parameters(raw: Mapping, source: object = "checkpoint") -> dict:
    """The rotary settings: transformers 5 writes ``rope_parameters`` (type, theta, scaling);
    older configs ``rope_theta`` and ``rope_scaling`` (None, or a type and its factors)."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    if params["rope_type"] not in ROPE_TYPES:
        raise ValueError(
            f"{source}: rope type {params['rope_type']!r} is not implemented by the torch "
            f"engine (it has {', '.join(ROPE_TYPES)}); serve it with backend openvino"
        )
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: a partial rotary factor is not implemented")
    return params


def inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """Each rotary pair's angle per position, as transformers computes it for the rope type
    (``linear``: slower by ``factor``; ``llama3``: low frequencies slower, blended between)."""
    rope, dim = config.rope, config.head_dim
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    if rope["rope_type"] == "linear":
        return inv_freq / rope["factor"]
    if rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_context = rope["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= old_context / high) & (wavelength <= old_context / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


def rotary_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of every position, [n_positions, head_dim], for the halves layout.

    The head's first half pairs with its second: rotating is ``x*cos + rotate_half(x)*sin``
    with ``rotate_half(x) = (-x2, x1)``; with the sign folded into sin it is
    ``x*cos + swap_halves(x)*sin``.
    """
    angles = torch.arange(config.n_positions).float()[:, None] * inverse_frequencies(config)
    angles = torch.cat((angles, angles), dim=-1)
    sign = torch.ones(config.head_dim)
    sign[: config.head_dim // 2] = -1.0
    return torch.cos(angles), torch.sin(angles) * sign


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [..., head_dim] in place (halves layout); cos/sin broadcast to x."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    x.copy_(torch.addcmul(x * cos, swapped, sin))


class RMSNorm(nn.Module):
    """x / rms(x) * weight, in float32 whatever the weights' dtype (as transformers does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def norm(config: LlamaConfig) -> nn.Module:
    if config.layer_norm:
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps)
    return RMSNorm(config.n_embd, config.norm_eps)


class Attention(nn.Module):
    """Grouped-query attention: ``n_head`` query heads share ``n_kv_head`` key/value heads."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        fused = (config.n_head + 2 * config.n_kv_head) * config.head_dim  # q|k|v
        self.qkv_proj = nn.Linear(config.n_embd, fused, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_head * config.head_dim, config.n_embd, config.out_bias)

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        """x [N, C]: every segment's tokens, one after another (as GPT-J's attention)."""
        qkv = self.qkv_proj(x)
        outs, offset = [], 0
        for plan in plans:
            outs.append(
                self._attend(qkv[offset : offset + plan.tokens], cache_keys, cache_values, plan)
            )
            offset += plan.tokens
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))

    def _attend(self, qkv, cache_keys, cache_values, plan: StepPlan) -> torch.Tensor:
        heads, kv_heads, dim = self.config.n_head, self.config.n_kv_head, self.config.head_dim
        batch, steps = plan.positions.shape
        qkv = qkv.view(batch, steps, heads + 2 * kv_heads, dim)
        apply_rotary(qkv[:, :, None, : heads + kv_heads], plan.cos, plan.sin)  # q and k at once
        q, k, v = qkv.split((heads, kv_heads, kv_heads), dim=2)
        layer_keys, layer_values = cache_keys[plan.rows], cache_values[plan.rows]
        layer_keys[plan.row_index, :, plan.positions] = k
        layer_values[plan.row_index, :, plan.positions] = v
        q = q.transpose(1, 2)
        attend = functools.partial(F.scaled_dot_product_attention, enable_gqa=kv_heads != heads)
        keys = layer_keys[:, :, : plan.key_len]
        values = layer_values[:, :, : plan.key_len]
        if plan.mask is None:
            out = attend(q, keys, values, is_causal=True)
        else:
            out = attend(q, keys, values, attn_mask=plan.mask)
        for row, length in plan.long_rows:
            out[row : row + 1] = attend(
                q[row : row + 1],
                layer_keys[row : row + 1, :, :length],
                layer_values[row : row + 1, :, :length],
            )
        return out.transpose(1, 2).reshape(batch * steps, heads * dim)


class GatedMLP(nn.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), with gate|up fused into one matmul."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[config.hidden_act]
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * config.inner_dim, config.mlp_bias)
        self.down_proj = nn.Linear(config.inner_dim, config.n_embd, config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class MLP(nn.Module):
    """Starcoder2's: c_proj(act(c_fc(x)))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[config.hidden_act]
        self.c_fc = nn.Linear(config.n_embd, config.inner_dim, config.mlp_bias)
        self.c_proj = nn.Linear(config.inner_dim, config.n_embd, config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm and sequential: x + attention(norm(x)), then that + mlp(norm(that))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = norm(config)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = norm(config)
        self.mlp = GatedMLP(config) if config.gated_mlp else MLP(config)

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        x = x + self.self_attn(self.input_layernorm(x), cache_keys, cache_values, plans)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """transformers' ``model.``: the embedding, the blocks and the final norm."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = norm(config)


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's *.safetensors (shards too), less the rotary
    buffers some older Llama checkpoints saved."""
    return read_safetensors(path, leave_out=("rotary_emb.inv_freq",))


class Llama(FromCheckpoint, nn.Module):
    """A Llama-family causal LM, loaded from its ``*ForCausalLM`` weights."""

    config_class = LlamaConfig
    read_state = staticmethod(load_state_dict)

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_word_embeddings:  # one tensor, not a copy
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rotary_tables(config)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        quantize: str | None = None,
    ) -> Llama:
        """Build from transformers' weights, fusing q/k/v and gate/up."""
        check_quantize(quantize, dtype, device)
        state = fuse(dict(state), config)
        if config.tie_word_embeddings:  # whatever lm_head a tied checkpoint carries is unused
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return placed(cls(config), state, dtype, device, quantize)

    def plan(self, start: torch.Tensor, steps: int, rows: slice = slice(None)) -> StepPlan:
        """Positions, masks, rotary tables and the long-row split (as ``GPTJ.plan``)."""
        return plan_segment(self.cos, self.sin, start, steps, rows)

    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        last: torch.Tensor | None,
        cache: KVCache,
        rows: slice,
    ) -> torch.Tensor:
        """Logits of ``tokens`` [B, T] in cache ``rows`` from ``start`` [B], as ``GPTJ.forward``
        (at step ``last`` [B] of each row; ``last=None``: every step, [B, T, vocab])."""
        logits = self.step([Segment(tokens, start, last, rows)], cache)
        return logits if last is not None else logits.view(*tokens.shape, -1)

    @torch.inference_mode()
    def step(self, segments: list[Segment], cache: KVCache) -> torch.Tensor:
        """One forward pass over several segments, as ``GPTJ.step``: float32 logits of each
        segment's wanted steps, one after another."""
        plans = [self.plan(seg.start, seg.tokens.shape[1], seg.rows) for seg in segments]
        tokens = [seg.tokens.reshape(-1) for seg in segments]
        x = self.model.embed_tokens(tokens[0] if len(tokens) == 1 else torch.cat(tokens))
        for layer, block in enumerate(self.model.layers):
            x = block(x, cache.keys[layer], cache.values[layer], plans)
        x = x[wanted_tokens(segments, plans)]
        return self.lm_head(self.model.norm(x)).float()


def fuse(state: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Each layer's q/k/v projections into one ``qkv_proj`` and (SwiGLU) gate/up into one
    ``gate_up_proj``, weights and biases alike: one matmul instead of three, or two."""
    groups = [("self_attn.", ("q_proj", "k_proj", "v_proj"), "qkv_proj")]
    if config.gated_mlp:
        groups.append(("mlp.", ("gate_proj", "up_proj"), "gate_up_proj"))
    for layer in range(config.n_layer):
        for module, parts, fused in groups:
            prefix = f"model.layers.{layer}.{module}"
            for kind in ("weight", "bias"):
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if all(name in state for name in names):
                    state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(n) for n in names])
    return state
