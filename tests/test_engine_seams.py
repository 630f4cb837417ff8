"""The torch engine's pieces on their own, without a model: the scheduler's admission rule and
the batch that keeps each row's cache, sampler state, last token and position together.

The engine's behaviour end to end (exactness, seeds, faults, cancellation, beams) is in
test_gptj_engine.py, test_engine_faults.py and test_beam_search.py; these pin the invariants
those rely on, where a slip would otherwise show only as a wrong token much later.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from contract.options import BeamParams, SamplingParams
from engine.batch import Batch, Row
from engine.gptj import GPTJ, GPTJConfig
from engine.interface import GenerationRequest, GenerationResult, Handle, NullListener
from engine.scheduler import EngineConfig, RequestQueue, Scheduler
from engine.torch_engine import TorchEngine
from engine.weights import choose_attention

CONFIG = GPTJConfig(vocab_size=50, n_positions=64, n_embd=8, n_layer=2, n_head=2)


def row(prompt: list[int], new: int = 4, width: int = 1, seed: int | None = None) -> Row:
    request = GenerationRequest(
        prompt, new, sampling=SamplingParams(seed=seed), beam=BeamParams(width=width)
    )
    return Row(request, NullListener(), Handle(), time.perf_counter(), 0, list(prompt), {})


def result() -> GenerationResult:
    return GenerationResult([1], [], [], "length")


# -- the scheduler -----------------------------------------------------------------------------


def scheduler(**limits) -> Scheduler:
    queue: RequestQueue[Row] = RequestQueue(limits.get("max_batch_size", 32))
    return Scheduler(EngineConfig(**limits), CONFIG.n_positions, lambda n: n, queue)


def test_admission_keeps_order_and_stops_at_the_first_that_does_not_fit():
    sched = scheduler(max_batch_size=4)
    first, wide, small = row([1, 2]), row([3], width=3), row([4])
    for entry in (first, wide, small):
        sched.queue.put(entry)
    admitted, cancelled = sched.admit([row([9]), row([9])])  # 2 rows running, 2 free
    assert admitted == [first] and not cancelled
    assert list(sched.queue.waiting) == [wide, small]  # small does not overtake wide


def test_admission_respects_the_prefill_and_cache_budgets():
    sched = scheduler(max_prefill_tokens=10)
    entries = [row([1] * 4), row([1] * 4), row([1] * 4)]  # padded: 4, 8, then 12 > 10
    for entry in entries:
        sched.queue.put(entry)
    assert sched.admit([])[0] == entries[:2]
    budget = scheduler(max_cache_tokens=20)  # capacity_for is the identity here
    fits, waits = row([1] * 6, new=4), row([1] * 6, new=5)  # 2 rows x reach 11 = 22 > 20
    budget.queue.put(fits)
    budget.queue.put(waits)
    assert budget.admit([])[0] == [fits]
    with pytest.raises(Exception, match="budget of 20"):
        budget.check_budget(row([1] * 10, new=11).request)  # 21 positions alone


def test_cancelled_waiting_requests_are_handed_back_not_admitted():
    sched = scheduler()
    gone, kept = row([1]), row([2])
    gone.handle.cancel()
    sched.queue.put(gone)
    sched.queue.put(kept)
    assert sched.admit([]) == ([kept], [gone])


def test_wait_for_room_returns_when_a_request_is_answered_and_when_stopping():
    queue: RequestQueue[Row] = RequestQueue(max_batch_size=2)
    busy = row([1], width=2)
    queue.put(busy)
    waited = threading.Event()
    threading.Thread(target=lambda: (queue.wait_for_room(1), waited.set()), daemon=True).start()
    assert not waited.wait(0.2)  # two rows unanswered: no room for a third, by construction
    queue.answer(busy, result())
    assert waited.wait(10)
    queue.put(row([1], width=2))
    stopped = threading.Event()
    threading.Thread(target=lambda: (queue.wait_for_room(1), stopped.set()), daemon=True).start()
    queue.stop()
    assert stopped.wait(10)
    with pytest.raises(RuntimeError, match="stopped"):
        queue.put(row([1]))


def test_a_failing_finish_hook_is_logged_and_the_rows_are_freed():
    class Broken(NullListener):
        def on_finish(self, result: GenerationResult) -> None:
            raise RuntimeError("sender closed")

    queue: RequestQueue[Row] = RequestQueue(max_batch_size=2)
    entry = row([1])
    entry.listener = Broken()
    queue.put(entry)
    queue.answer(entry, result())
    assert queue.unfinished == 0


@pytest.mark.parametrize("field", ["max_batch_size", "max_prefill_tokens", "max_beam_width"])
def test_the_config_refuses_limits_below_one(field):
    with pytest.raises(ValueError, match=f"{field} must be >= 1"):
        EngineConfig(**{field: 0})


# -- the batch ---------------------------------------------------------------------------------


def marked_batch(rows: list[Row]) -> Batch:
    """A batch holding ``rows``, each row's cache, sampler step count, last token and position
    marked with its index, so that where a row's state went can be read back."""
    batch = Batch(CONFIG, torch.float32, torch.device("cpu"), max_batch_size=8)
    batch.join(rows, time.perf_counter())
    for i in range(len(batch)):
        batch.cache.keys[:, i] = i
        batch.sampler.steps[i] = 100 + i
        batch.last[i] = 10 + i
        batch.position[i] = 20 + i
    return batch


