"""The openvino backend against transformers and the torch engine: the same interface, the same
contract (greedy token for token, seeds, stop words, end ids, log probs, beams), the same
guarantees (budget, backpressure, cancellation, fault isolation), and clear refusals."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from engine_runs import VOCAB, Collect, hf_greedy, prompts, run_concurrently
from openvino_gptj import backend, exported_gptj

from contract.options import BeamParams, InvalidRequestError, SamplingParams
from engine import TorchEngine
from engine.gptj import GPTJ
from engine.interface import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    NotHonouredError,
    NullListener,
)
from engine.openvino_backend import GIL_SWITCH_S, PrefixIndex
from modelbuild.openvino_export import ensure_export


@pytest.fixture(scope="module")
def hf_model():
    return exported_gptj()


@pytest.fixture(scope="module")
def engine(hf_model):
    eng = backend(hf_model[1])
    yield eng
    eng.stop()


def test_both_backends_implement_the_interface(hf_model, engine):
    torch_engine = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=2)
    assert isinstance(torch_engine, GenerationBackend)
    assert isinstance(engine, GenerationBackend)


def test_a_started_backend_lets_waiting_threads_in_between_steps(engine):
    """The pipeline's step holds the GIL: at the default 5 ms switch interval, a server's
    threads waited through whole steps to submit and answer (engine/openvino_backend.py)."""
    assert sys.getswitchinterval() <= GIL_SWITCH_S


def test_greedy_matches_transformers_generate_in_a_mixed_batch(hf_model, engine):
    hf, _ = hf_model
    batch = prompts(8)
    lengths = [3, 40, 17, 1, 25, 9, 33, 12]
    listeners = [Collect() for _ in batch]
    for prompt, new, listener in zip(batch, lengths, listeners, strict=True):
        engine.submit(GenerationRequest(prompt, new), listener)
    for prompt, new, listener in zip(batch, lengths, listeners, strict=True):
        result = listener.wait()
        assert result.finish_reason == "length"
        assert result.output_ids == hf_greedy(hf, prompt, new)
        assert listener.tokens == result.output_ids  # streamed per token, the same tokens


def test_repetition_penalty_matches_transformers(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=5)[0]
    request = GenerationRequest(prompt, 30, SamplingParams(repetition_penalty=1.3))
    request.return_log_probs = False
    result = engine.generate(request)
    assert result.output_ids == hf_greedy(hf, prompt, 30, repetition_penalty=1.3)
    assert result.output_ids != hf_greedy(hf, prompt, 30)


def test_seeded_sampling_does_not_depend_on_batch_neighbours(engine):
    prompt = prompts(1, seed=9)[0]
    seeded = GenerationRequest(prompt, 24, SamplingParams(top_k=20, top_p=0.9, seed=7))
    alone = engine.generate(seeded)
    crowd = [
        GenerationRequest(p, 30, SamplingParams(top_k=5, seed=i))
        for i, p in enumerate(prompts(5, seed=10))
    ]
    mixed = run_concurrently(engine, [*crowd[:2], seeded, *crowd[2:]])
    assert mixed[2].output_ids == alone.output_ids
    other = engine.generate(GenerationRequest(prompt, 24, SamplingParams(top_k=20, seed=8)))
    assert other.output_ids != alone.output_ids


def test_top_k_limits_the_choices_and_log_probs_are_the_models(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=13)[0]
    result = engine.generate(GenerationRequest(prompt, 12, SamplingParams(top_k=3, seed=1)))
    tokens = list(prompt)
    for token, log_prob in zip(result.output_ids, result.log_probs, strict=True):
        log_softmax = torch.log_softmax(hf(torch.tensor([tokens])).logits[0, -1], -1)
        assert token in log_softmax.topk(3).indices.tolist()
        assert log_prob == pytest.approx(log_softmax[token].item(), abs=1e-4)
        tokens.append(token)


def test_stop_words_end_generation_on_tokens(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=17)[0]
    free = hf_greedy(hf, prompt, 30)
    stop = free[5:7]
    listener = Collect()
    engine.submit(GenerationRequest(prompt, 30, stop_words=[[299, 298, 297], stop]), listener)
    stopped = listener.wait()
    assert stopped.finish_reason == "stop_word"
    first = next(i for i in range(len(free) - 1) if free[i : i + 2] == stop)
    assert stopped.output_ids == free[: first + 2] == listener.tokens  # nothing past the word


def test_end_id_stops_and_out_of_vocabulary_end_id_means_the_models_own(hf_model, tmp_path):
    hf, _ = hf_model
    prompt = prompts(1, seed=19)[0]
    free = hf_greedy(hf, prompt, 20)
    hf.config.eos_token_id = free[4]
    try:
        hf.save_pretrained(tmp_path)
    finally:
        hf.config.eos_token_id = 0
    ensure_export(tmp_path)
    eng = backend(tmp_path, max_batch_size=2)
    try:
        for end_id in (50256, VOCAB, None, free[4]):
            result = eng.generate(GenerationRequest(prompt, 20, end_id=end_id))
            assert result.finish_reason == "end_id"
            assert result.output_ids == free[: free.index(free[4])]  # the end token left out
        result = eng.generate(GenerationRequest(prompt, 20, end_id=free[2]))
        assert result.output_ids == free[: free.index(free[2])]
    finally:
        eng.stop()


@pytest.mark.parametrize("len_penalty", [0.0, 1.0])
def test_beam_search_equals_the_torch_engine(hf_model, engine, len_penalty):
    _, path = hf_model
    reference = TorchEngine(GPTJ.from_checkpoint(path), max_batch_size=8).start()
    try:
        for seed in range(3):
            ids = prompts(1, seed=40 + seed)[0]
            request = GenerationRequest(ids, 16, beam=BeamParams(3, len_penalty=len_penalty))
            ours, theirs = engine.generate(request), reference.generate(request)
            assert [b.output_ids for b in ours.beams] == [b.output_ids for b in theirs.beams]
            assert [b.score for b in ours.beams] == pytest.approx(
                [b.score for b in theirs.beams], abs=1e-3
            )
            assert ours.output_ids == ours.beams[0].output_ids
    finally:
        reference.stop()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bad_words": [[5]]}, "bad_words_list is not supported by the openvino backend"),
        ({"bad_words": [[5], [6, 7]], "end_id": 5}, "beyond the end token"),
        ({"beam": BeamParams(2, diversity_rate=-1.0)}, "beam_search_diversity_rate"),
        ({"beam": BeamParams(2), "stop_words": [[5]]}, "stop words with beam_width > 1"),
        ({"beam": BeamParams(2), "sampling": SamplingParams(temperature=0.7)}, "temperature 1"),
        ({"max_new_tokens": 300}, "exceeds the model's context of 256"),
        ({"beam": BeamParams(9)}, "over this server's limit of 8"),
        ({"prompt_ids": [1, 400]}, "outside the vocabulary"),
    ],
)
def test_what_cannot_be_honoured_is_refused_with_what_to_do(engine, changes, message):
    request = GenerationRequest([1, 2, 3], 8)
    for name, value in changes.items():
        setattr(request, name, value)
    with pytest.raises(InvalidRequestError, match=message) as refused:
        engine.submit(request, Collect())
    honourable = {"max_new_tokens", "prompt_ids"} & set(changes) or (
        "beam" in changes and (changes["beam"].width > engine.max_beam_width)
    )
    # what another backend can honour says so (engine/fallback.py runs it there), and how to
    # turn that on (the fallback is opt-in)
    assert isinstance(refused.value, NotHonouredError) == (not honourable)
    assert ('set fallback "torch"' in str(refused.value)) == (not honourable)
    request.return_log_probs = False  # log probs not asked for: temperature is fine
    if "sampling" in changes:
        result = engine.generate(request)
        assert result.finish_reason in ("length", "end_id") and 1 <= len(result.output_ids) <= 8


def test_banning_only_the_end_token_gives_full_length_answers(engine):
    """By construction: the end token is the one the model picks first, so without the ban the
    answer ends at once; banning it (FasterTransformer's bad words) must give all 12 tokens."""
    prompt = prompts(1, seed=7)[0]
    first = engine.generate(GenerationRequest(prompt, 1)).output_ids[0]
    ended = engine.generate(GenerationRequest(prompt, 12, end_id=first))
    assert ended.output_ids == [] and ended.finish_reason != "length"  # the end is not output
    banned = engine.generate(GenerationRequest(prompt, 12, end_id=first, bad_words=[[first]]))
    assert len(banned.output_ids) == 12 and first not in banned.output_ids
    assert banned.finish_reason == "length"


def test_a_cancelled_request_ends_within_one_step(engine):
    seen: list[int] = []
    done = Collect()

    class Cancelling(NullListener):
        def on_token(self, token_id: int, log_prob: float) -> None:
            seen.append(token_id)
            if len(seen) == 3:
                handle.cancel()

        def on_finish(self, result: GenerationResult) -> None:
            done.on_finish(result)

    handle = engine.submit(GenerationRequest(prompts(1)[0], 200), Cancelling())
    result = done.wait()
    assert result.finish_reason == "cancelled" and len(seen) == 3 == len(result.output_ids)
    assert len(engine.generate(GenerationRequest([1, 2, 3], 5)).output_ids) == 5


def test_a_listener_that_raises_fails_its_request_only(hf_model, engine):
    class Broken(Collect):
        def on_token(self, token_id: int, log_prob: float) -> None:
            raise BrokenPipeError("client went away")

    prompt = prompts(1, seed=3)[0]
    broken, healthy = Broken(), Collect()
    engine.submit(GenerationRequest(prompt, 40), healthy)
    engine.submit(GenerationRequest(prompt, 40), broken)
    assert broken.wait().finish_reason == "error" and "client went away" in broken.result.error
    assert healthy.wait().output_ids == hf_greedy(hf_model[0], prompt, 40)
    assert engine.alive


def test_a_failed_step_fails_the_running_requests_and_the_backend_goes_on(hf_model):
    eng = backend(hf_model[1], max_batch_size=2)
    real = eng.pipe

    class FailOnce:
        failed = False

        def __getattr__(self, name):
            return getattr(real, name)

        def step(self):
            if not FailOnce.failed:
                FailOnce.failed = True
                raise RuntimeError("out of memory")
            real.step()

    try:
        eng.pipe = FailOnce()
        failed = eng.generate(GenerationRequest([1, 2, 3], 10))
        assert failed.finish_reason == "error" and "out of memory" in failed.error
        assert eng.alive and eng.generate(GenerationRequest([1, 2, 3], 10)).finish_reason in (
            "length",
            "end_id",
        )
    finally:
        eng.stop()


def test_wait_for_room_holds_requests_until_the_batch_has_space(hf_model):
    small = backend(hf_model[1], max_batch_size=2)
    try:
        first, second = Collect(), Collect()
        small.submit(GenerationRequest([1, 2, 3], 150), first)
        small.submit(GenerationRequest([4, 5, 6], 150), second)
        admitted = threading.Event()

        def third() -> None:
            small.wait_for_room(1)
            admitted.set()

        waiter = threading.Thread(target=third)
        waiter.start()
        waiter.join(60)
        assert admitted.is_set()
        assert first.done.is_set() or second.done.is_set()  # room came from a finished row
        small.wait_for_room(2)
    finally:
        small.stop()


def test_the_cache_budget_refuses_what_can_never_fit_and_runs_what_fits(hf_model):
    hf, path = hf_model
    eng = backend(path, max_cache_tokens=128)
    try:
        with pytest.raises(InvalidRequestError, match=r"budget of 128 .*kv_cache_tokens"):
            eng.submit(GenerationRequest([1, 2, 3], 200), Collect())
        batch = prompts(3, seed=31)
        results = run_concurrently(eng, [GenerationRequest(p, 90 - len(p)) for p in batch])
        for prompt, result in zip(batch, results, strict=True):
            assert result.output_ids == hf_greedy(hf, prompt, 90 - len(prompt))
        assert 0 < eng.cache_bytes <= 128 * 2 * 2 * 64 * 4  # positions x layers x K,V x f32
    finally:
        eng.stop()


def test_prefix_caching_keeps_the_outputs_and_counts_the_reuse(hf_model):
    """An editor's pattern: the same file resent with a few more tokens, and a different one."""
    hf, path = hf_model
    base = prompts(1, seed=50)[0] * 4
    sent = [base[:70], [*base[:70], 7, 8, 9], base[:40] + [11] * 30, base[:70]]
    outputs = {}
    for caching in (True, False):
        eng = backend(path, prefix_caching=caching)
        try:
            outputs[caching] = [eng.generate(GenerationRequest(p, 12)) for p in sent]
        finally:
            eng.stop()
    for on, off, prompt in zip(outputs[True], outputs[False], sent, strict=True):
        assert on.output_ids == off.output_ids == hf_greedy(hf, prompt, 12)
        assert off.reused_prompt_tokens == 0
    assert [r.reused_prompt_tokens for r in outputs[True]] == [0, 64, 32, 64]


def test_the_prefix_index_forgets_the_oldest_blocks_past_its_capacity():
    index = PrefixIndex(blocks=2, block_size=4)
    index.add(list(range(8)))  # two blocks
    assert index.reusable(list(range(9))) == 8
    assert index.reusable(list(range(8))) == 4  # the last prompt token is always computed
    index.add([9, 9, 9, 9])  # a third block: the least recently used one (4..7) goes
    assert index.reusable(list(range(9))) == 4
    assert index.reusable([9, 9, 9, 9, 1]) == 4


def test_the_observer_hears_every_step_and_finish(hf_model):
    class Observer:
        def __init__(self) -> None:
            self.prompt_tokens = self.new_tokens = self.finished = 0

        def on_step(self, rows, new_tokens, prompt_tokens, seconds) -> None:
            self.new_tokens += new_tokens
            self.prompt_tokens += prompt_tokens

        def on_finish(self, result) -> None:
            self.finished += 1

    observer = Observer()
    eng = backend(hf_model[1], observer=observer)
    try:
        batch = prompts(4, seed=60)
        run_concurrently(eng, [GenerationRequest(p, 6) for p in batch])
        assert observer.finished == 4
        assert observer.prompt_tokens == sum(len(p) for p in batch)
        assert observer.new_tokens == 24
        assert eng.running == 0
    finally:
        eng.stop()
    assert not eng.alive and eng.stopping


def test_stop_answers_what_is_still_queued(hf_model):
    eng = backend(hf_model[1], max_batch_size=2)
    listeners = [Collect() for _ in range(3)]
    for listener in listeners:
        eng.submit(GenerationRequest([1, 2, 3], 200), listener)
    eng.stop()
    assert all(listener.wait().finish_reason in ("cancelled", "length") for listener in listeners)
