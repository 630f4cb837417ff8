"""The openvino backend against transformers and the torch engine: the same interface, the same
contract (greedy token for token, seeds, stop words, end ids, log probs, beams), the same
guarantees (budget, backpressure, cancellation, fault isolation), and clear refusals."""

from __future__ import annotations

import sys
import threading
from dataclasses import replace

import pytest
import torch
from engine_runs import run_concurrently
from transformers import GPTJConfig as HFConfig
from transformers import GPTJForCausalLM

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
from engine.openvino_backend import GIL_SWITCH_S, OpenVINOBackend, PrefixIndex
from engine.openvino_model import (
    ModelShape,
    PrecisionError,
    compile_properties,
    cpu_capabilities,
    export_problem,
    require_export,
)
from modelbuild.openvino_export import ensure_export

VOCAB = 300


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """The random GPT-J of test_gptj_engine.py (same seed and shape), exported to OpenVINO."""
    torch.manual_seed(0)
    config = HFConfig(
        vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPTJForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("openvino-gptj")
    model.save_pretrained(path)
    ensure_export(path)
    return model, path


def backend(path, **kwargs) -> OpenVINOBackend:
    kwargs.setdefault("max_batch_size", 8)
    return OpenVINOBackend(require_export(path), ModelShape.read(path), **kwargs).start()


@pytest.fixture(scope="module")
def engine(hf_model):
    eng = backend(hf_model[1])
    yield eng
    eng.stop()


def prompts(count: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=gen).tolist()
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], new: int, **kwargs) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
        pad_token_id=0, **kwargs,
    )  # fmt: skip
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
    crowd = [GenerationRequest(p, 30, SamplingParams(top_k=5, seed=i)) for i, p in
             enumerate(prompts(5, seed=10))]  # fmt: skip
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
    # what another backend can honour says so (engine/fallback.py runs it there)
    assert isinstance(refused.value, NotHonouredError) == (not honourable)
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


NATIVE, EMULATED = ["BF16", "FP32", "INT8"], ["FP32", "INT8"]  # AVX-512 BF16 / AVX2 CPUs


def test_bfloat16_runs_the_math_and_the_kv_cache_in_bfloat16_where_the_cpu_has_it():
    assert compile_properties("float32", capabilities=EMULATED)["KV_CACHE_PRECISION"] == "f32"
    properties = compile_properties("bfloat16", capabilities=NATIVE)
    assert properties["INFERENCE_PRECISION_HINT"] == properties["KV_CACHE_PRECISION"] == "bf16"


def test_bfloat16_on_a_cpu_without_it_is_refused_at_load_naming_the_setting_and_flag():
    with pytest.raises(PrecisionError, match=r"dtype bfloat16 needs .*avx512_bf16.*float32"):
        compile_properties("bfloat16", capabilities=EMULATED)


def test_this_cpu_serves_bfloat16_or_refuses_it_as_its_capabilities_say(hf_model):
    """Whichever kind of CPU runs the suite, the real backend takes the branch OpenVINO's
    capabilities choose (the other is covered above, by injection): no crash in a request."""
    if "BF16" not in cpu_capabilities():
        with pytest.raises(PrecisionError, match="avx512_bf16"):
            backend(hf_model[1], dtype="bfloat16")
        return
    eng = backend(hf_model[1], dtype="bfloat16")
    try:
        assert len(eng.generate(GenerationRequest(prompts(1)[0], 8)).output_ids) == 8
    finally:
        eng.stop()


# the options of the load test this project was built from, one beam and all
SEED_SAMPLING = SamplingParams(
    top_k=3, top_p=0.92, temperature=0.5, repetition_penalty=1.1, seed=42
)


def teacher_forced_log_probs(hf, prompt, tokens, temperature, penalty) -> list[float]:
    """Each token's log prob under transformers' logits, penalised (tokens seen so far, the
    prompt's included) and divided by the temperature, over the whole vocabulary."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0].double()
    seen, out = set(prompt), []
    for i, token in enumerate(tokens):
        z = logits[len(prompt) - 1 + i]
        mask = torch.zeros_like(z, dtype=torch.bool)
        mask[list(seen)] = True
        z = torch.where(mask, torch.where(z < 0, z * penalty, z / penalty), z) / temperature
        out.append(float(z[token] - torch.logsumexp(z, 0)))
        seen.add(token)
    return out


def test_log_probs_under_temperature_and_penalty_are_the_drawn_distributions(hf_model, engine):
    hf, _ = hf_model
    prompt = prompts(1, seed=4)[0]
    request = GenerationRequest(prompt, 24, sampling=SEED_SAMPLING, return_log_probs=True)
    result = engine.generate(request)
    assert result.finish_reason == "length" and len(result.log_probs) == 24
    expected = teacher_forced_log_probs(hf, prompt, result.output_ids, 0.5, 1.1)
    assert result.log_probs == pytest.approx(expected, abs=1e-3)
    raw = engine.generate(replace(request, return_log_probs=False))
    assert raw.output_ids == result.output_ids  # scoring changes no token


def test_greedy_log_probs_under_a_penalty_equal_the_torch_engines(hf_model, engine):
    reference = TorchEngine(GPTJ.from_checkpoint(hf_model[1]), max_batch_size=2).start()
    try:
        for sampling in (
            SamplingParams(temperature=0.7, repetition_penalty=1.3),
            SamplingParams(repetition_penalty=0.8),
            SamplingParams(temperature=0.0, top_k=1, repetition_penalty=1.2),
        ):
            request = GenerationRequest(prompts(1, seed=6)[0], 16, sampling=sampling)
            expected, got = reference.generate(request), engine.generate(request)
            assert got.output_ids == expected.output_ids
            assert got.log_probs == pytest.approx(expected.log_probs, abs=1e-3)
    finally:
        reference.stop()


def test_a_diversity_rate_without_beams_is_ignored_as_fastertransformer_does(engine):
    request = GenerationRequest(prompts(1, seed=8)[0], 12, sampling=SEED_SAMPLING)
    plain = engine.generate(request)
    rated = engine.generate(replace(request, beam=BeamParams(1, diversity_rate=0.5)))
    assert rated.finish_reason == plain.finish_reason == "length"
    assert rated.output_ids == plain.output_ids


def test_a_stale_or_missing_export_names_what_to_run(hf_model, tmp_path):
    _, path = hf_model
    assert export_problem(path) is None
    assert "no checkpoint" in export_problem(tmp_path / "nothing")
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for file in path.iterdir():
        if file.is_file():
            (copy / file.name).write_bytes(file.read_bytes())
    with pytest.raises(Exception, match="make model"):
        require_export(copy)
    (copy / "openvino").mkdir()
    for file in (path / "openvino").iterdir():
        (copy / "openvino" / file.name).write_bytes(file.read_bytes())
    assert export_problem(copy) is None
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("300", "301"))
    assert "stale" in export_problem(copy)


def test_a_dead_owner_thread_shows_as_not_alive_and_not_stopping(hf_model):
    """What the engine stub watches to exit (backend/engine_stage.py): the thread ended while
    nobody stopped it."""
    eng = backend(hf_model[1], max_batch_size=2)
    real = eng.pipe

    class Dies:
        def __getattr__(self, name):
            return getattr(real, name)

        def step(self):
            raise SystemExit("the owner thread ends")  # not an Exception: escapes the loop

    try:
        eng.pipe = Dies()
        eng.submit(GenerationRequest([1, 2, 3], 10), Collect())
        eng._thread.join(30)
        assert not eng.alive and not eng.stopping
    finally:
        eng.stop()
