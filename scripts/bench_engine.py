"""Engine throughput against transformers' ``generate`` on the same checkpoint, same machine.

    .venv/bin/python scripts/bench_engine.py [--checkpoint DIR] [--batches 1,16,64] [--new 64]

Greedy, 16-token prompts, every sequence generating ``--new`` tokens. Prints generated tokens/s
for both; the engine runs the batch through its continuous-batching loop (all submitted at once).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import torch
from transformers import GPTJForCausalLM

from engine.engine import Engine, GenerationRequest
from engine.gptj import GPTJ

DEFAULT = Path(__file__).resolve().parent.parent / "model_repository/gptj/1/checkpoint"


def engine_rate(engine: Engine, prompts: list[list[int]], new: int) -> float:
    """Tokens/s for all prompts submitted at once; the end token is banned so each makes ``new``."""
    end = [[engine.config.eos_token_id]] if engine.config.eos_token_id is not None else []
    done = threading.Semaphore(0)

    class Done:
        def on_token(self, token_id: int, log_prob: float) -> None:
            pass

        def on_finish(self, result) -> None:
            done.release()

    started = time.perf_counter()
    for prompt in prompts:
        engine.submit(GenerationRequest(prompt, new, bad_words=end), Done())
    for _ in prompts:
        done.acquire()
    return len(prompts) * new / (time.perf_counter() - started)


def transformers_rate(model, prompts: list[list[int]], new: int) -> float:
    ids = torch.tensor(prompts)
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
            attention_mask=torch.ones_like(ids),
        )  # fmt: skip
    return len(prompts) * new / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()

    engine = Engine(GPTJ.from_checkpoint(args.checkpoint), max_batch_size=256).start()
    reference = GPTJForCausalLM.from_pretrained(str(args.checkpoint)).eval()
    vocab = reference.config.vocab_size
    print(
        f"checkpoint {args.checkpoint} ({reference.num_parameters() / 1e6:.1f}M params), "
        f"{torch.get_num_threads()} threads, fp32, greedy, 16-token prompts, {args.new} new"
    )
    print(f"{'batch':>6} {'engine tok/s':>14} {'transformers tok/s':>20}")
    for batch in (int(b) for b in args.batches.split(",")):
        gen = torch.Generator().manual_seed(batch)
        prompts = torch.randint(1, vocab, (batch, 16), generator=gen).tolist()
        engine_rate(engine, prompts[:1], 4)  # warm-up
        ours = engine_rate(engine, prompts, args.new)
        theirs = transformers_rate(reference, prompts, args.new)
        print(f"{batch:>6} {ours:>14,.0f} {theirs:>20,.0f}", flush=True)
    engine.stop()


if __name__ == "__main__":
    main()