def test_retire_moves_the_last_row_and_all_its_state_into_the_gap():
    a, b, c = row([1, 2], seed=1), row([3], seed=2), row([4, 5, 6], seed=3)
    batch = marked_batch([a, b, c])
    c_key = int(batch.sampler.keys[2])
    batch.retire(b)
    assert batch[0:2] == [a, c] and len(batch) == 2
    assert batch.sampler.rows == 2 and batch.sampler.tokens[1] is c.tokens
    assert int(batch.sampler.keys[1]) == c_key
    assert batch.cache.keys[:, 1, :, : len(c.tokens)].eq(2).all()  # c's cache, moved
    assert (int(batch.last[1]), int(batch.position[1])) == (12, 22)
    assert int(batch.sampler.steps[1]) == 102


def test_a_beam_search_joins_as_its_width_in_rows_and_reorders_together():
    search = row([7, 8], width=3)
    batch = marked_batch([row([1]), search])
    beams = search.group.beams
    assert len(batch) == 4 and batch[1:4] == beams and beams[0] is search
    histories = [([7, 8, 30], [-0.5]), ([7, 8, 31], [-0.7]), ([7, 8, 32], [-0.9])]
    batch.reorder([1, 2, 3], [1, 1, 2], 2, histories)  # beams 0 and 1 continue beam 0
    assert batch.cache.keys[:, 2, :, :2].eq(1).all() and batch.cache.keys[:, 3, :, :2].eq(2).all()
    assert batch.sampler.steps[1:4].tolist() == [101, 101, 102]
    assert [beam.tokens for beam in beams] == [h[0] for h in histories]
    assert all(batch.sampler.tokens[1 + i] is beam.tokens for i, beam in enumerate(beams))


def test_leave_undoes_a_join_and_clear_starts_the_sampler_afresh():
    running = row([1])
    batch = marked_batch([running])
    batch.join([row([2, 3], width=2)], time.perf_counter())
    assert len(batch) == 3 and batch.sampler.rows == 3
    batch.leave(1)
    assert batch[0:9] == [running] and batch.sampler.rows == 1
    assert batch.clear() == [running] and len(batch) == 0 and batch.sampler.rows == 0


def test_the_engine_takes_its_config_whole_or_by_field_never_both():
    model = GPTJ(CONFIG)
    assert TorchEngine(model, max_batch_size=2).settings == EngineConfig(max_batch_size=2)
    whole = TorchEngine(model, EngineConfig(max_batch_size=2, max_cache_tokens=100))
    assert (whole.max_beam_width, whole.max_cache_tokens) == (2, 100)
    assert TorchEngine(model).max_cache_tokens == 32 * CONFIG.n_positions  # rows x context
    with pytest.raises(TypeError, match="not both"):
        TorchEngine(model, EngineConfig(), max_batch_size=2)
    with pytest.raises(TypeError, match="max_batch"):
        TorchEngine(model, max_batch=2)  # a misspelt limit is refused, not ignored


def test_a_model_placed_on_a_gpu_turns_cudnn_attention_off_and_the_cpu_leaves_it():
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        choose_attention(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        choose_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
