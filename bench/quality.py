"""What bfloat16 and int8 cost in quality and buy in speed, against float32 on the same prompts.

    python -m bench.quality [--prompts 8] [--prompt-len 32] [--new 32] [--batch 16]

Builds a randomly initialised GPT-J with codegen-350M's shapes (no download; needs
transformers, a dev dependency), lets float32 generate greedily, then feeds every variant the
same sequences and compares, at each generated position: whether its argmax is float32's token,
and its log-prob of that token. Also times a decode step at ``--batch`` rows. A random model's
distributions are flat, so small errors flip near-ties: agreement here is a lower bound.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.models import SHAPE_350M
from engine import GPTJ, GPTJConfig, KVCache

VARIANTS = {
    "float32": {},
    "bfloat16": {"dtype": torch.bfloat16},
    "int8": {"quantize": "int8"},
}


def random_state(config: dict, seed: int = 0) -> tuple[GPTJConfig, dict[str, torch.Tensor]]:
    from transformers import GPTJConfig as HFConfig
    from transformers import GPTJForCausalLM

    torch.manual_seed(seed)
    model = GPTJForCausalLM(HFConfig(**config, tie_word_embeddings=False))
    return GPTJConfig(**config), model.state_dict()


def all_logits(model: GPTJ, tokens: torch.Tensor) -> torch.Tensor:
    """log-softmax of every position of ``tokens`` [B, T]: [B, T, V] float32."""
    cache = KVCache.empty(model.config, _dtype(model))
    cache.reserve(*tokens.shape)
    start = torch.zeros(tokens.shape[0], dtype=torch.long)
    return torch.log_softmax(model(tokens, start, None, cache, slice(0, tokens.shape[0])), -1)


def _dtype(model: GPTJ) -> torch.dtype:
    return model.transformer.wte.weight.dtype


def greedy(model: GPTJ, prompts: torch.Tensor, new: int) -> torch.Tensor:
    """prompts [B, P] followed by ``new`` greedy tokens."""
    batch, length = prompts.shape
    cache = KVCache.empty(model.config, _dtype(model))
    cache.reserve(batch, length + new)
    rows, zeros = slice(0, batch), torch.zeros(batch, dtype=torch.long)
    logits = model(prompts, zeros, torch.full((batch,), length - 1), cache, rows)
    out = [prompts]
    for step in range(new):
        token = logits.argmax(-1, keepdim=True)
        out.append(token)
        if step + 1 < new:
            logits = model(token, torch.full((batch,), length + step), zeros, cache, rows)
    return torch.cat(out, dim=1)


def step_ms(model: GPTJ, batch: int, context: int = 64, steps: int = 8) -> float:
    """Median wall time of a decode step for ``batch`` rows at about ``context`` tokens."""
    cache = KVCache.empty(model.config, _dtype(model))
    cache.reserve(batch, context + steps)
    rows, zeros = slice(0, batch), torch.zeros(batch, dtype=torch.long)
    tokens = torch.randint(1, model.config.vocab_size, (batch, context))
    model(tokens, zeros, torch.full((batch,), context - 1), cache, rows)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        model(tokens[:, :1], torch.full((batch,), context + step), zeros, cache, rows)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="rows of the timed decode step")
    args = parser.parse_args()

    config, state = random_state(SHAPE_350M)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, config.vocab_size, (args.prompts, args.prompt_len), generator=gen)
    reference = GPTJ.from_state_dict(config, state)
    with torch.inference_mode():
        sequences = greedy(reference, prompts, args.new)
        targets = sequences[:, args.prompt_len :]  # float32's greedy tokens
        span = slice(args.prompt_len - 1, -1)  # the positions that predicted them
        expected = all_logits(reference, sequences)[:, span].gather(-1, targets[..., None])
    print(
        f"random GPT-J, codegen-350M shapes, {args.prompts} prompts x {args.prompt_len} tokens, "
        f"{args.new} greedy float32 tokens each, {torch.get_num_threads()} threads"
    )
    print(f"{'variant':>9} {'agree':>7} {'mean |dlogp|':>13} {'max |dlogp|':>12} {'ms/step':>8}")
    for name, kwargs in VARIANTS.items():
        model = reference if name == "float32" else GPTJ.from_state_dict(config, state, **kwargs)
        with torch.inference_mode():
            log_probs = all_logits(model, sequences)[:, span]
            agree = (log_probs.argmax(-1) == targets).float().mean().item()
            diff = (log_probs.gather(-1, targets[..., None]) - expected).abs()
            ms = step_ms(model, args.batch)
        print(
            f"{name:>9} {agree:>7.1%} {diff.mean().item():>13.4f} {diff.max().item():>12.4f} "
            f"{ms:>8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
