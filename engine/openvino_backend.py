"""The engine interface on OpenVINO GenAI's ContinuousBatchingPipeline (the CPU default).

One owner thread adds the submitted requests to the pipeline, calls ``step()`` and reads each
request's new tokens after every step, so listeners hear exactly what the torch engine tells
them: ``on_token`` per generated token, ``on_finish`` once. What the pipeline does not decide
the FasterTransformer way is done here or refused (:meth:`OpenVINOBackend.validate`):

- stop words are matched on the generated tokens here, and the request is stopped before the
  next step, so nothing past the word is produced or reported;
- the end token: the pipeline reports it as the last generated token; it is dropped here;
- log probs under a temperature or repetition penalty: the pipeline reports the model's own,
  before them, so they are computed beside it (engine/openvino_log_probs.py);
- ``bad_words_list`` (the pipeline has no such list), ``beam_search_diversity_rate`` with beams
  (the pipeline's diversity is between beam groups, not FasterTransformer's rank penalty; with
  one beam there is nothing to diversify, and it is ignored, as FasterTransformer does), stop
  words with beam search, and beams' log probs under a temperature or penalty raise
  :class:`NotHonouredError`, naming what to send instead.

Float32 compiles with float32 inference and a float32 KV cache (the CPU plugin's defaults on
this kind of CPU are bfloat16 and a u8 cache), so greedy output equals transformers' token for
token. The prefix cache keeps the KV blocks of earlier requests; :class:`PrefixIndex` counts the
prompt tokens it can serve, since the pipeline reports no per-request reuse.

The pipeline's ``step()`` holds the GIL for the whole forward pass. At Python's default switch
interval (5 ms) a thread of the same process that wants the GIL (a server submitting the next
request, another sending an answer) waits through a whole step or more, so requests reached the
engine late and steps ran with a third of the clients' rows. :meth:`OpenVINOBackend.start` sets
the interval to :data:`GIL_SWITCH_S`, so they get their turn as each step ends.
"""

from __future__ import annotations

import functools
import logging
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from contract.healing import TokenExtensions
from contract.options import DEFAULT_MAX_BEAM_WIDTH
from engine.editor_stops import LineStops
from engine.interface import (
    Beam,
    GenerationRequest,
    Handle,
    Listener,
    ModelLimits,
    StepObserver,
    check_cache_budget,
    check_editor_texts,
    check_healing,
)
from engine.openvino_healing import healing_grammar, refuse_healing_without_tokenizer
from engine.openvino_log_probs import LogProbScorer, ScoredRow, needs_scoring
from engine.openvino_model import BLOCK_SIZE, ModelShape, compile_properties
from engine.openvino_refusals import refuse_what_cannot_be_honoured
from engine.prefix_index import PrefixIndex
from engine.scheduler import RequestQueue
from engine.worker import QueueWorker

log = logging.getLogger(__name__)

# The longest a thread waiting for the GIL waits before asking for it (module docstring). The
# interval is the process's: a lower one only makes threads that run Python at once take
# shorter turns.
GIL_SWITCH_S = 0.0005


@dataclass(eq=False)
class _Request:
    request: GenerationRequest
    listener: Listener
    handle: Handle
    submitted: float
    end_id: int
    stops: dict[int, list[tuple[int, ...]]]
    ov_handle: object = None
    admitted: float = 0.0
    reused: int = 0
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    scored: ScoredRow | None = None  # log probs under temperature/penalty, computed here
    lines: LineStops | None = None  # the editor's stop rules, when it sent any

    def stopped(self) -> bool:
        """Whether the newest generated token completed a stop word; a healed request's first
        token begins with the user's held-back text, so no stop word ends on it."""
        words = self.stops.get(self.tokens[-1], ()) if self.tokens else ()
        produced = len(self.tokens) - (self.request.held_back is not None)
        return any(tuple(self.tokens[-len(w) :]) == w for w in words if len(w) <= produced)


