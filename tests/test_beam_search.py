"""Beam search in the engine: equal to transformers' beam search, per-beam options, batch-proof."""

from __future__ import annotations

import threading

import pytest
import torch
from engine_runs import run_concurrently
from transformers import GPTJConfig as HFConfig
from transformers import GPTJForCausalLM

from contract.options import BeamParams, InvalidRequestError, SamplingParams
from engine import GenerationRequest, GenerationResult, NullListener, TorchEngine
from engine.gptj import GPTJ
from modelbuild.train import BuildConfig

END = 0


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A randomly initialised GPT-J with the default model's architecture."""
    shape = BuildConfig()
    torch.manual_seed(0)
    config = HFConfig(
        vocab_size=shape.vocab_size,
        n_positions=shape.n_positions,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        rotary_dim=shape.rotary_dim,
        bos_token_id=END,
        eos_token_id=END,
    )
    model = GPTJForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("default-shape-gptj")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def engine(hf_model):
    eng = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=32).start()
    yield eng
    eng.stop()


def prompt(seed: int, length: int = 12) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 4096, (length,), generator=gen).tolist()


def hf_beams(model, ids: list[int], new: int, width: int, **kwargs) -> list[list[int]]:
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=new,
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        pad_token_id=END,
        **kwargs,
    )
    return [row[len(ids) :].tolist() for row in out]


def beam_ids(result: GenerationResult) -> list[list[int]]:
    return [beam.output_ids for beam in result.beams]


@pytest.mark.parametrize("width", [2, 4, 8])
def test_beams_equal_transformers_beam_search_with_the_end_token_banned(hf_model, engine, width):
    hf, _ = hf_model
    for seed in range(3):
        ids = prompt(seed, length=5 + 7 * seed)
        result = engine.generate(
            GenerationRequest(ids, 20, bad_words=[[END]], beam=BeamParams(width))
        )
        # banned before normalising, as FasterTransformer does: renormalize_logits
        expected = hf_beams(
            hf, ids, 20, width, length_penalty=0.0, suppress_tokens=[END], renormalize_logits=True
        )
        assert beam_ids(result)[0] == expected[0]  # the best beam, token for token
        assert beam_ids(result) == expected  # and every other, in the same order
        assert result.output_ids == expected[0]
        scores = [beam.score for beam in result.beams]
        assert scores == sorted(scores, reverse=True)
        for beam in result.beams:
            assert beam.finish_reason == "length" and len(beam.output_ids) == 20
            assert beam.cum_log_prob == pytest.approx(sum(beam.log_probs), abs=1e-4)


@pytest.mark.parametrize("len_penalty", [0.0, 1.0, 2.0])
def test_end_token_and_len_penalty_rank_finished_beams_as_transformers(
    hf_model, engine, len_penalty
):
    """With an end token the model often picks, beams finish early and compete by
    cum_log_prob / length ** len_penalty (length counts the end token)."""
    hf, _ = hf_model
    ids = prompt(11, length=10)
    greedy = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=END)[
        0, len(ids) :
    ].tolist()
    end = greedy[3]
    result = engine.generate(
        GenerationRequest(ids, 16, end_id=end, beam=BeamParams(4, len_penalty=len_penalty))
    )
    expected = [
        row[: row.index(end)] if end in row else row
        for row in hf_beams(hf, ids, 16, 4, length_penalty=len_penalty, eos_token_id=end)
    ]
    assert beam_ids(result) == expected
    for beam in result.beams:
        length = len(beam.output_ids) + (beam.finish_reason == "end_id")
        assert beam.score == pytest.approx(beam.cum_log_prob / length**len_penalty, rel=1e-5)
        assert end not in beam.output_ids


def test_beams_do_not_depend_on_their_batch_neighbours(engine):
    request = GenerationRequest(prompt(3), 16, bad_words=[[END]], beam=BeamParams(4))
    alone = engine.generate(request)
    crowd = [
        GenerationRequest(prompt(20 + i, 4 + 5 * i), 8 + 4 * i, SamplingParams(top_k=8, seed=i))
        for i in range(4)
    ]
    other_beams = GenerationRequest(prompt(30), 10, beam=BeamParams(3))
    mixed = run_concurrently(engine, [crowd[0], other_beams, crowd[1], request, *crowd[2:]])
    assert beam_ids(mixed[3]) == beam_ids(alone)
    assert [b.cum_log_prob for b in mixed[3].beams] == pytest.approx(
        [b.cum_log_prob for b in alone.beams], abs=1e-4
    )


def test_a_beam_search_beside_sampled_requests_leaves_them_unchanged(engine):
    sampled = [
        GenerationRequest(prompt(40 + i, 6 + 3 * i), 24, SamplingParams(top_k=20, seed=100 + i))
        for i in range(3)
    ]
    alone = run_concurrently(engine, sampled)
    beams = GenerationRequest(prompt(50, 30), 30, beam=BeamParams(8))
    mixed = run_concurrently(engine, [sampled[0], beams, sampled[1], sampled[2]])
    assert [r.output_ids for r in (mixed[0], mixed[2], mixed[3])] == [r.output_ids for r in alone]
    assert len(mixed[1].beams) == 8
    assert engine.running == 0


