"""What the engine tests share: random prompts over the tiny models' 300-token vocabulary,
transformers' greedy answer, a listener that waits, and several requests run at once, as
concurrent clients would."""

from __future__ import annotations

import threading

import torch
from transformers import GPTJConfig, GPTJForCausalLM

from engine import GenerationRequest, GenerationResult, TorchEngine
from engine.interface import NullListener

VOCAB = 300  # the tiny GPT-J of the engine tests


def random_gptj() -> GPTJForCausalLM:
    """The engine tests' tiny random GPT-J (seed 0: the same weights every time)."""
    torch.manual_seed(0)
    config = GPTJConfig(
        vocab_size=VOCAB,
        n_positions=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPTJForCausalLM(config).eval()


def run_concurrently(
    engine: TorchEngine, requests: list[GenerationRequest]
) -> list[GenerationResult]:
    """Submit every request from its own thread; the results in the requests' order."""
    results: list[GenerationResult | None] = [None] * len(requests)

    def one(i: int) -> None:
        results[i] = engine.generate(requests[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def prompts(count: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=gen).tolist()
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], new: int, **kwargs) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


class Collect(NullListener):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.tokens: list[int] = []
        self.result: GenerationResult | None = None

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.tokens.append(token_id)

    def on_finish(self, result: GenerationResult) -> None:
        self.result = result
        self.done.set()

    def wait(self) -> GenerationResult:
        assert self.done.wait(60), "no answer within 60 s"
        return self.result
