"""The engine against transformers' GPT-J: same logits, same greedy tokens, batch-independent."""

from __future__ import annotations

import threading

import pytest
import torch
from engine_runs import VOCAB, hf_greedy, prompts, random_gptj, run_concurrently

from contract.options import InvalidRequestError, SamplingParams
from engine import GenerationRequest, GenerationResult, NullListener, TorchEngine
from engine.gptj import GPTJ, KVCache, split_long_rows
from engine.threads import in_passing_thread


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    model = random_gptj()
    path = tmp_path_factory.mktemp("random-gptj")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def engine(hf_model):
    eng = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=8).start()
    yield eng
    eng.stop()


def test_logits_match_transformers_for_prefill_and_decode(hf_model):
    hf, path = hf_model
    model = GPTJ.from_checkpoint(path)
    ids = torch.randint(0, VOCAB, (3, 12))
    lengths = torch.tensor([12, 7, 3])
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(3, 16)
    with torch.inference_mode():
        logits = model(ids, torch.zeros(3, dtype=torch.long), lengths - 1, cache, slice(0, 3))
        step = model(
            torch.tensor([[5], [6], [7]]),
            lengths,
            torch.zeros(3, dtype=torch.long),
            cache,
            slice(0, 3),
        )
        for row in range(3):
            prefix = ids[row, : lengths[row]]
            expected = hf(prefix[None]).logits[0, -1]
            torch.testing.assert_close(logits[row], expected, atol=1e-5, rtol=1e-5)
            extended = torch.cat([prefix, torch.tensor([5 + row])])[None]
            torch.testing.assert_close(step[row], hf(extended).logits[0, -1], atol=1e-5, rtol=1e-5)


def test_decode_attends_long_rows_alone_and_matches_transformers(hf_model):
    """Rows of very different lengths: the longest are attended on their own, same logits."""
    hf, path = hf_model
    model = GPTJ.from_checkpoint(path)
    lengths = [3, 150, 5, 2, 90, 4]
    assert split_long_rows([n + 1 for n in lengths])[1]  # this batch does take rows out
    ids = torch.randint(0, VOCAB, (len(lengths), max(lengths)))
    cache = KVCache.empty(model.config, torch.float32)
    cache.reserve(len(lengths), max(lengths) + 1)
    rows = slice(0, len(lengths))
    zeros = torch.zeros(len(lengths), dtype=torch.long)
    with torch.inference_mode():
        model(ids, zeros, torch.tensor(lengths) - 1, cache, rows)
        step = model(torch.full((len(lengths), 1), 7), torch.tensor(lengths), zeros, cache, rows)
        for row, n in enumerate(lengths):
            extended = torch.cat([ids[row, :n], torch.tensor([7])])[None]
            torch.testing.assert_close(step[row], hf(extended).logits[0, -1], atol=1e-5, rtol=1e-5)


def test_greedy_matches_transformers_generate_in_a_mixed_batch(hf_model, engine):
    hf, _ = hf_model
    batch = prompts(8)
    lengths = [3, 40, 17, 1, 25, 9, 33, 12]
    results = run_concurrently(
        engine, [GenerationRequest(p, n) for p, n in zip(batch, lengths, strict=True)]
    )
    for prompt, new, result in zip(batch, lengths, results, strict=True):
        assert result.finish_reason == "length"
        assert len(result.output_ids) == new
        assert result.output_ids == hf_greedy(hf, prompt, new)


def test_repetition_penalty_matches_transformers(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=5)[0]
    result = engine.generate(GenerationRequest(prompt, 30, SamplingParams(repetition_penalty=1.3)))
    assert result.output_ids == hf_greedy(hf, prompt, 30, repetition_penalty=1.3)
    assert result.output_ids != hf_greedy(hf, prompt, 30)


def test_seeded_sampling_does_not_depend_on_batch_neighbours(engine):
    prompt = prompts(1, seed=9)[0]
    params = SamplingParams(top_k=20, top_p=0.9, temperature=0.9, seed=1234)
    alone = engine.generate(GenerationRequest(prompt, 24, params))
    crowd = [
        GenerationRequest(p, 30, SamplingParams(top_k=5, seed=i))
        for i, p in enumerate(prompts(6, seed=3))
    ]
    mixed = run_concurrently(
        engine, [*crowd[:3], GenerationRequest(prompt, 24, params), *crowd[3:]]
    )
    assert mixed[3].output_ids == alone.output_ids
    other_seed = engine.generate(
        GenerationRequest(prompt, 24, SamplingParams(top_k=20, top_p=0.9, temperature=0.9, seed=7))
    )
    assert other_seed.output_ids != alone.output_ids


