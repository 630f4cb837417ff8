"""What bfloat16 and int8 cost in quality and buy in speed, against float32 on the same prompts.

    python -m bench.quality [--prompts 8] [--prompt-len 32] [--new 32] [--batch 16]

Builds a randomly initialised GPT-J with codegen-350M's shapes (no download; needs
transformers, a dev dependency), lets float32 generate greedily, then feeds every variant the
same sequences and compares, at each generated position: whether its argmax is float32's token,
and its log-prob of that token. Also times a decode step at ``--batch`` rows. A random model's
distributions are flat, so small errors flip near-ties: agreement here is a lower bound.

``--openvino`` (the default; ``--no-openvino`` skips it) then checks the openvino backend's
dtypes the same way on saved checkpoints (the trained default model, and the random 350M shape
that ``make bench`` builds): OpenVINO GenAI's pipeline generates greedily in float32 and
bfloat16 on the same prompts, and each is compared with transformers' greedy float32 output
(the reference, ``AutoModelForCausalLM``: the default model's family): the share of generated
tokens equal to the reference's before the first difference, and the sequences equal
throughout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

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


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, int]:
    """(share of the reference's tokens matched before each sequence's first difference,
    sequences equal throughout)."""
    matched = total = equal = 0
    for ref, out in zip(reference, other, strict=True):
        same = 0
        for a, b in zip(ref, out, strict=False):
            if a != b:
                break
            same += 1
        matched += same
        total += len(ref)
        equal += same == len(ref) == len(out)
    return (matched / total if total else 0.0), equal


def openvino_agreement(
    checkpoint: Path, prompts: int, prompt_len: int, new: int
) -> list[tuple[str, float, int]]:
    """The openvino pipeline's greedy tokens in each dtype against transformers' float32."""
    from bench.models import random_prompts
    from bench.ov import OPENVINO_DTYPES, PipelineGenerate
    from bench.systems import TransformersRunner
    from contract.model_tokens import end_ids
    from engine import ModelShape
    from modelbuild.openvino_export import ensure_export

    ensure_export(checkpoint)
    shape = ModelShape.read(checkpoint)
    ids = random_prompts(
        prompts, prompt_len, shape.vocab_size, end_ids(checkpoint) or [shape.eos_token_id], seed=1
    )
    runner = TransformersRunner(checkpoint, "float32", "cpu")  # greedy, min_new_tokens
    reference = runner.generate_ids(ids, new, sampled=False, seed=0)
    runner.close()
    rows = []
    for dtype in OPENVINO_DTYPES:
        pipe = PipelineGenerate(checkpoint, dtype, max_batch_size=prompts)
        share, equal = agreement(reference, pipe.generate_ids(ids, new, False, 0))
        rows.append((dtype, share, equal))
        del pipe
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="rows of the timed decode step")
    parser.add_argument(
        "--openvino", action=argparse.BooleanOptionalAction, default=True,
        help="also the openvino backend's float32 and bfloat16 against transformers",
    )  # fmt: skip
    parser.add_argument(
        "--openvino-only", action="store_true", help="only the openvino backend's table"
    )
    args = parser.parse_args()
    if args.openvino_only:
        report_openvino(args)
        return

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
    if args.openvino:
        report_openvino(args)


def report_openvino(args: argparse.Namespace) -> None:
    """The openvino table: each model's float32 and bfloat16 greedy agreement."""
    from bench.models import DEFAULT_CHECKPOINT, RANDOM_350M, build_random_gptj
    from reporting.machine import cpu_flags

    print(
        f"\nopenvino backend (OpenVINO GenAI pipeline, greedy) vs transformers float32 greedy: "
        f"{args.prompts} random prompts x {args.prompt_len} tokens, {args.new} new tokens; "
        f"CPU flags {' '.join(cpu_flags()) or 'none'}"
    )
    print(f"{'model':>14} {'dtype':>9} {'agree before 1st diff':>22} {'equal sequences':>16}")
    models = [("default", DEFAULT_CHECKPOINT), ("350m-random", build_random_gptj(RANDOM_350M))]
    for name, path in models:
        if not (path / "config.json").is_file():
            print(f"{name:>14}: no checkpoint at {path} (run `make model`)")
            continue
        for dtype, share, equal in openvino_agreement(
            path, args.prompts, args.prompt_len, args.new
        ):
            print(f"{name:>14} {dtype:>9} {share:>22.1%} {equal:>10}/{args.prompts}", flush=True)


if __name__ == "__main__":
    main()