class OpenVINOBackend(QueueWorker[_Request]):
    """A GenerationBackend on ``openvino_genai.ContinuousBatchingPipeline`` (CPU)."""

    thread_name = "openvino-engine"

    def __init__(
        self,
        model_dir: Path,
        shape: ModelShape,
        dtype: str = "float32",
        max_batch_size: int = 64,
        max_prefill_tokens: int = 4096,
        max_cache_tokens: int | None = None,
        max_beam_width: int = DEFAULT_MAX_BEAM_WIDTH,
        prefix_caching: bool = True,
        threads: int = 0,
        observer: StepObserver | None = None,
        device: str = "CPU",
        token_texts: Sequence[str] | None = None,
        extensions: TokenExtensions | None = None,
    ) -> None:
        import openvino_genai

        self.shape, self.model_dir = shape, Path(model_dir)
        self.token_texts = token_texts  # each token's text: what the editor stop rules read
        self.extensions = extensions  # the vocabulary's prefix index: what token healing reads
        self.max_batch_size = max_batch_size
        self.max_beam_width = min(max_beam_width, max_batch_size)
        cache_tokens = max_cache_tokens or max_batch_size * shape.context
        self.blocks = -(-cache_tokens // BLOCK_SIZE)
        self.max_cache_tokens = self.blocks * BLOCK_SIZE
        self.prefix_caching = prefix_caching
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.num_kv_blocks = self.blocks
        scheduler.max_num_seqs = max_batch_size
        scheduler.max_num_batched_tokens = max(max_prefill_tokens, max_batch_size)
        scheduler.dynamic_split_fuse = True
        scheduler.enable_prefix_caching = prefix_caching
        properties = compile_properties(dtype, threads)
        self.pipe = openvino_genai.ContinuousBatchingPipeline(
            str(model_dir), scheduler, device, properties
        )
        self.scorer = LogProbScorer(model_dir, properties, shape.vocab_size)
        self.index = PrefixIndex(self.blocks)
        super().__init__(RequestQueue(max_batch_size, observer))
        self._running: dict[int, _Request] = {}
        self._next_id = 0

    def start(self) -> OpenVINOBackend:
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        return super().start()

    # -- interface ----------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError, naming the option, for what cannot run or be honoured."""
        self.limits.check(request)
        total = len(request.prompt_ids) + request.max_new_tokens
        needed = request.beam.width * -(-total // BLOCK_SIZE) * BLOCK_SIZE
        check_cache_budget(request, needed, self.max_cache_tokens)
        check_editor_texts(request, self.token_texts)
        check_healing(request, self.extensions)
        refuse_healing_without_tokenizer(request, self.model_dir)
        refuse_what_cannot_be_honoured(request, self.shape)

    @property
    def limits(self) -> ModelLimits:
        return ModelLimits(self.shape.vocab_size, self.shape.context, self.max_beam_width)

    @property
    def running(self) -> int:
        return sum(entry.request.rows for entry in list(self._running.values()))

    @property
    def cache_bytes(self) -> int:
        """Memory the pipeline's KV cache holds (it keeps it, for the prefix cache)."""
        return int(self.pipe.get_metrics().kv_cache_size_in_bytes)

    # -- worker -------------------------------------------------------------------------------

    def _entry(self, request: GenerationRequest, listener: Listener, handle: Handle) -> _Request:
        end_id = request.end_token(self.shape.vocab_size, self.shape.eos_token_id)
        stops = request.stops_by_last_token()
        entry = _Request(request, listener, handle, time.perf_counter(), end_id, stops)
        if request.editor.active and self.token_texts is not None:
            entry.lines = LineStops(request.editor, self.token_texts, request.held_back)
        return entry

    def _take_running(self) -> list[_Request]:
        running = list(self._running.values())
        self._running.clear()
        return running

    def _work(self) -> None:
        """The owner thread: nothing escapes it; a failed step fails the running requests."""
        while self._queue.next_turn(bool(self._running), getattr(self.observer, "on_idle", None)):
            try:
                self._add(self._queue.take_all())
                self._drop_cancelled()
                if self._running or self.pipe.has_non_finished_requests():
                    self._step()
            except Exception as exc:
                log.exception("openvino step failed")
                for entry in list(self._running.values()):
                    self._end(entry, "error", f"generation failed: {exc}")

    def _add(self, entries: list[_Request]) -> None:
        for entry in entries:
            if entry.handle.cancelled.is_set():
                self._finish(entry, "cancelled")
                continue
            request = entry.request
            try:
                if needs_scoring(request.sampling, request.beam.width, request.return_log_probs):
                    entry.scored = self.scorer.open(request.prompt_ids, request.sampling)
                ids = np.array([request.prompt_ids], dtype=np.int64)
                entry.ov_handle = self.pipe.add_request(
                    self._next_id, _tensor(ids), self._config(entry)
                )
            except Exception as exc:  # a request the pipeline refuses fails alone
                log.exception("add_request failed")
                self._finish(entry, "error", f"could not start generation: {exc}")
                continue
            if self.prefix_caching:
                entry.reused = self.index.reusable(entry.request.prompt_ids)
                self.index.add(entry.request.prompt_ids)
            self._running[self._next_id] = entry
            self._next_id += 1

    def _config(self, entry: _Request):
        import openvino_genai

        request, sampling = entry.request, entry.request.sampling
        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = request.max_new_tokens
        if request.bad_words:  # only the end token (refused otherwise): full-length answers
            config.min_new_tokens = request.max_new_tokens
        config.set_eos_token_id(entry.end_id)
        config.stop_token_ids = {entry.end_id}
        if request.beam.width > 1:
            config.num_beams = config.num_return_sequences = request.beam.width
            config.length_penalty = request.beam.len_penalty
            config.do_sample = False
        elif not sampling.greedy:
            config.do_sample = True
            config.temperature = sampling.temperature
            if sampling.top_k > 0:
                config.top_k = sampling.top_k
            config.top_p = sampling.top_p if sampling.top_p > 0 else 1.0
            seed = sampling.seed if sampling.seed is not None else secrets.randbits(64)
            config.rng_seed = seed
        if sampling.repetition_penalty != 1.0:
            config.repetition_penalty = sampling.repetition_penalty
        if request.return_log_probs:
            config.logprobs = 1
        if request.held_back is not None and self.extensions is not None:
            config.structured_output_config = healing_grammar(
                self.extensions.texts[request.held_back]
            )
        return config

    def _drop_cancelled(self) -> None:
        for entry in list(self._running.values()):
            if entry.handle.cancelled.is_set():
                self._end(entry, "cancelled")

    def _step(self) -> None:
        started = time.perf_counter()
        self.pipe.step()
        seconds = time.perf_counter() - started
        rows = new_tokens = prompt_tokens = 0
        for entry in list(self._running.values()):
            handle = entry.ov_handle
            if entry.request.beam.width > 1:
                rows += entry.request.rows
                if _finished(handle):
                    self._finish_beams(entry, started)
                continue
            if handle.can_read():
                if not entry.admitted:
                    entry.admitted = started
                    prompt_tokens += len(entry.request.prompt_ids)
                outputs = list(handle.read().values())
                rows += 1
                new_tokens += self._take(entry, outputs[0] if outputs else None)
            elif _finished(handle):
                self._end(entry, "error", "the pipeline ended the request without an answer")
        if self.observer is not None and (rows or self._running):
            # a pass that only prefilled a chunk of a long prompt is a step with no rows: the
            # observer still hears of it (the stage asks then whether a prefilling client left)
            self.observer.on_step(rows, new_tokens, prompt_tokens, seconds)

    def _take(self, entry: _Request, output) -> int:
        """Tell the listener about the new tokens; end the request when it is done."""
        if output is None:
            return 0
        ids = list(output.generated_ids)
        log_probs = list(output.generated_log_probs) or [0.0] * len(ids)
        for index, (token, log_prob) in enumerate(zip(ids, log_probs, strict=False)):
            if token == entry.end_id:
                self._end(entry, "end_id")
                return len(ids)
            keep, rule = entry.lines.verdict(token) if entry.lines else (True, None)
            if not keep:
                self._end(entry, rule or "stop_word", past=len(ids) - index - 1)
                return len(ids)
            entry.tokens.append(token)
            if entry.scored is not None:
                log_prob = entry.scored.log_prob(token)
            entry.log_probs.append(log_prob if entry.request.return_log_probs else 0.0)
            try:
                entry.listener.on_token(token, entry.log_probs[-1])
            except Exception as exc:  # its client is gone, say: end this request only
                log.warning("a listener failed; ending its request: %r", exc)
                self._end(entry, "error", f"could not deliver a token: {exc}")
                return len(ids)
            if rule is not None:
                self._end(entry, rule, past=len(ids) - index - 1)
                return len(ids)
            if entry.stops and entry.stopped():
                self._end(entry, "stop_word")
                return len(ids)
            if len(entry.tokens) >= entry.request.max_new_tokens:
                self._end(entry, "length")
                return len(ids)
        if _finished(entry.ov_handle):
            self._end(entry, "length")
        return len(ids)

    def _finish_beams(self, entry: _Request, started: float) -> None:
        """A beam search answers once, at its end, with every beam ranked by its score."""
        entry.admitted = entry.admitted or started
        outputs = list(entry.ov_handle.read_all()) if entry.ov_handle.can_read() else []
        beams = []
        for output in sorted(outputs, key=lambda o: -o.score):
            ids, log_probs = list(output.generated_ids), list(output.generated_log_probs)
            reason = "length"
            if ids and ids[-1] == entry.end_id:
                ids, reason = ids[:-1], "end_id"
            cum = float(sum(log_probs))
            kept = log_probs[: len(ids)] if entry.request.return_log_probs else [0.0] * len(ids)
            beams.append(Beam(ids, kept, cum, float(output.score), reason))
        if not beams:
            self._end(entry, "error", "the beam search ended without a beam")
            return
        entry.tokens, entry.log_probs = list(beams[0].output_ids), list(beams[0].log_probs)
        self._end(entry, beams[0].finish_reason, beams=beams)

    def _end(
        self,
        entry: _Request,
        reason: str,
        error: str | None = None,
        beams: list[Beam] | None = None,
        past: int = 0,
    ) -> None:
        """Take a running request out of the pipeline (at once: before the next step) and
        answer it; ``past``: tokens the pipeline gave after the one it ended at."""
        for key, value in list(self._running.items()):
            if value is entry:
                del self._running[key]
        entry.scored = None  # its KV state goes with it
        handle = entry.ov_handle
        if handle is not None and not _finished(handle):
            handle.cancel() if reason == "cancelled" else handle.stop()
        if self.prefix_caching and reason not in ("cancelled", "error"):
            self.index.add(entry.request.prompt_ids + entry.tokens)
        self._finish(entry, reason, error, beams, past)

    def _finish(
        self,
        entry: _Request,
        reason: str,
        error: str | None = None,
        beams: list[Beam] | None = None,
        past: int = 0,
    ) -> None:
        self._answer(
            entry,
            entry.tokens,
            entry.log_probs,
            reason,
            error,
            beams=beams,
            reused_prompt_tokens=entry.reused,
            tokens_past_stop=past,
        )


def _finished(handle) -> bool:
    return handle.get_status() != _running_status()


@functools.cache
def _running_status():
    import openvino_genai  # imported where used: importing the module must not need it

    return openvino_genai.GenerationStatus.RUNNING


def _tensor(ids: np.ndarray):
    import openvino

    return openvino.Tensor(ids)
