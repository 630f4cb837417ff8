"""The torch fallback of the openvino backend (engine/fallback.py): what the pipeline cannot
honour is answered by the torch engine, exactly as a torch engine alone answers it, and counted by
reason; everything else stays on the pipeline, which never loads the torch engine for it; with
``fallback none`` the refusals are the backend's own. Then once through a real server."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch
from engine_hold import wait_for
from engine_runs import VOCAB
from openvino_gptj import exported_gptj
from server_metrics import scrape

from client.client import CodegenClient
from contract import metrics as names
from contract.options import BeamParams, InvalidRequestError, SamplingParams
from contract.tensors import ENGINE_MODEL
from engine.fallback import FALLBACK_MAX_BATCH_SIZE, FallbackBackend, with_fallback
from engine.gptj import GPTJ
from engine.interface import GenerationBackend, GenerationRequest, GenerationResult, generate
from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import ModelShape, require_export
from engine.torch_engine import TorchEngine

PROMPT = "def add(a, b):\n"
BAD_WORDS = "bad_words_list is not supported by the openvino backend"


@pytest.fixture(scope="module")
def hf_model():
    """The random GPT-J of test_openvino_backend.py, exported (built once per session)."""
    return exported_gptj()[1]


class Recorder:
    """The stage's metrics as the engines see them: steps, answers and fallbacks, by thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.step_threads: set[str] = set()
        self.reasons: list[str] = []

    def on_step(self, rows: int, new_tokens: int, prompt_tokens: int, seconds: float) -> None:
        with self.lock:
            self.step_threads.add(threading.current_thread().name)

    def on_finish(self, result: GenerationResult) -> None:
        pass

    def on_fallback(self, reason: str) -> None:
        with self.lock:
            self.reasons.append(reason)


def limits(observer: Recorder) -> dict:
    """The engine stage's limits (backend/engine_stage.py, ``start_engine``)."""
    return {
        "max_batch_size": 16,
        "max_prefill_tokens": 4096,
        "max_cache_tokens": None,
        "max_beam_width": 8,
        "observer": observer,
    }


def served(path, setting: str = "torch") -> tuple[GenerationBackend, Recorder, str]:
    """The openvino backend wrapped as the engine stage wraps it, and started."""
    recorder = Recorder()
    primary = OpenVINOBackend(require_export(path), ModelShape.read(path), **limits(recorder))
    engine, note = with_fallback(setting, primary, path, **limits(recorder))
    return engine.start(), recorder, note


@pytest.fixture
def wrapped(hf_model):
    engine, recorder, note = served(hf_model)
    assert isinstance(engine, FallbackBackend), note
    yield engine, recorder
    engine.stop()


@pytest.fixture(scope="module")
def reference(hf_model):
    """A torch engine alone: what the fallback must answer, token for token."""
    engine = TorchEngine(GPTJ.from_checkpoint(hf_model), max_batch_size=8).start()
    yield engine
    engine.stop()


