"""What bfloat16 and int8 cost in quality and buy in speed, against float32 on the same prompts.

    python -m bench.quality [--prompts 8] [--prompt-len 32] [--new 32] [--batch 16]

A randomly initialised GPT-J with codegen-350M's shapes generates greedily in float32; every
variant is fed the same sequences and compared at each generated position: whether its argmax
is float32's token, and its log-prob of that token; a decode step is timed at ``--batch`` rows.
A random model's flat distributions flip near-ties, so agreement here is a lower bound.

Then (alone with ``--openvino-only``) the openvino backend's dtypes on saved checkpoints (the
default model, the random 350M shape): OpenVINO GenAI's greedy tokens in float32 and bfloat16
against transformers' greedy float32 ones, as the share of tokens equal before the first
difference and the sequences equal throughout.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.models import SHAPE_350M
from engine import GPTJ, GPTJConfig, KVCache

VARIANTS = {"float32": {}, "bfloat16": {"dtype": torch.bfloat16}, "int8": {"quantize": "int8"}}


def forward(model: GPTJ, tokens: torch.Tensor, start: int, last: int | None, cache: KVCache):
    """The model on ``tokens`` [B, T] at position ``start``: the logits at ``last`` (None:
    every position)."""
    batch = tokens.shape[0]
    at = None if last is None else torch.full((batch,), last)
    return model(tokens, torch.full((batch,), start), at, cache, slice(0, batch))


def cache_for(model: GPTJ, batch: int, length: int) -> KVCache:
    cache = KVCache.empty(model.config, model.transformer.wte.weight.dtype)
    cache.reserve(batch, length)
    return cache


def all_logits(model: GPTJ, tokens: torch.Tensor) -> torch.Tensor:
    """log-softmax of every position of ``tokens`` [B, T]: [B, T, V] float32."""
    cache = cache_for(model, *tokens.shape)
    return torch.log_softmax(forward(model, tokens, 0, None, cache), -1)


def greedy(model: GPTJ, prompts: torch.Tensor, new: int) -> torch.Tensor:
    """prompts [B, P] followed by ``new`` greedy tokens."""
    batch, length = prompts.shape
    cache = cache_for(model, batch, length + new)
    out = [prompts]
    logits = forward(model, prompts, 0, length - 1, cache)
    for step in range(new):
        out.append(logits.argmax(-1, keepdim=True))
        if step + 1 < new:
            logits = forward(model, out[-1], length + step, 0, cache)
    return torch.cat(out, dim=1)


def step_ms(model: GPTJ, batch: int, context: int = 64, steps: int = 8) -> float:
    """Median wall time of a decode step for ``batch`` rows at about ``context`` tokens."""
    cache = cache_for(model, batch, context + steps)
    tokens = torch.randint(1, model.config.vocab_size, (batch, context))
    forward(model, tokens, 0, context - 1, cache)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        forward(model, tokens[:, :1], context + step, 0, cache)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1e3


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, int]:
    """(share of the reference's tokens matched before each sequence's first difference,
    sequences equal throughout)."""
    matched = total = equal = 0
    for ref, out in zip(reference, other, strict=True):
        same = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
                    min(len(ref), len(out)))  # fmt: skip
        matched, total, equal = matched + same, total + len(ref), equal + (ref == out)
    return (matched / total if total else 0.0), equal


def report_variants(args: argparse.Namespace) -> None:
    """The torch engine's bfloat16 and int8 against its float32, on the random 350M shape."""
    from transformers import GPTJConfig as HFConfig
    from transformers import GPTJForCausalLM

    torch.manual_seed(0)
    state = GPTJForCausalLM(HFConfig(**SHAPE_350M, tie_word_embeddings=False)).state_dict()
    config = GPTJConfig(**SHAPE_350M)
    prompts = torch.randint(1, config.vocab_size, (args.prompts, args.prompt_len),
                            generator=torch.Generator().manual_seed(1))  # fmt: skip
    reference = GPTJ.from_state_dict(config, state)
    with torch.inference_mode():
        sequences = greedy(reference, prompts, args.new)
        targets = sequences[:, args.prompt_len :]  # float32's greedy tokens
        span = slice(args.prompt_len - 1, -1)  # the positions that predicted them
        expected = all_logits(reference, sequences)[:, span].gather(-1, targets[..., None])
    print(f"random GPT-J, codegen-350M shapes, {args.prompts} prompts x {args.prompt_len} tokens, "
          f"{args.new} greedy float32 tokens each, {torch.get_num_threads()} threads")  # fmt: skip
    print(f"{'variant':>9} {'agree':>7} {'mean |dlogp|':>13} {'max |dlogp|':>12} {'ms/step':>8}")
    for name, kwargs in VARIANTS.items():
        model = reference if name == "float32" else GPTJ.from_state_dict(config, state, **kwargs)
        with torch.inference_mode():
            log_probs = all_logits(model, sequences)[:, span]
            agree = (log_probs.argmax(-1) == targets).float().mean().item()
            diff = (log_probs.gather(-1, targets[..., None]) - expected).abs()
            ms = step_ms(model, args.batch)
        print(f"{name:>9} {agree:>7.1%} {diff.mean().item():>13.4f} {diff.max().item():>12.4f} "
              f"{ms:>8.1f}", flush=True)  # fmt: skip


def report_openvino(args: argparse.Namespace) -> None:
    """Each model's openvino float32 and bfloat16 greedy tokens against transformers'."""
    from bench.models import DEFAULT_CHECKPOINT, RANDOM_350M, build_random_gptj, random_prompts
    from bench.ov import OPENVINO_DTYPES, PipelineGenerate
    from bench.systems import TransformersRunner
    from contract.model_tokens import end_ids
    from engine import ModelShape
    from modelbuild.openvino_export import ensure_export
    from reporting.machine import cpu_flags

    print(f"\nopenvino backend (OpenVINO GenAI pipeline, greedy) vs transformers float32 greedy: "
          f"{args.prompts} random prompts x {args.prompt_len} tokens, {args.new} new tokens; "
          f"CPU flags {' '.join(cpu_flags()) or 'none'}")  # fmt: skip
    print(f"{'model':>14} {'dtype':>9} {'agree before 1st diff':>22} {'equal sequences':>16}")
    for name, path in (("default", DEFAULT_CHECKPOINT), ("350m-random", None)):
        path = path or build_random_gptj(RANDOM_350M)
        if not (path / "config.json").is_file():
            print(f"{name:>14}: no checkpoint at {path} (run `make model`)")
            continue
        ensure_export(path)
        shape = ModelShape.read(path)
        ids = random_prompts(args.prompts, args.prompt_len, shape.vocab_size,
                             end_ids(path) or [shape.eos_token_id], seed=1)  # fmt: skip
        runner = TransformersRunner(path, "float32", "cpu")  # greedy, min_new_tokens
        reference = runner.generate_ids(ids, args.new, sampled=False, seed=0)
        runner.close()
        for dtype in OPENVINO_DTYPES:
            pipe = PipelineGenerate(path, dtype, max_batch_size=args.prompts)
            share, equal = agreement(reference, pipe.generate_ids(ids, args.new, False, 0))
            pipe.close()
            print(f"{name:>14} {dtype:>9} {share:>22.1%} {equal:>10}/{args.prompts}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="rows of the timed decode step")
    parser.add_argument("--openvino-only", action="store_true")
    args = parser.parse_args()
    if not args.openvino_only:
        report_variants(args)
    report_openvino(args)


if __name__ == "__main__":
    main()
