"""The batched sampler on hand-made distributions: what each setting keeps, and row isolation."""

from __future__ import annotations

import math

import pytest
import torch

from contract.options import SamplingParams
from engine.sampling import Sampler, mix32, seed_key, uniforms


def sampler_with(rows: list[SamplingParams], vocab: int, **add) -> Sampler:
    sampler = Sampler(vocab, rows=2)  # small on purpose: adding rows grows it
    for params in rows:
        sampler.add(params, [1, 2], **add)
    return sampler


def draw(params: SamplingParams, probs: list[float], draws: int = 2000) -> set[int]:
    """The tokens ``draws`` differently seeded rows pick from one distribution."""
    rows = [SamplingParams(**{**params.__dict__, "seed": seed}) for seed in range(draws)]
    sampler = sampler_with(rows, len(probs))
    logits = torch.tensor(probs).log().expand(draws, -1).clone()
    chosen, _ = sampler.select(logits, slice(0, draws))
    return set(chosen.tolist())


def test_uniforms_are_the_documented_hash_and_look_uniform():
    keys = torch.tensor([seed_key(s) for s in (0, 1, 2**64 - 1, 123456789)])
    steps = torch.tensor([0, 5, 7, 2**20])
    expected = [
        (mix32(mix32((k + s * 0x9E3779B9) & 0xFFFFFFFF) ^ k) >> 8) / 2**24
        for k, s in zip(keys.tolist(), steps.tolist(), strict=True)
    ]
    assert uniforms(keys, steps).tolist() == expected
    many = uniforms(torch.full((20000,), seed_key(42)), torch.arange(20000))
    assert many.min() >= 0 and many.max() < 1
    assert abs(many.mean().item() - 0.5) < 0.01
    assert torch.histc(many, 10, 0, 1).min() > 1800  # every tenth gets about its share
    neighbours = uniforms(
        torch.tensor([seed_key(s) for s in range(20000)]), torch.zeros(20000, dtype=torch.long)
    )
    assert abs(neighbours.mean().item() - 0.5) < 0.01


def test_nucleus_keeps_exactly_the_smallest_set_reaching_p():
    probs = [0.05, 0.5, 0.1, 0.2, 0.15]
    assert draw(SamplingParams(top_p=0.69), probs) == {1, 3}  # 0.5 + 0.2 reaches 0.69
    assert draw(SamplingParams(top_p=0.71), probs) == {1, 3, 4}  # needs 0.15 more
    assert draw(SamplingParams(top_p=0.5), probs) == {1}  # the top token alone reaches it
    assert draw(SamplingParams(top_p=1.0), probs) == {0, 1, 2, 3, 4}


def test_nucleus_wider_than_the_first_candidates_is_exact():
    vocab = 1000  # a flat-ish distribution: the nucleus holds far more than 256 tokens
    logits = torch.linspace(0.0, -3.0, vocab)
    probs = torch.softmax(logits.double(), -1)
    reach = int((probs.cumsum(-1) < 0.9).sum()) + 1  # smallest prefix reaching 0.9
    picked = draw(SamplingParams(top_p=0.9), probs.float().tolist(), draws=4000)
    assert 256 < max(picked) < reach  # grew past the first candidates, stopped at p


def test_top_k_applies_before_top_p():
    probs = [0.1, 0.4, 0.2, 0.3]
    assert draw(SamplingParams(top_p=0.75), probs) == {1, 3, 2}  # 0.4 + 0.3 < 0.75
    # within the top 3 the shares are 0.44, 0.33, 0.22: the first two reach 0.75
    assert draw(SamplingParams(top_k=3, top_p=0.75), probs) == {1, 3}
    assert draw(SamplingParams(top_k=2, temperature=5.0), probs) == {1, 3}
    assert draw(SamplingParams(top_k=3), probs) == {1, 2, 3}


def test_temperature_zero_and_top_k_one_are_greedy():
    probs = [0.2, 0.3, 0.25, 0.25]
    assert draw(SamplingParams(temperature=0.0, top_k=40, top_p=0.9), probs) == {1}
    assert draw(SamplingParams(top_k=1, temperature=3.0), probs) == {1}


