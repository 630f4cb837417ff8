"""What one request pays for the path it takes through the server, on an idle server.

    python -m bench.hop                       # 30 requests per path, 8 tokens, greedy
    python -m bench.hop --requests 50 --tokens 16 --json hop.json

One request at a time, each path in turn (the unary ``ensemble``, the ``gptj`` model called
directly with token ids, the stream's first and last piece): the plumbing between Triton's front
end and the engine, on a random GPT-J of ``make model MODEL=stdlib``'s shapes (its cost depends
on the shapes, not the weights), or ``--checkpoint``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from bench.format import machine, machine_label
from bench.load import running_server, timed
from bench.models import CACHE, build_random_gptj
from client.client import CodegenClient
from client.request import CompletionRequest, requested_outputs
from contract.tensors import (
    ENSEMBLE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    MODEL_STAGE,
    PREPROCESSING_MODEL,
    PREPROCESSING_TO_MODEL_STAGE,
)

# `make model MODEL=stdlib`'s shapes (modelbuild.train.BuildConfig); its end token is id 0
STDLIB_SHAPE = {
    "vocab_size": 4096,
    "n_positions": 1024,
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 8,
    "rotary_dim": 16,
}
PROMPT = " ".join(f"t{i}" for i in range(100, 120))  # 20 tokens of the word-level vocabulary


def stage_inputs(client: grpcclient.InferenceServerClient, request: CompletionRequest) -> list:
    """The ``gptj`` model's inputs for ``request``: its text tokenized once by ``preprocessing``."""

    def tensor(name: str, array) -> grpcclient.InferInput:
        made = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        made.set_data_from_numpy(array)
        return made

    given = request.tensors()
    pre = [
        tensor(stage, given[name])
        for stage, name in ENSEMBLE_TO_PREPROCESSING.items()
        if name in given
    ]
    answer = client.infer(PREPROCESSING_MODEL, pre)
    return [
        tensor(stage, answer.as_numpy(name)) for name, stage in PREPROCESSING_TO_MODEL_STAGE.items()
    ]


def measure(url: str, tokens: int, count: int, warmup: int) -> dict[str, dict]:
    client = grpcclient.InferenceServerClient(url)
    request = CompletionRequest(PROMPT, max_tokens=tokens)  # greedy
    inputs, outputs = request.infer_inputs(grpcclient), requested_outputs(grpcclient)
    ensemble = timed(lambda: client.infer(ENSEMBLE_MODEL, inputs, outputs=outputs), count, warmup)
    firsts: list[float] = []
    made: list[int] = []
    stage = stage_inputs(client, request)
    gptj = timed(lambda: client.infer(MODEL_STAGE, stage), count, warmup)
    times = {"ensemble": ensemble, "gptj": gptj, "stream first piece": firsts}
    with CodegenClient(url, protocol="grpc") as codegen:

        def streamed() -> None:
            started, first = time.perf_counter(), None
            with codegen.open_stream(request) as stream:
                for _ in stream:
                    first = first or time.perf_counter() - started
            firsts.append(first)
            made.append(int((stream.completion and stream.completion.completion_tokens) or 0))

        times["stream last piece"] = timed(streamed, count, warmup)
    del firsts[:warmup]
    times = {name: [s * 1000 for s in seconds] for name, seconds in times.items()}
    summary: dict[str, dict] = {
        name: {
            "median_ms": round(statistics.median(ms), 2),
            "p90_ms": round(statistics.quantiles(ms, n=10)[-1], 2),
            "min_ms": round(min(ms), 2),
        }
        for name, ms in times.items()
    }
    return {**summary, "tokens generated": {"per request": made[-1]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder (any family)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per path")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=8, help="tokens each request generates")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or build_random_gptj(
        CACHE / "gptj-default-shape-random", STDLIB_SHAPE, eos_id=0
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
    raise SystemExit(main())
