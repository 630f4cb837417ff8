"""Prompt-lookup decoding on CPU, measured on an editing workload: OpenVINO GenAI's
continuous-batching pipeline on the default model's export, bare, with the served engine's
budgets and compile properties, with and without ``prompt_lookup``, alternating per request.

Prompt lookup proposes the tokens that followed the last n-gram where it occurred earlier in the
prompt or the answer, and one forward pass checks them all; greedy answers must not change.
Code edits repeat their context, so each window of real Python source (300-800 tokens, cut at a
line start) is completed three times, 32 greedy tokens each: ``new``, the window never sent
before; ``edit``, the window after a small edit (an identifier renamed, or a line inserted);
``edit+after``, the edited window behind the original text after the cursor, as an editor's
context chunk (llama.vim's ``input_extra``) carries it: the answer can be copied from the prompt.

    python -m bench.speculative [--files 20] [--new 32]
"""

from __future__ import annotations

import argparse
import builtins
import keyword
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

CHECKPOINT = Path("model_repository/gptj/1/checkpoint")
STDLIB = Path("/usr/lib/python3.11")
KINDS = ("new", "edit", "edit+after")
CONFIGS = ("plain", "prompt lookup")
AFTER_TOKENS = 96  # the text after the cursor an editor's chunk carries
NAME = re.compile(r"\b[a-z_][a-z0-9_]{3,}\b")
RESERVED = {*keyword.kwlist, *dir(builtins), "self", "cls"}  # never renamed


def pipeline(checkpoint: Path, prompt_lookup: bool) -> Any:
    """A ContinuousBatchingPipeline with the served engine's budgets and compile properties."""
    from bench.ov import continuous_pipeline
    from bench.server import served_engine_settings

    settings = served_engine_settings()
    budgets = [
        int(settings[k]) for k in ("max_batch_size", "kv_cache_tokens", "max_prefill_tokens")
    ]
    lookup = {"prompt_lookup": True} if prompt_lookup else {}
    return continuous_pipeline(checkpoint, str(settings["dtype"]), *budgets, True, **lookup)


