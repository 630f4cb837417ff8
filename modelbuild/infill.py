"""Infill quality on held-out files: exact match of a masked line, with and without the suffix.

python -m modelbuild.infill [--checkpoint DIR] [--lines 300] [--seed 0]

From the standard-library files the build held out (never trained on), lines of at least
``MIN_CHARS`` characters are drawn at random. For each, the model sees the text before the line
(its last ``PREFIX_TOKENS`` tokens) and, in the second condition, the text after it (its first
``SUFFIX_TOKENS`` tokens) in the checkpoint's FIM layout; the first line of its greedy output
must equal the masked line exactly. Both conditions get the same prefix, so the difference is
what the suffix is worth. Windows stay within the 256 positions the default model trained on.
It runs the serving engine itself, as the server would, on this machine's CPU.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path

from engine import GenerationRequest, GenerationResult, NullListener, TorchEngine
from engine.gptj import GPTJ
from modelbuild.corpus import read_texts, split
from postprocessing.detokenize import Postprocessor
from preprocessing.tokenize import Preprocessor
from serving.paths import DEFAULT_CHECKPOINT

MIN_CHARS = 8
PREFIX_TOKENS = 128
SUFFIX_TOKENS = 64
NEW_TOKENS = 32


def masked_lines(count: int, seed: int) -> list[tuple[str, str, str]]:
    """(prefix, line, suffix) for ``count`` random lines of the held-out files (the whole text
    before and after the line; only the drawn lines are cut out, so memory stays one copy)."""
    _, held_out = split()
    texts = list(read_texts(held_out))
    candidates = []  # (file, start, end) of each line long enough
    for index, text in enumerate(texts):
        start = 0
        for line in text.splitlines(keepends=True):
            if len(line.strip()) >= MIN_CHARS and line.endswith("\n"):
                candidates.append((index, start, start + len(line)))
            start += len(line)
    drawn = random.Random(seed).sample(candidates, min(count, len(candidates)))
    return [(texts[i][:a], texts[i][a : b - 1], texts[i][b:]) for i, a, b in drawn]


def _run(engine: TorchEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * len(requests)
    left = threading.Semaphore(0)

    class _Keep(NullListener):
        def __init__(self, index: int) -> None:
            self.index = index

        def on_finish(self, result: GenerationResult) -> None:
            results[self.index] = result
            left.release()

    for i, request in enumerate(requests):
        engine.submit(request, _Keep(i))
    for _ in requests:
        left.acquire()
    return [r for r in results if r is not None]


def evaluate(checkpoint: Path, count: int, seed: int, fim_order: str = "auto") -> dict:
    pre, post = Preprocessor(checkpoint, fim_order), Postprocessor(checkpoint)
    cases = masked_lines(count, seed)
    # enough characters for the tokens kept (code has at least one character per token)
    prefixes = pre.encode_all([p[-8 * PREFIX_TOKENS :] for p, _, _ in cases])
    suffixes = pre.encode_all([s[: 8 * SUFFIX_TOKENS] for _, _, s in cases])
    plain = [
        GenerationRequest(p[-PREFIX_TOKENS:] or [pre.tokenizer.eos_token_id], NEW_TOKENS)
        for p in prefixes
    ]
    conditions = {"without suffix": plain}
    if pre.fim is not None:
        conditions["with suffix"] = [
            GenerationRequest(pre.fim.prompt(p[-PREFIX_TOKENS:], s[:SUFFIX_TOKENS]), NEW_TOKENS)
            for p, s in zip(prefixes, suffixes, strict=True)
        ]
    engine = TorchEngine(GPTJ.from_checkpoint(checkpoint)).start()
    order = pre.fim.order if pre.fim is not None else "none"
    report: dict = {
        "checkpoint": str(checkpoint),
        "lines": len(cases),
        "seed": seed,
        "order": order,
    }
    try:
        for name, requests in conditions.items():
            started = time.perf_counter()
            results = _run(engine, requests)
            texts = [post.decode(r.output_ids).split("\n", 1)[0] for r in results]
            lines = [line for _, line, _ in cases]
            hits = sum(t == line for t, line in zip(texts, lines, strict=True))
            # how close a miss came: difflib's ratio, 1 = the same line (the "edit similarity"
            # code-completion benchmarks report next to exact match)
            similar = [
                difflib.SequenceMatcher(None, t, line).ratio()
                for t, line in zip(texts, lines, strict=True)
            ]
            report[name] = {
                "exact_match": round(hits / len(cases), 4),
                "hits": hits,
                "similarity": round(sum(similar) / len(similar), 4),
                "seconds": round(time.perf_counter() - started, 1),
            }
    finally:
        engine.stop()
    return report


def machine() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelbuild.infill", description=__doc__)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fim-order",
        choices=("auto", "psm", "spm"),
        default="auto",
        help="the prompt layout (auto: the checkpoint's own, as the server's default)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = evaluate(args.checkpoint, args.lines, args.seed, args.fim_order)
    report["machine"] = machine()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['lines']} masked lines of held-out files, seed {args.seed}, greedy, "
        f"prefix {PREFIX_TOKENS} / suffix {SUFFIX_TOKENS} tokens, {report['order'].upper()}, "
        f"{report['checkpoint']}"
    )
    print(f"machine: {report['machine']}")
    print("| condition | exact match | lines | mean similarity | seconds |")
    print("|---|---:|---:|---:|---:|")
    for name in ("without suffix", "with suffix"):
        if name in report:
            row = report[name]
            print(
                f"| {name} | {row['exact_match']:.1%} | {row['hits']}/{report['lines']} | "
                f"{row['similarity']:.3f} | "
                f"{row['seconds']} |"
            )
    if "with suffix" not in report:
        print("(this checkpoint has no fill-in-the-middle tokens: no suffix condition)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
