"""The ``prefix`` section: an editor's pattern, a long prompt resent with a few more tokens.

For each model (the default one, ~900-token prompts; the 350M shape, ~1,000) and each system
(the openvino backend with its prefix cache on and off, the torch engine in float32 and, where
native, bfloat16), each in a process of its own (the one-pool rule): a cold prompt of real
Python source, then the same prompt with 3 more tokens, each answered with ``new`` greedy
tokens; the times to the first token and to the last, medians over ``repeats`` windows.

    python -m bench.prefix [--models default,350m] [--repeats 3] [--new 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import engine
from bench.format import machine, machine_label, render_text
from bench.load import Pending, running_server
from bench.models import CACHE, DEFAULT_CHECKPOINT, RANDOM_350M, build_random_gptj
from bench.systems import served_dtype, stand_in_end_id
from bench.tables import prefix_table
from client import CodegenClient
from contract.model_tokens import prompt_head
from modelbuild.corpus import read_texts, split
from modelbuild.openvino_export import ensure_export
from reporting.machine import bf16_native

SYSTEMS = ("openvino", "openvino-no-cache", "torch-float32", "torch-bfloat16")
PROMPT_TOKENS = {"default": 900, "350m": 1000}
MORE = 3  # tokens added when the prompt is resent (a few characters typed)
STREAM_PROMPT, UNARY_PROMPT, NEW = 1000, 650, 16  # the served rows' prompts and answers
Progress = Callable[[str], None]


def windows(length: int, count: int, vocab: int) -> list[list[int]]:
    """``count`` disjoint windows of ``length + MORE`` tokens of held-out source, in the default
    model's ids (folded into a smaller vocabulary: the 350M shape's words are made up)."""
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


def measure(system: str, checkpoint: Path, length: int, repeats: int, new: int) -> dict:
    """One system on one model, in this process (run it alone: see main)."""
    shape = engine.ModelShape.read(checkpoint)
    prompts = windows(length, repeats + 1, shape.vocab_size)
    if system.startswith("openvino"):
        backend = engine.OpenVINOBackend(
            engine.require_export(checkpoint),
            shape,
            max_batch_size=4,
            max_cache_tokens=16 * shape.context,
            prefix_caching=system == "openvino",
        ).start()
    else:
        dtype = getattr(torch, system.split("-")[1])
        model = engine.in_passing_thread(lambda: engine.load_model(checkpoint, dtype=dtype))
        backend = engine.TorchEngine(model, max_batch_size=4).start()

    def timed(prompt: list[int]) -> tuple[float, float]:
        """(seconds to the first token, seconds to the result) of one greedy request."""
        started, pending = time.perf_counter(), Pending()
        backend.submit(engine.GenerationRequest(prompt, new, return_log_probs=False), pending)
        if (error := pending.wait().error) or pending.first is None:
            raise RuntimeError(error or "no token")
        return pending.first - started, time.perf_counter() - started

    try:
        timed(prompts[0])  # warm-up: first compilations and allocations
        pairs = [[timed(p[:length]), timed(p)] for p in prompts[1:]]
    finally:
        backend.stop()
    return {"system": system, **medians(pairs)}


def medians(pairs: list[list[tuple[float, float]]]) -> dict[str, float]:
    """Medians of the (cold, resent) pairs of (first token, answer) seconds."""
    return {
        f"{kind}_{what}_s": statistics.median(p[k][w] for p in pairs)
        for k, kind in enumerate(("cold", "resent"))
        for w, what in enumerate(("first", "total"))
    }


def checkpoints(models: list[str], default: Path, log: Progress) -> dict[str, Path]:
    """The models' folders, with their OpenVINO exports (made once)."""
    found = {
        key: default if key == "default" else build_random_gptj(RANDOM_350M, progress=log)
        for key in models
    }
    for path in found.values():
        ensure_export(path)
    return found


def run_prefix(
    models: list[str], default: Path, repeats: int, new: int, log: Progress = print
) -> list[dict[str, Any]]:
    """Every (model, system) in a process of its own: the bare rows for the report."""
    rows = []
    for key, path in checkpoints(models, default, log).items():
        for system in [s for s in SYSTEMS if s != "torch-bfloat16" or bf16_native()]:
            command = [
                sys.executable,
                "-m",
                "bench.prefix",
                "--one",
                system,
                "--checkpoint",
                str(path),
                "--length",
                str(PROMPT_TOKENS[key]),
                "--repeats",
                str(repeats),
                "--new",
                str(new),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{system} on {key} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"model": key, "prompt_tokens": PROMPT_TOKENS[key], "new": new, **row})
            log(f"prefix: {key} model, {system}, {PROMPT_TOKENS[key]}-token prompts: {said(row)}")
    return rows


def said(row: dict[str, Any]) -> str:
    return ", ".join(
        f"{k[:-2].replace('_', ' ')} {v * 1000:,.0f} ms" for k, v in row.items() if k.endswith("_s")
    )


def _served_once(client: Any, prompt: str, end_id: int, unary_prompt_tokens: int | None):
    """(seconds to the first piece, seconds to the answer) of one streamed request, or (with
    the prompt's token count) one unary request; RuntimeError unless it made NEW tokens."""
    started, first = time.perf_counter(), None
    if unary_prompt_tokens is None:
        stream = client.stream(prompt, NEW, end_id=end_id)
        for _ in stream:
            first = first or time.perf_counter() - started
        made = int((stream.completion.completion_tokens if stream.completion else 0) or 0)
    else:
        made = client.complete(prompt, NEW, end_id=end_id).total_tokens - unary_prompt_tokens
    total = time.perf_counter() - started
    if made != NEW:
        raise RuntimeError(f"{prompt[:20]!r}...: the server generated {made} tokens of {NEW}")
    return first or total, total


def run_served_prefix(
    paths: dict[str, Path], repeats: int, out: Path, log: Progress
) -> list[dict[str, Any]]:
    """An editor resending its file to Triton (openvino, its prefix cache on, as served), each
    model on a server of its own: the 350M shape streamed from the ``engine`` model (first piece and
    answer), the default model through the unary ``ensemble`` (cold over resent, the resent text
    3 characters longer). Medians after a warm-up window; 16 tokens each, checked."""
    dtype, rows = served_dtype(), []
    for key, path in paths.items():
        shape, stream = engine.ModelShape.read(path), key == "350m"
        end_id = stand_in_end_id(shape.vocab_size, shape.eos_token_id)
        length = STREAM_PROMPT if stream else UNARY_PROMPT
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
        head, pairs = len(prompt_head(tokenizer)), []  # what the server puts before a prompt
        with (
            running_server(
                path,
                CACHE / "serving",
                out / f"tritonserver-prefix-{key}.log",
                "cpu",
                backend="openvino",
                parameters={"dtype": dtype},
            ) as server,
            CodegenClient(server.grpc_url, "grpc") as client,
        ):
            for window in windows(length, repeats + 1, shape.vocab_size):
                if stream:  # the end token, named otherwise there, is replaced by its neighbour
                    eos = shape.eos_token_id
                    texts = [
                        " ".join(f"t{i if i != eos else i + 1}" for i in window[:n])
                        for n in (length, length + MORE)
                    ]
                    counts = [None, None]
                else:
                    text = tokenizer.decode(window[:length])
                    texts = [text, text + tokenizer.decode(window[length:])[:MORE]]
                    counts = [
                        head + len(tokenizer.encode(t, add_special_tokens=False)) for t in texts
                    ]
                pairs.append(
                    [_served_once(client, t, end_id, n) for t, n in zip(texts, counts, strict=True)]
                )
        row = medians(pairs[1:])  # the first window warms the server up
        if stream:
            row = {"path": "engine (stream)", **row}
        else:
            cold, resent = row["cold_total_s"], row["resent_total_s"]
            row = {
                "path": "ensemble (unary)",
                "cold_total_s": cold,
                "resent_total_s": resent,
                "cold_over_resent": cold / resent,
            }
        rows.append({"model": key, "dtype": dtype, "prompt_tokens": length, "new": NEW, **row})
        log(f"prefix served: {key} model, openvino {dtype}, {length}-token prompts: {said(row)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix", description=__doc__)
    parser.add_argument("--models", default="default,350m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, help="the default model's folder")
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # one system, in the process run_prefix started for it
        print(json.dumps(measure(args.one, args.checkpoint, args.length, args.repeats, args.new)))
        return 0
    print(f"machine: {machine_label(machine())}")  # the label names the CPU flags
    rows = run_prefix(
        args.models.split(","), args.checkpoint or DEFAULT_CHECKPOINT, args.repeats, args.new
    )
    print(render_text(prefix_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