def edited(window: str, rng: random.Random) -> str:
    """The window after a small edit: its most used identifier renamed, else a line inserted."""
    counts: dict[str, int] = {}
    for name in NAME.findall(window):
        if name not in RESERVED:
            counts[name] = counts.get(name, 0) + 1
    repeated = [name for name, count in counts.items() if count >= 3]
    if repeated and rng.random() < 0.5:
        name = max(repeated, key=lambda n: counts[n])
        return re.sub(rf"\b{name}\b", f"{name}_v2", window)
    lines = window.splitlines(keepends=True)
    at = rng.randrange(len(lines) // 4, max(len(lines) // 4 + 1, len(lines) - 3))
    indent = re.match(r"[ \t]*", lines[at]).group(0)
    return "".join([*lines[:at], f"{indent}# checked again after the refactor\n", *lines[at:]])


def workload(tokenizer, files: int, seed: int) -> list[dict[str, list[int]]]:
    """Per file, the three prompts (token ids) of :data:`KINDS`."""
    rng = random.Random(seed)
    paths = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 20_000)
    rng.shuffle(paths)
    cases = []
    for path in paths:
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        ends = np.cumsum([len(tokenizer.encode(line).ids) for line in lines])
        wanted = rng.randrange(300, 800)
        starts = [i for i in range(len(lines)) if ends[-1] - (ends[i - 1] if i else 0) > 1200]
        if not starts:
            continue
        start = rng.choice(starts[len(starts) // 4 :])
        base = ends[start - 1] if start else 0
        cut = start + int(np.searchsorted(ends[start:], base + wanted))
        window, after = "".join(lines[start:cut]), "".join(lines[cut:])
        if not window.strip() or not after.strip():
            continue
        change = edited(window, rng)
        chunk = tokenizer.decode(tokenizer.encode(after).ids[:AFTER_TOKENS])
        prompts = {"new": window, "edit": change, "edit+after": f"{chunk}\n\n{change}"}
        cases.append({kind: tokenizer.encode(text).ids for kind, text in prompts.items()})
        if len(cases) == files:
            break
    return cases


def complete(pipe, request_id: int, ids: list[int], new: int, lookup: tuple[int, int] | None):
    """One request alone: (generated ids, seconds to the first token, seconds to the last,
    decode steps after the first token)."""
    import openvino
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = new
    if lookup is not None:
        config.num_assistant_tokens, config.max_ngram_size = lookup
    started = time.perf_counter()
    handle = pipe.add_request(request_id, openvino.Tensor(np.array([ids], dtype=np.int64)), config)
    tokens: list[int] = []
    first, steps, running = 0.0, 0, openvino_genai.GenerationStatus.RUNNING
    while True:
        if handle.can_read():
            for output in handle.read().values():
                tokens.extend(output.generated_ids)
            first = first or time.perf_counter() - started
        elif handle.get_status() != running:
            break
        else:
            pipe.step()
            steps += bool(first)
    return tokens[:new], first, time.perf_counter() - started, steps


def summary(rows: list[tuple[list[int], float, float, int]], new: int) -> dict[str, float]:
    totals = [row[2] * 1000 for row in rows]
    decode = [(last - first) * 1000 / (new - 1) for _, first, last, _ in rows]
    return {
        "per_step": (new - 1) * len(rows) / max(1, sum(row[3] for row in rows)),
        "p50": float(np.percentile(totals, 50)),
        "p95": float(np.percentile(totals, 95)),
        "first": float(np.percentile([row[1] * 1000 for row in rows], 50)),
        "ms_token": float(np.percentile(decode, 50)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--files", type=int, default=20, help="windows (requests per kind)")
    parser.add_argument("--new", type=int, default=32, help="greedy tokens per answer")
    parser.add_argument("--assistant-tokens", type=int, default=5, help="num_assistant_tokens")
    parser.add_argument("--ngram", type=int, default=3, help="max_ngram_size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer

    from engine import export_weights
    from reporting.machine import cpu_flags, cpu_model, load_average

    tokenizer = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    cases = workload(tokenizer, args.files, args.seed)
    lookup = {"plain": None, "prompt lookup": (args.assistant_tokens, args.ngram)}
    pipes = {name: pipeline(args.checkpoint, lookup[name] is not None) for name in CONFIGS}
    warm = tokenizer.encode(Path(__file__).read_text()).ids[:200]
    for name, pipe in pipes.items():  # compile and first-step costs out of the figures
        complete(pipe, 0, warm, 4, lookup[name])
    rows = {(c, k): [] for c in CONFIGS for k in KINDS}
    request_id = 1
    for index, case in enumerate(cases):
        for kind in KINDS:  # ABAB..., the order swapped every window: drift hits both alike
            order = CONFIGS if index % 2 == 0 else CONFIGS[::-1]
            for name in order:
                got = complete(pipes[name], request_id, case[kind], args.new, lookup[name])
                rows[(name, kind)].append(got)
                request_id += 1
        print(f"window {index + 1}/{len(cases)}: {len(case['new'])} prompt tokens", flush=True)
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = " ".join(cpu_flags(cpuinfo)) or "none of the listed flags"
    print(f"\n{cpu_model(cpuinfo)} ({flags}), load {load_average()}; "
          f"{export_weights(args.checkpoint)} weights; {len(cases)} windows, {args.new} greedy "
          f"tokens; num_assistant_tokens {args.assistant_tokens}, max_ngram_size "
          f"{args.ngram}\n")  # fmt: skip
    print("| requests | config | p50 ms | p95 ms | first token ms | decode ms/token | "
          "tokens/step | speed-up (p50) | same text |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for kind in KINDS:
        plain = summary(rows[("plain", kind)], args.new)
        same = sum(a[0] == b[0] for a, b in zip(*(rows[(c, kind)] for c in CONFIGS), strict=True))
        for name in CONFIGS:
            s = summary(rows[(name, kind)], args.new)
            cells = [f"{s[key]:.0f}" for key in ("p50", "p95", "first")]
            cells += [f"{s['ms_token']:.1f}", f"{s['per_step']:.2f}"]
            cells += [f"{plain['p50'] / s['p50']:.2f}x", f"{same}/{len(cases)}"]
            print(f"| {kind} | {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