def test_top_k_one_is_greedy_and_top_k_limits_choices(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=11)[0]
    top1 = engine.generate(GenerationRequest(prompt, 20, SamplingParams(top_k=1, seed=3)))
    assert top1.output_ids == hf_greedy(hf, prompt, 20)
    # with top_k=2 every sampled token is one of the two most likely at its step
    result = engine.generate(
        GenerationRequest(prompt, 20, SamplingParams(top_k=2, temperature=5.0, seed=3))
    )
    tokens = list(prompt)
    for token in result.output_ids:
        logits = hf(torch.tensor([tokens])).logits[0, -1]
        assert token in torch.topk(logits, 2).indices.tolist()
        tokens.append(token)


def test_log_probs_are_the_models_and_sum(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=13)[0]
    result = engine.generate(GenerationRequest(prompt, 10))
    tokens = list(prompt)
    for token, log_prob in zip(result.output_ids, result.log_probs, strict=True):
        expected = torch.log_softmax(hf(torch.tensor([tokens])).logits[0, -1], -1)[token]
        assert log_prob == pytest.approx(expected.item(), abs=1e-4)
        tokens.append(token)


def test_stop_words_end_generation_and_bad_words_are_never_produced(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=17)[0]
    free = hf_greedy(hf, prompt, 30)
    stop = free[5:7]
    stopped = engine.generate(GenerationRequest(prompt, 30, stop_words=[stop]))
    assert stopped.finish_reason == "stop_word"
    first = next(i for i in range(len(free) - 1) if free[i : i + 2] == stop)
    assert stopped.output_ids == free[: first + 2]

    banned = sorted(set(free))[:3]
    clean = engine.generate(GenerationRequest(prompt, 30, bad_words=[[t] for t in banned]))
    assert len(clean.output_ids) == 30 and not set(clean.output_ids) & set(banned)
    # a two-token bad word: its second token is banned only right after its first
    pair = free[2:4]
    avoided = engine.generate(GenerationRequest(prompt, 30, bad_words=[pair]))
    assert all(avoided.output_ids[i : i + 2] != pair for i in range(29))


def test_end_id_stops_and_out_of_vocabulary_end_id_falls_back(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=19)[0]
    free = hf_greedy(hf, prompt, 20)
    ended = engine.generate(GenerationRequest(prompt, 20, end_id=free[4]))
    assert ended.finish_reason == "end_id"
    assert ended.output_ids == free[: free.index(free[4])]
    gpt2_eos = engine.generate(GenerationRequest(prompt, 20, end_id=50256))
    assert gpt2_eos.finish_reason in ("length", "end_id")
    assert gpt2_eos.output_ids == free[: len(gpt2_eos.output_ids)]


def test_out_of_vocabulary_end_id_ends_at_the_models_own_end_token(hf_model, tmp_path):
    """A model whose end token is the 5th greedy token: an unknown end_id must stop there."""
    hf, _ = hf_model
    prompt = prompts(1, seed=19)[0]
    free = hf_greedy(hf, prompt, 20)
    hf.config.eos_token_id = free[4]
    try:
        hf.save_pretrained(tmp_path)
    finally:
        hf.config.eos_token_id = 0
    eng = TorchEngine(GPTJ.from_checkpoint(tmp_path), max_batch_size=2).start()
    try:
        for end_id in (50256, VOCAB, None):
            result = eng.generate(GenerationRequest(prompt, 20, end_id=end_id))
            assert result.finish_reason == "end_id"
            assert result.output_ids == free[: free.index(free[4])]
    finally:
        eng.stop()


def test_temperature_zero_is_greedy_and_log_probs_follow_temperature(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=23)[0]
    cold = engine.generate(
        GenerationRequest(prompt, 12, SamplingParams(temperature=0.0, top_k=40, top_p=0.9))
    )
    assert cold.output_ids == hf_greedy(hf, prompt, 12)
    hot = engine.generate(
        GenerationRequest(prompt, 12, SamplingParams(top_k=5, temperature=2.0, seed=4))
    )
    tokens = list(prompt)
    for token, log_prob in zip(hot.output_ids, hot.log_probs, strict=True):
        logits = hf(torch.tensor([tokens])).logits[0, -1]
        expected = torch.log_softmax(logits / 2.0, -1)[token]  # before the top-k truncation
        assert log_prob == pytest.approx(expected.item(), abs=1e-4)
        tokens.append(token)


