"""The ``prefix`` section: an editor's pattern, a long prompt resent with a few more tokens.

For each model (the default one, ~900-token prompts; the 350M shape, ~1,000) and each system
(the openvino backend with its prefix cache on and off, the torch engine in float32 and, where
the CPU has it natively, bfloat16), each in a process of its own (the one-pool rule): a cold
prompt (a window of real Python source never sent before), then the same prompt with 3 more
tokens, each answered with ``new`` greedy tokens. Reported: time to the first token and to the
last, median over ``repeats`` windows.

    python -m bench.prefix [--models default,350m] [--repeats 3] [--new 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SYSTEMS = ("openvino", "openvino-no-cache", "torch-float32", "torch-bfloat16")
PROMPT_TOKENS = {"default": 900, "350m": 1000}
MORE = 3  # tokens added when the prompt is resent (a few characters typed)


def windows(length: int, count: int, vocab: int) -> list[list[int]]:
    """``count`` disjoint windows of ``length + MORE`` tokens of the standard library's source
    that the default model never trained on, in its tokenizer's ids (every model's vocabulary
    holds them: the 350M shape's is a random model's, made-up words)."""
    from transformers import AutoTokenizer

    from bench.models import DEFAULT_CHECKPOINT
    from modelbuild.corpus import read_texts, split

    tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_CHECKPOINT))
    ids: list[int] = []
    for text in read_texts(split()[1]):  # no BOS between files: one stream of source
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= count * (length + MORE):
            break
    size = length + MORE
    if len(ids) < count * size:
        raise RuntimeError(f"the held-out source gives {len(ids)} tokens, {count * size} needed")
    return [[t % vocab for t in ids[i * size : (i + 1) * size]] for i in range(count)]


def _timed(engine, prompt: list[int], new: int) -> tuple[float, float]:
    """(seconds to the first token, seconds to the result) of one greedy request."""
    from engine import GenerationRequest, GenerationResult

    first: list[float] = []
    done = threading.Event()
    box: list[GenerationResult] = []

    class Timer:
        def on_token(self, token_id: int, log_prob: float) -> None:
            if not first:
                first.append(time.perf_counter())

        def on_finish(self, result: GenerationResult) -> None:
            box.append(result)
            done.set()

    request = GenerationRequest(prompt, new, return_log_probs=False)
    started = time.perf_counter()
    engine.submit(request, Timer())
    done.wait()
    if box[0].error:
        raise RuntimeError(box[0].error)
    return first[0] - started, time.perf_counter() - started


def measure(system: str, checkpoint: Path, length: int, repeats: int, new: int) -> dict:
    """One system on one model, in this process (run it alone: see main)."""
    import torch

    from engine import ModelShape

    shape = ModelShape.read(checkpoint)
    prompts = windows(length, repeats + 1, shape.vocab_size)
    if system.startswith("openvino"):
        from engine import OpenVINOBackend, require_export

        engine = OpenVINOBackend(
            require_export(checkpoint), shape, max_batch_size=4,
            max_cache_tokens=16 * shape.context, prefix_caching=system == "openvino",
        ).start()  # fmt: skip
    else:
        from engine import TorchEngine, in_passing_thread, load_model

        dtype = getattr(torch, system.split("-")[1])
        model = in_passing_thread(lambda: load_model(checkpoint, dtype=dtype))
        engine = TorchEngine(model, max_batch_size=4).start()
    try:
        _timed(engine, prompts[0], new)  # warm-up: first compilations and allocations
        cold, warm = [], []
        for prompt in prompts[1:]:
            cold.append(_timed(engine, prompt[:length], new))
            warm.append(_timed(engine, prompt, new))
    finally:
        engine.stop()

    def median(pairs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(p[i] for p in pairs)

    return {
        "system": system,
        "cold_first_s": median(cold, 0),
        "cold_total_s": median(cold, 1),
        "resent_first_s": median(warm, 0),
        "resent_total_s": median(warm, 1),
    }


def checkpoints(models: list[str], default: Path, log) -> dict[str, Path]:
    """The models' folders, with their OpenVINO exports (made once)."""
    from bench.models import RANDOM_350M, build_random_gptj
    from modelbuild.openvino_export import ensure_export

    found = {}
    for key in models:
        path = default if key == "default" else build_random_gptj(RANDOM_350M, progress=log)
        ensure_export(path)
        found[key] = path
    return found


def run_prefix(
    models: list[str], default: Path, repeats: int, new: int, log=print
) -> list[dict[str, Any]]:
    """Every (model, system) in a process of its own; the rows for the report (the served
    rows: bench/served_prefix.py)."""
    from reporting.machine import bf16_native

    systems = [s for s in SYSTEMS if s != "torch-bfloat16" or bf16_native()]
    rows = []
    for key, path in checkpoints(models, default, log).items():
        for system in systems:
            log(f"prefix: {key} model, {system}, {PROMPT_TOKENS[key]}-token prompts ...")
            command = [
                sys.executable, "-m", "bench.prefix", "--one", system, "--checkpoint", str(path),
                "--length", str(PROMPT_TOKENS[key]), "--repeats", str(repeats), "--new", str(new),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{system} on {key} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"model": key, "prompt_tokens": PROMPT_TOKENS[key], "new": new, **row})
            log("  " + render_row(rows[-1]))
    return rows


def render_row(row: dict[str, Any]) -> str:
    ms = {k: f"{row[k] * 1000:,.0f} ms" for k in row if k.endswith("_s")}
    return (
        f"{row['model']:8} {row['system']:18} cold: first {ms['cold_first_s']:>9}, total "
        f"{ms['cold_total_s']:>9} | resent +{MORE} tokens: first {ms['resent_first_s']:>9}, "
        f"total {ms['resent_total_s']:>9}"
    )


def prefix_table(rows: list[dict[str, Any]]) -> tuple[str, str, list[str], list[list[str]]]:
    """(title, context, headers, rows) in the bench report's table form."""
    headers = ["model", "system", "prompt", "cold first", "cold total", "resent first",
               "resent total", "resent speed-up"]  # fmt: skip
    body = [
        [
            r["model"], r["system"], str(r["prompt_tokens"]),
            *(f"{r[k] * 1000:,.0f} ms" for k in
              ("cold_first_s", "cold_total_s", "resent_first_s", "resent_total_s")),
            f"{r['cold_total_s'] / r['resent_total_s']:.1f}x",
        ]
        for r in rows
    ]  # fmt: skip
    new = rows[0]["new"] if rows else 0
    context = (
        f"A prompt of real Python source, then the same prompt with {MORE} more tokens; "
        f"{new} greedy tokens each; medians; each system alone in its own process."
    )
    return "Prefix: a long prompt resent", context, headers, body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix", description=__doc__)
    parser.add_argument("--models", default="default,350m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, help="the default model's folder")
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        row = measure(args.one, args.checkpoint, args.length, args.repeats, args.new)
        print(json.dumps(row))
        return 0
    from bench.format import machine, machine_label
    from bench.models import DEFAULT_CHECKPOINT

    print(f"machine: {machine_label(machine())}")  # the label names the CPU flags
    rows = run_prefix(
        args.models.split(","), args.checkpoint or DEFAULT_CHECKPOINT, args.repeats, args.new
    )
    title, context, headers, body = prefix_table(rows)
    from bench.format import text_table

    print(f"\n== {title}\n{context}\n\n{text_table(headers, body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