def test_stop_and_bad_words_hold_per_beam(engine):
    ids = prompt(5)
    free = engine.generate(GenerationRequest(ids, 12, bad_words=[[END]], beam=BeamParams(4)))
    stop = free.beams[0].output_ids[3]  # a token the best beam generates
    banned = free.beams[1].output_ids[2]
    result = engine.generate(
        GenerationRequest(
            ids, 12, stop_words=[[stop]], bad_words=[[END], [banned]], beam=BeamParams(4)
        )
    )
    assert any(beam.finish_reason == "stop_word" for beam in result.beams)
    for beam in result.beams:
        assert banned not in beam.output_ids
        if beam.finish_reason == "stop_word":
            assert beam.output_ids[-1] == stop and stop not in beam.output_ids[:-1]
        else:
            assert stop not in beam.output_ids and len(beam.output_ids) == 12


def test_repetition_penalty_and_output_length_hold_per_beam(engine, hf_model):
    """Each beam is penalised for its own history: its log-probs are those of the model with
    the penalty over the prompt and that beam's tokens, step by step."""
    hf, _ = hf_model
    ids = list(range(1, 20))
    penalty = 3.0
    result = engine.generate(
        GenerationRequest(
            ids,
            16,
            SamplingParams(repetition_penalty=penalty),
            bad_words=[[END]],
            beam=BeamParams(4),
        )
    )
    for beam in result.beams:
        assert len(beam.output_ids) == 16
        with torch.no_grad():
            logits = hf(torch.tensor([ids + beam.output_ids])).logits[0, len(ids) - 1 : -1]
        for step, token in enumerate(beam.output_ids):
            row = logits[step].clone()
            seen = torch.tensor(sorted(set(ids + beam.output_ids[:step])))
            row[seen] = torch.where(row[seen] < 0, row[seen] * penalty, row[seen] / penalty)
            row[END] = float("-inf")
            expected = torch.log_softmax(row, dim=-1)[token].item()
            assert beam.log_probs[step] == pytest.approx(expected, abs=2e-3)


def test_a_strong_negative_diversity_rate_keeps_one_beam_per_first_token(engine, hf_model):
    """Each parent's 2nd, 3rd... continuation is penalised by rate x rank, so with a huge
    rate every beam keeps only its own best continuation: greedy after its first token."""
    hf, _ = hf_model
    ids = prompt(8)
    result = engine.generate(
        GenerationRequest(ids, 6, bad_words=[[END]], beam=BeamParams(3, diversity_rate=-1e4))
    )
    firsts = {beam.output_ids[0] for beam in result.beams}
    assert len(firsts) == 3
    for beam in result.beams:
        start = torch.tensor([ids + beam.output_ids[:1]])
        greedy = hf.generate(
            start, max_new_tokens=5, do_sample=False, pad_token_id=END, suppress_tokens=[END]
        )[0, len(ids) + 1 :].tolist()
        assert beam.output_ids[1:] == greedy
        # the diversity term chooses beams; it is not in the log-probs they report
        assert beam.cum_log_prob == pytest.approx(sum(beam.log_probs), abs=1e-4)


def test_width_over_the_limit_or_the_cache_budget_is_refused(hf_model):
    model = GPTJ.from_checkpoint(hf_model[1])
    eng = TorchEngine(model, max_batch_size=16, max_beam_width=4, max_cache_tokens=1024)
    with pytest.raises(InvalidRequestError, match=r"beam_width=5 is over this server's limit of 4"):
        eng.validate(GenerationRequest([1, 2], 8, beam=BeamParams(5)))
    with pytest.raises(InvalidRequestError, match=r"x 4 beams needs 2048 positions of KV cache"):
        eng.validate(GenerationRequest([1] * 200, 200, beam=BeamParams(4)))
    eng.validate(GenerationRequest([1, 2], 8, beam=BeamParams(4)))
    narrow = TorchEngine(model, max_batch_size=2)
    assert narrow.max_beam_width == 2  # never wider than the batch


def test_a_cancelled_beam_search_frees_its_rows(engine):
    started = threading.Event()
    done = threading.Event()
    box: list[GenerationResult] = []

    class Watch(NullListener):
        def on_token(self, token_id: int, log_prob: float) -> None:
            started.set()

        def on_finish(self, result: GenerationResult) -> None:
            box.append(result)
            done.set()

    request = GenerationRequest(prompt(9), 500, beam=BeamParams(6))
    handle = engine.submit(request, Watch())
    assert started.wait(30)
    handle.cancel()
    assert done.wait(30)
    assert box[0].finish_reason == "cancelled"
    assert engine.running == 0
    after = engine.generate(GenerationRequest(prompt(10), 4, beam=BeamParams(2)))
    assert len(after.beams) == 2