def test_a_request_with_nothing_to_generate_fails_alone(hf_model, engine):
    hf, _ = hf_model
    batch = prompts(4, seed=29)
    everything = [[t] for t in range(VOCAB)]
    requests = [GenerationRequest(p, 10) for p in batch]
    requests[1] = GenerationRequest(batch[1], 10, SamplingParams(top_k=3), bad_words=everything)
    results = run_concurrently(engine, requests)
    assert results[1].finish_reason == "error" and "bans every token" in results[1].error
    for i in (0, 2, 3):
        assert results[i].output_ids == hf_greedy(hf, batch[i], 10)


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"prompt_ids": [], "max_new_tokens": 4}, "prompt is empty"),
        ({"prompt_ids": [1, 2], "max_new_tokens": 0}, "request_output_len must be >= 1"),
        ({"prompt_ids": [1] * 250, "max_new_tokens": 10}, "exceeds the model's context of 256"),
        ({"prompt_ids": [VOCAB + 5], "max_new_tokens": 2}, "outside the vocabulary"),
    ],
)
def test_invalid_requests_are_refused_with_the_reason(engine, request_kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.submit(GenerationRequest(**request_kwargs), listener=None)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_p": 1.5}, "runtime_top_p must be in"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"top_k": -1}, "runtime_top_k must be >= 0"),
    ],
)
def test_invalid_sampling_options_name_the_option(params, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**params)


def test_cancelled_request_finishes_without_running_to_the_end(engine):
    done = threading.Event()
    seen: list[int] = []
    results: list[GenerationResult] = []

    class Listener:
        def on_token(self, token_id: int, log_prob: float) -> None:
            seen.append(token_id)
            if len(seen) == 3:
                handle.cancel()

        def on_finish(self, result: GenerationResult) -> None:
            results.append(result)
            done.set()

    handle = engine.submit(GenerationRequest(prompts(1)[0], 200), Listener())
    assert done.wait(30)
    assert results[0].finish_reason == "cancelled"
    assert len(results[0].output_ids) < 200
    # and the engine keeps serving
    assert len(engine.generate(GenerationRequest([1, 2, 3], 5)).output_ids) == 5


def test_wait_for_room_holds_requests_until_the_batch_has_space(hf_model):
    """Backpressure: what the engine cannot start yet waits outside it (in Triton's queue)."""
    small = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=2).start()
    try:
        finished = threading.Event()

        class Listener(NullListener):
            def on_finish(self, result: GenerationResult) -> None:
                finished.set()

        small.submit(GenerationRequest([1, 2, 3], 150), Listener())
        small.submit(GenerationRequest([4, 5, 6], 150), Listener())
        admitted = threading.Event()

        def third() -> None:
            small.wait_for_room(1)
            admitted.set()

        waiter = threading.Thread(target=third)
        waiter.start()
        assert not admitted.wait(0.05) or finished.is_set()
        waiter.join(60)
        assert admitted.is_set() and finished.is_set()
        small.wait_for_room(2)  # an idle engine always has room
    finally:
        small.stop()


@pytest.mark.parametrize("variant", [{"dtype": torch.bfloat16}, {"quantize": "int8"}])
def test_bfloat16_and_int8_agree_with_float32_greedily(hf_model, engine, variant):
    """Cheaper weights, same first tokens: a broken variant would agree about 1 time in 300."""
    lower = TorchEngine(GPTJ.from_checkpoint(hf_model[1], **variant), max_batch_size=8).start()
    try:
        batch = [GenerationRequest(p, 4) for p in prompts(6, seed=31)]
        expected = run_concurrently(engine, batch)
        got = run_concurrently(lower, batch)
    finally:
        lower.stop()
    same = [g.output_ids[:3] == e.output_ids[:3] for g, e in zip(got, expected, strict=True)]
    assert sum(same) >= 5
    for g, e in zip(got, expected, strict=True):
        assert g.log_probs[0] == pytest.approx(e.log_probs[0], abs=0.05)


def test_work_in_a_passing_thread_returns_or_raises_and_its_thread_ends():
    seen = []

    def work():
        seen.append(threading.current_thread())
        return torch.ones(3).sum().item()

    assert in_passing_thread(work) == 3.0
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    with pytest.raises(FileNotFoundError, match="make model"):
        in_passing_thread(lambda: GPTJ.from_checkpoint("/nonexistent"))
