"""``python -m bench.quality [--openvino-only]``: what each engine's dtypes (torch float32,
bfloat16, int8; openvino float32, bfloat16) cost in greedy agreement with transformers' float32,
on the default model and a random GPT-J of codegen-350M's shapes (whose flat distributions flip
near-ties: a lower bound). The speed each buys is ``make bench``'s ``kernels`` section.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import models
from bench.systems import OPENVINO_DTYPES, EngineRunner, PipelineGenerate, TransformersRunner
from modelbuild.openvino_export import ensure_export
from reporting.machine import cpu_flags


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, int]:
    """(share of the reference's tokens matched before each sequence's first difference,
    sequences equal throughout)."""
    matched = total = equal = 0
    for ref, out in zip(reference, other, strict=True):
        same = next(
            (i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
            min(len(ref), len(out)),
        )
        matched, total, equal = matched + same, total + len(ref), equal + (ref == out)
    return (matched / total if total else 0.0), equal


def runner(variant: str, path: Path, args: argparse.Namespace) -> Any:
    system, dtype = variant.split()
    if system == "transformers":
        return TransformersRunner(path, dtype, "cpu")
    if system == "torch":
        return EngineRunner(path, dtype, "cpu", args.prompts, args.prompt_len)
    ensure_export(path)
    return PipelineGenerate(path, dtype, args.prompts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--openvino-only", action="store_true")
    args = parser.parse_args(argv)
    variants = [f"openvino {dtype}" for dtype in OPENVINO_DTYPES]
    if not args.openvino_only:
        variants = [f"torch {dtype}" for dtype in ("float32", "bfloat16", "int8")] + variants
    print(
        f"greedy tokens against transformers float32 greedy: {args.prompts} random prompts x "
        f"{args.prompt_len} tokens, {args.new} new tokens; CPU flags "
        f"{' '.join(cpu_flags()) or 'none'}"
    )
    print(f"{'model':>14} {'variant':>18} {'agree before 1st diff':>22} {'equal sequences':>16}")
    for name, path in (("default", models.DEFAULT_CHECKPOINT), ("350m-random", None)):
        path = path or models.build_random_gptj(models.RANDOM_350M)
        if not (path / "config.json").is_file():
            print(f"{name:>14}: no checkpoint at {path} (run `make model`)")
            continue
        info = models.describe_checkpoint(name, name, path)
        ids = models.random_prompts(
            args.prompts, args.prompt_len, info.vocab_size, info.banned, seed=1
        )
        tokens = {}
        for variant in ["transformers float32", *variants]:
            generator = runner(variant, path, args)
            tokens[variant] = generator.generate_ids(ids, args.new, sampled=False, seed=0)
            generator.close()
            if variant != "transformers float32":
                share, equal = agreement(tokens["transformers float32"], tokens[variant])
                print(
                    f"{name:>14} {variant:>18} {share:>22.1%} {equal:>10}/{args.prompts}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