def test_log_probs_are_after_penalty_and_temperature_before_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]] * 2)
    rows = [
        SamplingParams(top_k=2, temperature=0.5, seed=1),
        SamplingParams(top_k=1, temperature=2.0, repetition_penalty=1.5),
    ]
    sampler = sampler_with(rows, 4)  # tokens 1 and 2 are in both rows' "prompt"
    chosen, log_probs = sampler.select(logits.clone(), slice(0, 2))
    expected0 = torch.log_softmax(logits[0] / 0.5, -1)
    penalized = torch.tensor([2.0, 1.0 / 1.5, 0.5 / 1.5, -1.0])
    expected1 = torch.log_softmax(penalized / 2.0, -1)
    assert chosen[1] == 0
    assert log_probs[0].item() == pytest.approx(expected0[chosen[0]].item(), abs=1e-6)
    assert log_probs[1].item() == pytest.approx(expected1[0].item(), abs=1e-6)


def test_a_row_draws_the_same_whatever_its_neighbours():
    torch.manual_seed(0)
    vocab, steps = 500, 12
    logits = torch.randn(steps, vocab) * 3
    target = SamplingParams(top_k=50, top_p=0.8, temperature=0.9, repetition_penalty=1.2, seed=7)

    def run(neighbours: list[SamplingParams]) -> list[int]:
        rows = [*neighbours[:2], target, *neighbours[2:]]
        at = min(2, len(neighbours))
        sampler = Sampler(vocab)
        for params in rows:
            sampler.add(params, [3, 4], bad_words=[[5]] if params is target else [[6, 7]])
        out = []
        for step in range(steps):
            batch = logits[step].expand(len(rows), -1).clone()
            chosen, _ = sampler.select(batch, slice(0, len(rows)))
            sampler.advance(chosen, slice(0, len(rows)))
            out.append(chosen[at].item())
        return out

    alone = run([])
    assert run([SamplingParams()] * 4) == alone
    assert run([SamplingParams(top_p=0.99, seed=i) for i in range(3)]) == alone  # full sort
    assert run([SamplingParams(top_k=400, seed=1), SamplingParams(top_k=3)]) == alone
    assert 5 not in alone


def test_a_row_with_nothing_to_draw_does_not_disturb_the_others():
    vocab = 50
    rows = [
        SamplingParams(top_k=5, seed=1),
        SamplingParams(top_p=0.9, seed=2),
        SamplingParams(),
        SamplingParams(top_k=5, seed=3),
    ]
    torch.manual_seed(1)
    logits = torch.randn(4, vocab)
    sampler = Sampler(vocab)
    for i, params in enumerate(rows):
        bans = [[t] for t in range(vocab)] if i == 1 else []
        sampler.add(params, [1], bad_words=bans)
    chosen, log_probs = sampler.select(logits.clone(), slice(0, 4))
    assert math.isnan(log_probs[1].item())  # the engine fails this row alone
    alone = Sampler(vocab)
    for i in (0, 2, 3):
        alone.add(rows[i], [1])
    expected, expected_lp = alone.select(logits[[0, 2, 3]].clone(), slice(0, 3))
    assert chosen[[0, 2, 3]].tolist() == expected.tolist()
    torch.testing.assert_close(log_probs[[0, 2, 3]], expected_lp)


def test_bad_words_single_and_multi_token():
    vocab = 10
    logits = torch.zeros(1, vocab)
    logits[0, 4] = 5.0
    logits[0, 6] = 4.0
    sampler = Sampler(vocab)
    tokens = [1, 2]
    sampler.add(SamplingParams(), tokens, bad_words=[[4], [9, 6]])
    assert sampler.select(logits.clone(), slice(0, 1))[0].item() == 6
    tokens.append(9)  # the first token of [9, 6] was just generated: 6 is banned now
    assert sampler.select(logits.clone(), slice(0, 1))[0].item() not in (4, 6)


def test_removing_a_row_keeps_the_others_settings():
    vocab = 20
    rows = [SamplingParams(top_k=k, seed=k, repetition_penalty=1.0 + k / 10) for k in (2, 3, 4)]
    sampler = Sampler(vocab)
    for params in rows:
        sampler.add(params, [0])
    sampler.remove(0)  # row 2 moves into row 0
    fresh = Sampler(vocab)
    for params in (rows[2], rows[1]):
        fresh.add(params, [0])
    logits = torch.randn(2, vocab)
    assert sampler.top_k[:2].tolist() == [4, 3]
    moved = sampler.select(logits.clone(), slice(0, 2))
    expected = fresh.select(logits.clone(), slice(0, 2))
    assert moved[0].tolist() == expected[0].tolist()
    torch.testing.assert_close(moved[1], expected[1])