def prompt(seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(
        1, VOCAB, (int(torch.randint(4, 30, (1,), generator=gen)),), generator=gen
    ).tolist()


def test_the_wrapper_is_a_generation_backend(wrapped):
    engine, _ = wrapped
    assert isinstance(engine, GenerationBackend)
    assert engine.alive and not engine.stopping and engine.running == 0
    assert engine.limits == engine.primary.limits and engine.observer is engine.primary.observer
    assert engine.max_cache_tokens == engine.primary.max_cache_tokens


def test_an_ordinary_request_stays_on_the_pipeline(wrapped):
    engine, recorder = wrapped
    for request in (
        GenerationRequest(prompt(1), 12),
        GenerationRequest(prompt(2), 12, beam=BeamParams(3)),
        GenerationRequest(prompt(3), 12, bad_words=[[0]]),  # the end token alone: honoured
    ):
        engine.validate(request)
        assert engine.generate(request).finish_reason in ("length", "end_id")
    assert engine.secondary is None  # never loaded
    assert engine.fallbacks == {} and recorder.reasons == []


def test_what_the_pipeline_cannot_honour_is_answered_as_by_the_torch_engine(wrapped, reference):
    engine, recorder = wrapped
    ids = prompt(4)
    free = reference.generate(GenerationRequest(ids, 12)).output_ids
    banned = next(t for t in free if t != 0)  # a token the model picks, not the end token
    requests = {
        "bad_words": GenerationRequest(ids, 12, bad_words=[[banned], [5, 6]]),
        "beam_diversity": GenerationRequest(ids, 12, beam=BeamParams(3, diversity_rate=-1.0)),
        "beam_stop_words": GenerationRequest(ids, 12, beam=BeamParams(2), stop_words=[[7]]),
    }
    for reason, request in requests.items():
        engine.validate(request)  # not refused: the fallback runs it
        ours, theirs = engine.generate(request), reference.generate(request)
        assert ours.finish_reason == theirs.finish_reason, reason
        assert ours.output_ids == theirs.output_ids, reason
        assert ours.log_probs == pytest.approx(theirs.log_probs, abs=1e-4), reason
        if request.beam.width > 1:
            assert [b.output_ids for b in ours.beams] == [b.output_ids for b in theirs.beams]
    assert banned not in engine.generate(requests["bad_words"]).output_ids
    assert engine.fallbacks == {"bad_words": 2, "beam_diversity": 1, "beam_stop_words": 1}
    assert sorted(recorder.reasons) == sorted(["bad_words"] * 2 + list(requests)[1:])
    # the torch engine reports its steps to the same observer (the stage's metrics, where
    # EngineHold holds the engines' threads)
    assert engine.observer is recorder and "gptj-engine" in recorder.step_threads
    secondary = engine.secondary
    assert isinstance(secondary, TorchEngine)
    assert secondary.settings.max_batch_size == FALLBACK_MAX_BATCH_SIZE
    assert secondary.max_cache_tokens == FALLBACK_MAX_BATCH_SIZE * 256  # rows x context
    assert engine.alive
    engine.stop()
    assert not engine.alive and engine.stopping and not secondary.alive


def test_a_routed_request_is_checked_once_and_trusted_where_it_goes(wrapped, monkeypatch):
    """The engine stage's path (backend/engine_stage.py): ``route`` checks each row and says
    which engine runs it; the row is submitted there with ``checked=True`` and not checked
    again. A bare ``submit`` routes too: one check."""
    engine, _ = wrapped
    checked: dict[str, list[GenerationRequest]] = {"primary": [], "secondary": []}

    def spy(backend: GenerationBackend, name: str) -> None:
        real = backend.validate
        monkeypatch.setattr(backend, "validate", lambda r: (checked[name].append(r), real(r)))

    spy(engine.primary, "primary")
    ordinary = GenerationRequest(prompt(5), 8)
    target = engine.route(ordinary)
    assert target is engine.primary and checked["primary"] == [ordinary]
    answer = generate(lambda r, listener: target.submit(r, listener, checked=True), ordinary)
    assert answer.finish_reason in ("length", "end_id") and checked["primary"] == [ordinary]
    assert engine.fallbacks == {}

    unhonoured = GenerationRequest(prompt(5), 8, bad_words=[[5, 6]])
    target = engine.route(unhonoured)
    assert target.engine is engine.secondary
    assert engine.fallbacks == {}  # routed, not yet submitted: a later row could still fail
    spy(engine.secondary, "secondary")
    generate(lambda r, listener: target.submit(r, listener, checked=True), unhonoured)
    assert checked["secondary"] == []  # route checked it against the secondary's limits
    assert engine.fallbacks == {"bad_words": 1}

    checked["primary"].clear()
    engine.generate(ordinary)
    assert checked["primary"] == [ordinary]  # once, by the routing


def test_what_no_engine_can_run_is_refused_by_the_pipeline(wrapped):
    engine, _ = wrapped
    too_wide = GenerationRequest([1, 2, 3], 8, beam=BeamParams(9), bad_words=[[5]])
    with pytest.raises(InvalidRequestError, match="over this server's limit of 8"):
        engine.validate(too_wide)
    assert engine.secondary is None


def test_without_a_fallback_the_refusals_are_the_backends_own(hf_model, tmp_path):
    engine, _, note = served(hf_model, "none")
    try:
        assert isinstance(engine, OpenVINOBackend) and note == "no fallback"
        with pytest.raises(InvalidRequestError, match=BAD_WORDS):
            engine.validate(GenerationRequest([1, 2, 3], 8, bad_words=[[5]]))
    finally:
        engine.stop()
    with pytest.raises(ValueError, match="not torch or none"):
        with_fallback("yes", engine, hf_model)


def test_a_checkpoint_the_torch_engine_cannot_load_gets_no_fallback(tmp_path):
    """Found when the engine starts, from config.json, not when a request needs it."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    primary = object()
    engine, note = with_fallback("torch", primary, tmp_path)  # type: ignore[arg-type]
    assert engine is primary and note.startswith("no fallback:") and "bert" in note


def test_a_fallback_that_cannot_load_refuses_as_the_pipeline_did(hf_model):
    def broken() -> GenerationBackend:
        raise RuntimeError("out of memory")

    primary = OpenVINOBackend(require_export(hf_model), ModelShape.read(hf_model), max_batch_size=4)
    engine = FallbackBackend(primary, broken).start()
    try:
        with pytest.raises(InvalidRequestError, match=f"{BAD_WORDS}.*could not start: out of"):
            engine.validate(GenerationRequest([1, 2, 3], 8, bad_words=[[5]]))
        request = GenerationRequest([1, 2, 3], 4, SamplingParams(repetition_penalty=1.2))
        assert len(engine.generate(request).output_ids) <= 4  # the pipeline goes on
    finally:
        engine.stop()


# -- through the server ----------------------------------------------------------------------


def fallbacks_counted(server, reason: str) -> float:
    """codegen_engine_fallback_requests_total{model="engine", reason=...}, 0 before any."""
    for line in scrape(server).splitlines():
        if (
            line.startswith(names.ENGINE_FALLBACK_REQUESTS + "{")
            and f'model="{ENGINE_MODEL}"' in line
            and f'reason="{reason}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_openvino_server_answers_bad_words_on_the_torch_engine(openvino_server):
    log = openvino_server.log_file.read_text()
    assert re.search(r"engine: serving \S+ \(openvino backend, .*torch fallback", log)
    before = fallbacks_counted(openvino_server, "bad_words")
    with CodegenClient(openvino_server.grpc_url, "grpc") as codegen:  # to `ensemble`
        answer = codegen.complete(PROMPT, max_tokens=8, bad_words=("return",))
    assert answer.text.startswith(PROMPT)  # answered, not refused
    wait_for(
        lambda: fallbacks_counted(openvino_server, "bad_words") == before + 1,
        "the fallback request was not counted on the metrics port",
    )
