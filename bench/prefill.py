"""What the prefill chunk (``engine_max_prefill_tokens``) does to an editor's long prompts, one
server per setting, one after the other in one run, on the default model (openvino):

    python -m bench.prefill                    # chunks 4096 (a prompt in one pass) and 256
    python -m bench.prefill --chunks 4096,512,256 --repeats 5

Three figures each: a cold prompt of ``--prompt`` tokens alone, to its first token (what a
chunk costs in prefill speed); the longest gap between two pieces of a running stream while
cold prompts arrive (what a prefill stalls the others for); and the first token of a short
request sent just after a cold prompt twice as long was left 50 ms into its prefill (what a
prompt nobody waits for still costs the next one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from bench.format import machine, machine_label
from bench.load import running_server
from bench.models import DEFAULT_CHECKPOINT
from client.request import CompletionRequest, requested_outputs
from contract.corpus import held_out_files
from contract.tensors import ENGINE_MODEL


class Prompts:
    """Cold prompts: held-out source from a random place, with a unique first line (no prefix
    cache hit)."""

    def __init__(self, checkpoint: Path, seed: int = 0) -> None:
        self.tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self.text = "\n".join(path.read_text(errors="replace") for path in held_out_files())
        self.rng, self.count = random.Random(seed), 0

    def cold(self, tokens: int) -> str:
        self.count += 1
        start = self.rng.randrange(0, len(self.text) - tokens * 8)
        ids = self.tokenizer.encode(self.text[start : start + tokens * 8]).ids[:tokens]
        return f"# cold prompt {self.count}\n" + self.tokenizer.decode(ids)


class Stream:
    """One request on a gRPC stream of its own, and when each of its responses came."""

    def __init__(self, url: str, prompt: str, tokens: int) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))
        request = CompletionRequest((prompt,), max_tokens=tokens, temperature=0.0)
        self.sent = time.perf_counter()
        self.client.async_stream_infer(
            ENGINE_MODEL,
            request.infer_inputs(grpcclient),
            outputs=requested_outputs(grpcclient),
            enable_empty_final_response=True,
        )

    def times(self) -> list[float]:
        """Seconds from sending to each response, to the final one; then the stream closes."""
        times = []
        while True:
            result, error = self.answers.get(timeout=600)
            if error is not None:
                raise RuntimeError(f"the stream failed: {error}")
            times.append(time.perf_counter() - self.sent)
            if result.get_response().parameters["triton_final_response"].bool_param:
                self.close()
                return times

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def measure(url: str, prompts: Prompts, tokens: int, repeats: int) -> dict[str, float]:
    Stream(url, prompts.cold(tokens), 1).times()  # warm-up
    cold = [Stream(url, prompts.cold(tokens), 1).times()[0] for _ in range(repeats)]
    running = Stream(url, prompts.cold(20), 200)

    def arrivals() -> None:
        for _ in range(repeats):
            time.sleep(0.5)
            Stream(url, prompts.cold(tokens), 1).times()

    beside = threading.Thread(target=arrivals)
    beside.start()
    pieces = running.times()
    beside.join()
    after_left = []
    for _ in range(repeats):
        left = Stream(url, prompts.cold(2 * tokens), 64)
        time.sleep(0.05)
        left.close(cancel=True)
        after_left.append(Stream(url, prompts.cold(20), 1).times()[0])
        time.sleep(1.0)
    return {
        "cold prompt, first token (ms)": statistics.median(cold) * 1000,
        "longest gap of a stream beside cold prompts (ms)": max(
            b - a for a, b in itertools.pairwise(pieces)
        )
        * 1000,
        "short request after a left prompt, first token (ms)": statistics.median(after_left) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--chunks", default="4096,256", help="engine_max_prefill_tokens settings")
    parser.add_argument("--prompt", type=int, default=1000, help="tokens of a cold prompt")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    chunks = [int(chunk) for chunk in args.chunks.split(",")]
    prompts, results = Prompts(args.checkpoint), {}
    for chunk in chunks:
        with tempfile.TemporaryDirectory(prefix="bench-prefill-") as tmp:
            log = Path(tmp) / "tritonserver.log"
            parameters = {"engine_max_prefill_tokens": str(chunk)}
            with running_server(
                args.checkpoint, Path(tmp), log, "cpu", "openvino", parameters
            ) as s:
                results[chunk] = measure(s.grpc_url, prompts, args.prompt, args.repeats)
        print(f"chunk {chunk}: " + ", ".join(f"{k} {v:.0f}" for k, v in results[chunk].items()))
    first = chunks[0]
    made = args.checkpoint / "pretrained.json"  # make model's record of what it installed
    model = json.loads(made.read_text()).get("name") if made.exists() else args.checkpoint.name
    print(f"{machine_label(machine('cpu'))}; {model}; openvino as configured otherwise")
    for name in results[first]:
        figures = [(chunk, results[chunk][name]) for chunk in chunks]
        row = "  ".join(f"{c}: {v:7.0f} ({v / results[first][name]:.2f}x)" for c, v in figures)
        print(f"  {name:52s} {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
