"""Gemma 3 (``model_type`` ``gemma3_text``) in plain PyTorch, on the engine's cache.

The same interface as engine/llama.py (``from_checkpoint``, ``forward``, ``step`` over segments
on the batched :class:`~engine.cache.KVCache`), weights under transformers' names, q/k/v and
gate/up fused on load (engine/llama.py's :func:`~engine.llama.fuse`).

How Gemma 3 differs from Llama: the token embedding is scaled by ``sqrt(hidden_size)``; its
RMSNorm multiplies by ``1 + weight`` in float32; each block norms the attention's and the MLP's
outputs too (four norms a block); queries and keys are RMS-normed per head before the rotary
embedding (QK-norm), and scores are scaled by ``query_pre_attn_scalar ** -0.5``; the MLP is
GeGLU (tanh GELU). Layers alternate: ``sliding_attention`` layers see the last
``sliding_window`` positions, with their own rotary base (10k), ``full_attention`` layers
everything (base 1M). The cache keeps every position for every layer, so a sliding layer only
masks the older ones: the context is the model's whole ``max_position_embeddings``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from engine.cache import KVCache, Segment, StepPlan, plan_segment, wanted_tokens
from engine.families import GEMMA3, first_id, model_type
from engine.llama import fuse, load_state_dict
from engine.weights import FromCheckpoint, check_quantize, placed

SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_TYPES = ("default", "linear")


@dataclass(frozen=True)
class Gemma3Config:
    """A Gemma 3 text architecture, read from config.json (:meth:`from_dict`) under the names
    the engine uses for every family (n_layer, n_embd, n_head, n_positions)."""

    vocab_size: int
    n_embd: int  # hidden_size
    n_layer: int  # num_hidden_layers
    n_head: int  # num_attention_heads
    n_kv_head: int  # num_key_value_heads
    head_dim: int
    inner_dim: int  # intermediate_size
    n_positions: int  # max_position_embeddings: sliding layers mask, they do not cut
    norm_eps: float
    query_scale: float  # query_pre_attn_scalar ** -0.5
    sliding_window: int
    layer_types: tuple[str, ...]
    rope: Mapping[str, Mapping]  # per layer type: rope_type, rope_theta (and factor)
    final_softcap: float | None = None
    eos_token_id: int | None = None
    model_type: str = GEMMA3
    gated_mlp: bool = True  # gate/up, fused on load (engine/llama.py's ``fuse``)

    @classmethod
    def from_dict(cls, raw: Mapping, source: object = "checkpoint") -> Gemma3Config:
        """Normalise a gemma3_text config.json; refuse (ValueError, naming it) what this module
        does not implement."""
        model_type(raw, source, (GEMMA3,))
        for key, off in (("attn_logit_softcapping", None), ("use_bidirectional_attention", False)):
            if raw.get(key, off) not in (off, False):
                raise ValueError(f"{source}: {key}={raw[key]!r} is not implemented")
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"{source}: hidden_activation {act!r} is not gelu_pytorch_tanh")
        layers = raw["num_hidden_layers"]
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        default = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
        types = tuple(raw.get("layer_types") or default)
        if len(types) != layers or set(types) - {SLIDING, FULL}:
            raise ValueError(f"{source}: layer_types {list(types)} do not fit {layers} layers")
        heads = raw["num_attention_heads"]
        return cls(
            vocab_size=raw["vocab_size"],
            n_embd=raw["hidden_size"],
            n_layer=layers,
            n_head=heads,
            n_kv_head=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            inner_dim=raw["intermediate_size"],
            n_positions=raw["max_position_embeddings"],
            norm_eps=raw.get("rms_norm_eps", 1e-6),
            query_scale=raw.get("query_pre_attn_scalar", 256) ** -0.5,
            sliding_window=raw.get("sliding_window") or 4096,
            layer_types=types,
            rope=rope_parameters(raw, source),
            final_softcap=raw.get("final_logit_softcapping"),
            eos_token_id=first_id(raw.get("eos_token_id")),
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Gemma3Config:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()), path)


def rope_parameters(raw: Mapping, source: object = "checkpoint") -> dict[str, dict]:
    """Each layer type's rotary settings: transformers 5 writes ``rope_parameters`` keyed by
    layer type; older configs ``rope_theta`` (full), ``rope_local_base_freq`` (sliding) and
    ``rope_scaling`` (full layers only)."""
    given = raw.get("rope_parameters") or {}
    if FULL not in given and SLIDING not in given:  # the older, flat form
        full = {"rope_type": "default", **(raw.get("rope_scaling") or given)}
        full.setdefault("rope_theta", raw.get("rope_theta", 1e6))
        given = {FULL: full, SLIDING: {"rope_theta": raw.get("rope_local_base_freq", 1e4)}}
    params = {}
    for kind, theta in ((FULL, 1e6), (SLIDING, 1e4)):
        rope = dict(given.get(kind) or {})
        rope["rope_type"] = rope.get("rope_type", rope.pop("type", "default"))
        rope.setdefault("rope_theta", theta)
        if rope["rope_type"] not in ROPE_TYPES:
            raise ValueError(
                f"{source}: rope type {rope['rope_type']!r} ({kind}) is not implemented by the "
                f"torch engine (it has {', '.join(ROPE_TYPES)}); serve it with backend openvino"
            )
        params[kind] = rope
    return params


def rotary_tables(config: Gemma3Config, rope: Mapping) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of every position, [n_positions, head_dim] (halves layout, as
    engine/llama.py's), at ``rope``'s base (``linear``: positions slowed by ``factor``)."""
    dim = config.head_dim
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    if rope["rope_type"] == "linear":
        inv_freq = inv_freq / rope["factor"]
    angles = torch.arange(config.n_positions).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    sign = torch.ones(dim)
    sign[: dim // 2] = -1.0
    return torch.cos(angles), torch.sin(angles) * sign


def windowed(plan: StepPlan, window: int) -> StepPlan:
    """``plan`` for a sliding layer: each query sees only keys less than ``window`` positions
    behind it (transformers' ``kv_idx > q_idx - sliding_window``). Unchanged while no
    position reaches the window; long rows are cut to their window in the attention."""
    if int(plan.positions.max()) < window:
        return plan
    keys = torch.arange(plan.key_len, device=plan.positions.device)[None, None, :]
    pos = plan.positions[:, :, None]
    allowed = (keys <= pos) & (keys > pos - window)
    return dataclasses.replace(plan, mask=allowed[:, None])


class RMSNorm(nn.Module):
    """Gemma's: x / rms(x) * (1 + weight), all in float32, then back to x's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] rotated (halves layout; the sign is in ``sin``)."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin)


class Attention(nn.Module):
    """Grouped-query attention with QK-norm; a sliding layer attends within its window."""

    def __init__(self, config: Gemma3Config, sliding: bool) -> None:
        super().__init__()
        self.config = config
        self.window = config.sliding_window if sliding else None
        fused = (config.n_head + 2 * config.n_kv_head) * config.head_dim  # q|k|v
        self.qkv_proj = nn.Linear(config.n_embd, fused, bias=False)
        self.o_proj = nn.Linear(config.n_head * config.head_dim, config.n_embd, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps)

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        """x [N, C]: every segment's tokens, one after another."""
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
        q, k, v = qkv.view(batch, steps, heads + 2 * kv_heads, dim).split(
            (heads, kv_heads, kv_heads), dim=2
        )
        cos, sin = plan.cos[:, :, 0], plan.sin[:, :, 0]  # [B, T, 1, dim]
        q = apply_rotary(self.q_norm(q), cos, sin).transpose(1, 2)
        k = apply_rotary(self.k_norm(k), cos, sin)
        layer_keys, layer_values = cache_keys[plan.rows], cache_values[plan.rows]
        layer_keys[plan.row_index, :, plan.positions] = k
        layer_values[plan.row_index, :, plan.positions] = v
        attend = functools.partial(
            F.scaled_dot_product_attention,
            scale=self.config.query_scale,
            enable_gqa=kv_heads != heads,
        )
        keys = layer_keys[:, :, : plan.key_len]
        values = layer_values[:, :, : plan.key_len]
        if plan.mask is None:
            out = attend(q, keys, values, is_causal=True)
        else:
            out = attend(q, keys, values, attn_mask=plan.mask)
        for row, length in plan.long_rows:  # one query, at position length - 1
            first = max(0, length - self.window) if self.window else 0
            out[row : row + 1] = attend(
                q[row : row + 1],
                layer_keys[row : row + 1, :, first:length],
                layer_values[row : row + 1, :, first:length],
            )
        return out.transpose(1, 2).reshape(batch * steps, heads * dim)


class GeGLU(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), with gate|up fused into one matmul."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * config.inner_dim, bias=False)
        self.down_proj = nn.Linear(config.inner_dim, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Block(nn.Module):
    """x + post_norm(attention(norm(x))), then that + post_norm(mlp(norm(that)))."""

    def __init__(self, config: Gemma3Config, sliding: bool) -> None:
        super().__init__()
        self.sliding = sliding
        self.input_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn = Attention(config, sliding)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = GeGLU(config)
        self.post_feedforward_layernorm = RMSNorm(config.n_embd, config.norm_eps)

    def forward(self, x, cache_keys, cache_values, plans: list[StepPlan]):
        h = self.self_attn(self.input_layernorm(x), cache_keys, cache_values, plans)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Backbone(nn.Module):
    """transformers' ``model.``: the embedding, the blocks and the final norm."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config, kind == SLIDING) for kind in config.layer_types)
        self.norm = RMSNorm(config.n_embd, config.norm_eps)


class Gemma3(FromCheckpoint, nn.Module):
    """Gemma 3's text model, loaded from ``Gemma3ForCausalLM`` weights (output tied to the
    embedding)."""

    config_class = Gemma3Config
    read_state = staticmethod(load_state_dict)

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # one tensor, not a copy
        self.embed_scale = math.sqrt(config.n_embd)
        tables = [rotary_tables(config, config.rope[kind]) for kind in (FULL, SLIDING)]
        # one buffer each ([full, sliding]), so engine/weights.py keeps them float32
        self.register_buffer("cos", torch.stack([t[0] for t in tables]), persistent=False)
        self.register_buffer("sin", torch.stack([t[1] for t in tables]), persistent=False)

    @classmethod
    def from_state_dict(
        cls,
        config: Gemma3Config,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        quantize: str | None = None,
    ) -> Gemma3:
        """Build from transformers' weights, fusing q/k/v and gate/up."""
        check_quantize(quantize, dtype, device)
        state = fuse(dict(state), config)
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return placed(cls(config), state, dtype, device, quantize)

    def plan(self, start: torch.Tensor, steps: int, rows: slice = slice(None)):
        """The segment's plans for full and for sliding layers (their rotary bases differ)."""
        full = plan_segment(self.cos[0], self.sin[0], start, steps, rows)
        sliding = plan_segment(self.cos[1], self.sin[1], start, steps, rows)
        return full, windowed(sliding, self.config.sliding_window)

    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        last: torch.Tensor | None,
        cache: KVCache,
        rows: slice,
    ) -> torch.Tensor:
        """Logits of ``tokens`` [B, T] in cache ``rows`` from ``start`` [B], as ``Llama.forward``
        (at step ``last`` [B] of each row; ``last=None``: every step, [B, T, vocab])."""
        logits = self.step([Segment(tokens, start, last, rows)], cache)
        return logits if last is not None else logits.view(*tokens.shape, -1)

    @torch.inference_mode()
    def step(self, segments: list[Segment], cache: KVCache) -> torch.Tensor:
        """One forward pass over several segments: float32 logits of each segment's wanted
        steps, one after another."""
        plans = [self.plan(seg.start, seg.tokens.shape[1], seg.rows) for seg in segments]
        full, sliding = [p[0] for p in plans], [p[1] for p in plans]
        tokens = [seg.tokens.reshape(-1) for seg in segments]
        x = self.model.embed_tokens(tokens[0] if len(tokens) == 1 else torch.cat(tokens))
        x = x * torch.tensor(self.embed_scale, dtype=x.dtype)  # rounded as transformers does
        for layer, block in enumerate(self.model.layers):
            x = block(x, cache.keys[layer], cache.values[layer], sliding if block.sliding else full)
        x = x[wanted_tokens(segments, full)]
        logits = self.lm_head(self.model.norm(x)).float()
        if self.config.final_softcap:
            cap = self.config.final_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits
