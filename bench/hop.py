"""What one request pays for the path it takes through the server, on an idle server.

    python -m bench.hop                       # 30 requests per path, 8 tokens, greedy
    python -m bench.hop --requests 50 --tokens 16 --json hop.json

One request at a time (nothing else in the engine), each path in turn: the unary ``ensemble``,
a direct call to the ``gptj`` model (token ids in, token ids out), and the streaming model's time
to its first piece and to its last. The medians show the cost of the plumbing between Triton's
front end and the engine, which is what changes when the engine moves behind another model.

The checkpoint is a random GPT-J with the shapes of the model ``make model MODEL=stdlib`` trains
(4 layers x 256 wide, vocabulary 4,096; the plumbing's cost depends on the shapes, not the
weights) and a word-level tokenizer, made once under ``build/bench/``; ``--checkpoint`` takes
another one of any served family (e.g. the default model's folder, SmolLM2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from bench.format import machine, machine_label
from bench.models import CACHE, build_random_gptj
from bench.server import running_server
from client.client import CodegenClient
from client.request import CompletionRequest, requested_outputs
from contract.tensors import (
    ENSEMBLE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    MODEL_STAGE,
    PREPROCESSING_MODEL,
    PREPROCESSING_TO_MODEL_STAGE,
)

# `make model MODEL=stdlib`'s shapes (modelbuild.train.BuildConfig), and its end token's id
DEFAULT_SHAPE = {
    "vocab_size": 4096,
    "n_positions": 1024,
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 8,
    "rotary_dim": 16,
}
EOS = 0
PROMPT = " ".join(f"t{i}" for i in range(100, 120))  # 20 tokens of the word-level vocabulary


def _infer_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def stage_inputs(
    client: grpcclient.InferenceServerClient, request: CompletionRequest
) -> tuple[list, int]:
    """The model stage's inputs for ``request`` (its text tokenized once by ``preprocessing``)
    and the prompt's length in tokens."""
    tensors = request.tensors()
    inputs = [
        _infer_input(stage, tensors[name])
        for stage, name in ENSEMBLE_TO_PREPROCESSING.items()
        if name in tensors  # an optional input the request leaves out (suffix)
    ]
    answer = client.infer(PREPROCESSING_MODEL, inputs)
    stage = [
        _infer_input(stage, answer.as_numpy(name))
        for name, stage in PREPROCESSING_TO_MODEL_STAGE.items()
    ]
    return stage, int(answer.as_numpy("REQUEST_INPUT_LEN").reshape(-1)[0])


def timed(call: Callable[[], object], count: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def stream_times(url: str, request: CompletionRequest, count: int, warmup: int):
    """(first-piece ms, last-piece ms) per streamed request."""
    first, last = [], []
    with CodegenClient(url, protocol="grpc") as codegen:
        for i in range(warmup + count):
            started = time.perf_counter()
            seen = None
            with codegen.open_stream(request) as stream:
                for _ in stream:
                    seen = seen or time.perf_counter()
            if i >= warmup:
                first.append((seen - started) * 1000)
                last.append((time.perf_counter() - started) * 1000)
    return first, last


def measure(grpc_url: str, tokens: int, count: int, warmup: int) -> dict[str, dict]:
    client = grpcclient.InferenceServerClient(grpc_url)
    request = CompletionRequest(PROMPT, max_tokens=tokens)  # greedy
    ensemble_inputs = request.infer_inputs(grpcclient)
    outputs = requested_outputs(grpcclient)
    stage, prompt_tokens = stage_inputs(client, request)
    answer = client.infer(MODEL_STAGE, stage)
    generated = int(answer.as_numpy("sequence_length").reshape(-1)[0]) - prompt_tokens
    results = {
        "ensemble": timed(
            lambda: client.infer(ENSEMBLE_MODEL, ensemble_inputs, outputs=outputs), count, warmup
        ),
        "gptj": timed(lambda: client.infer(MODEL_STAGE, stage), count, warmup),
    }
    results["stream first piece"], results["stream last piece"] = stream_times(
        grpc_url, request, count, warmup
    )
    summary = {
        name: {
            "median_ms": round(statistics.median(times), 2),
            "p90_ms": round(statistics.quantiles(times, n=10)[-1], 2),
            "min_ms": round(min(times), 2),
        }
        for name, times in results.items()
    }
    summary["tokens generated"] = {"per request": generated}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder (any family)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per path")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=8, help="tokens each request generates")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or build_random_gptj(
        CACHE / "gptj-default-shape-random", DEFAULT_SHAPE, EOS
    )
    label = machine_label(machine("cpu"))
    with tempfile.TemporaryDirectory(prefix="bench-hop-") as tmp:
        log = Path(tmp) / "tritonserver.log"
        with running_server(checkpoint, Path(tmp), log, "cpu") as server:
            summary = measure(server.grpc_url, args.tokens, args.requests, args.warmup)
    print(f"{label}; {checkpoint.name}; {args.requests} requests per path, one at a time")
    for name, figures in summary.items():
        print(f"  {name:20s} {figures}")
    if args.json:
        args.json.write_text(json.dumps({"machine": label, **summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
