"""The engine keeps serving whatever one request does: a failing listener, a failed prefill, a
request too big for the KV-cache budget; and it gives the cache's memory back when idle."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from engine_runs import Collect, random_gptj

from contract.options import InvalidRequestError
from engine import GenerationRequest, GenerationResult, NullListener, TorchEngine
from engine.gptj import GPTJ, KVCache

VOCAB = 300
BAN_END = [[0]]  # the end token: every request runs to its length


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults-gptj")
    random_gptj().save_pretrained(path)
    return path


@pytest.fixture
def engine(checkpoint):
    eng = TorchEngine(GPTJ.from_checkpoint(checkpoint), max_batch_size=8).start()
    yield eng
    eng.stop()


def request(new: int = 24, prompt: list[int] | None = None) -> GenerationRequest:
    return GenerationRequest(prompt or [5, 6, 7], new, bad_words=BAN_END)


def wait_idle(engine: TorchEngine, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (engine.running or engine.cache_bytes) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_listener_that_raises_fails_its_request_only(engine):
    class Broken(Collect):
        def on_token(self, token_id: int, log_prob: float) -> None:
            raise BrokenPipeError("client went away")

    broken, healthy = Broken(), Collect()
    engine.submit(request(40), healthy)
    engine.submit(request(40), broken)
    assert broken.wait().finish_reason == "error"
    assert "client went away" in broken.result.error
    assert healthy.wait().finish_reason == "length" and len(healthy.result.output_ids) == 40
    assert engine.alive


def test_a_listener_that_raises_on_finish_does_not_stop_the_engine(engine):
    class Broken(NullListener):
        def on_finish(self, result: GenerationResult) -> None:
            raise RuntimeError("sender closed")

    engine.submit(request(4), Broken())
    assert engine.generate(request(4)).finish_reason == "length"
    assert engine.alive


def test_a_failed_prefill_answers_its_requests_and_frees_their_room(engine, monkeypatch):
    running = Collect()
    engine.submit(request(120), running)
    while not engine.running:
        time.sleep(0.001)
    step = engine.model.step

    def out_of_memory(segments, cache):
        prompts = [seg.tokens for seg in segments if seg.tokens.shape[1] > 1]
        if any(299 in tokens[:, 0].tolist() for tokens in prompts):  # the poisoned prefill
            raise RuntimeError("out of memory (simulated)")
        return step(segments, cache)

    monkeypatch.setattr(engine.model, "step", out_of_memory)
    failed = engine.generate(request(8, prompt=[299, 1, 2]))
    assert failed.finish_reason == "error" and "prefill failed" in failed.error
    assert "out of memory (simulated)" in failed.error
    assert running.wait().finish_reason == "length"  # the running request never noticed
    assert len(running.result.output_ids) == 120
    wait_idle(engine)
    waited = threading.Event()  # the room came back: a full-width wait returns at once
    threading.Thread(target=lambda: (engine.wait_for_room(8), waited.set()), daemon=True).start()
    assert waited.wait(5)


def test_the_cache_budget_refuses_what_can_never_fit_and_queues_what_fits_later(checkpoint):
    budget = 128
    engine = TorchEngine(
        GPTJ.from_checkpoint(checkpoint), max_batch_size=8, max_cache_tokens=budget
    )
    engine.start()
    try:
        with pytest.raises(InvalidRequestError, match=r"budget of 128 .*kv_cache_tokens"):
            engine.submit(request(200), Collect())
        peak = []
        first, second = Collect(), Collect()
        engine.submit(request(90), first)  # reaches 93 positions: 128 allocated
        engine.submit(request(90), second)  # two rows would need 256: waits for the first
        while not second.done.is_set():
            peak.append(engine.cache.rows * engine.cache.capacity)
            time.sleep(0.002)
        assert first.wait().finish_reason == second.wait().finish_reason == "length"
        assert max(peak) <= budget
        assert second.result.queue_seconds > 0.5 * first.result.total_seconds
    finally:
        engine.stop()


def test_the_cache_is_released_when_the_engine_goes_idle(engine):
    engine.generate(request(30))
    wait_idle(engine)
    assert engine.cache_bytes == 0
    assert engine.generate(request(30)).finish_reason == "length"  # and grows again on demand


def test_a_reallocation_keeps_the_running_rows(checkpoint):
    model = GPTJ.from_checkpoint(checkpoint)
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(2, 10)
    cache.keys[:, :2, :, :10] = 1.0
    cache.reserve(3, 100)  # grows both ways
    assert cache.rows == 3 and cache.capacity == 128
    assert bool((cache.keys[:, :2, :, :10] == 1.0).all())
    cache.reserve(1, 300)  # longer: sized to exactly one row
    assert cache.rows == 1 and cache.capacity == 512
    assert bool((cache.keys[:, :1, :, :10] == 1.0).all())
