"""The torch continuous-batching engine: GPT-J or a Llama-family model (engine/models.py) behind
the GenerationBackend interface.

``submit(request, listener)`` queues a request; one worker thread runs the model. Before each
step it admits waiting requests (:class:`~engine.scheduler.Scheduler`: free rows, the prefill
and KV-cache budgets), drops the cancelled rows, then runs one forward pass
(:class:`~engine.step.StepRunner`) that prefills the admitted prompts and decodes every
running row. Rows join and leave between steps (:class:`~engine.batch.Batch`), so a short
request never waits for a long one to finish. A beam search of width k runs as k rows.

This module wires those pieces and answers requests; each piece says why it does what it does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from contract.healing import TokenExtensions
from engine.batch import Batch, Row
from engine.beams import Hypothesis
from engine.cache import KVCache
from engine.editor_stops import LineStops
from engine.interface import (
    Beam,
    GenerationRequest,
    Handle,
    Listener,
    ModelLimits,
    StepObserver,
    check_editor_texts,
    check_healing,
)
from engine.models import CausalLM
from engine.scheduler import EngineConfig, RequestQueue, Scheduler
from engine.step import StepRunner
from engine.worker import QueueWorker

log = logging.getLogger(__name__)


class TorchEngine(QueueWorker[Row]):
    """Runs generation for many concurrent requests on one model, GPT-J or of the Llama family
    (a GenerationBackend).

    Its limits are an :class:`EngineConfig`: given whole as ``config``, or its fields by name
    (``TorchEngine(model, max_batch_size=8)``); ``settings`` holds them."""

    thread_name = "gptj-engine"

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        observer: StepObserver | None = None,
        token_texts: Sequence[str] | None = None,
        extensions: TokenExtensions | None = None,
        **limits: int | None,
    ) -> None:
        if config is not None and limits:
            raise TypeError(f"give either config or its fields, not both: {sorted(limits)}")
        self.settings = config if config is not None else EngineConfig(**limits)
        max_batch_size = self.settings.max_batch_size
        self.model = model
        self.token_texts = token_texts  # each token's text: what the editor stop rules read
        self.extensions = extensions  # the vocabulary's prefix index: what token healing reads
        weights = next(model.parameters())
        super().__init__(RequestQueue(max_batch_size, observer))
        self._scheduler = Scheduler(
            self.settings, model.config.n_positions, KVCache.capacity_for, self._queue
        )
        self._batch = Batch(model.config, weights.dtype, weights.device, max_batch_size)
        self._runner = StepRunner(model, self._batch, self._finish, observer)

    # -- interface ----------------------------------------------------------------------------

    @property
    def max_cache_tokens(self) -> int:
        """The KV-cache budget in positions (rows x positions)."""
        return self._scheduler.max_cache_tokens

    @property
    def max_beam_width(self) -> int:
        return self.settings.beam_width

    @property
    def limits(self) -> ModelLimits:
        config = self.model.config
        return ModelLimits(config.vocab_size, config.n_positions, self.max_beam_width)

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError, naming the option, for a request that cannot run."""
        self.limits.check(request)
        self._scheduler.check_budget(request)
        check_editor_texts(request, self.token_texts)
        check_healing(request, self.extensions)

    @property
    def running(self) -> int:
        return len(self._batch)

    @property
    def cache(self) -> KVCache:
        return self._batch.cache

    @property
    def cache_bytes(self) -> int:
        """Memory the KV cache holds now (released when the engine is idle)."""
        return self._batch.cache.nbytes

    # -- worker -------------------------------------------------------------------------------

    def _entry(self, request: GenerationRequest, listener: Listener, handle: Handle) -> Row:
        config = self.model.config
        end_id = request.end_token(config.vocab_size, config.eos_token_id)
        if request.beam.width > 1:  # its rows are greedy: the beam search chooses the tokens
            request = replace(request, sampling=replace(request.sampling, top_k=1, top_p=0.0))
        prompt = list(request.prompt_ids)
        stops = request.stops_by_last_token()
        row = Row(request, listener, handle, time.perf_counter(), end_id, prompt, stops)
        if request.editor.active and self.token_texts is not None:
            row.lines = LineStops(request.editor, self.token_texts, request.held_back)
        if request.held_back is not None and self.extensions is not None:
            row.heal = self.extensions.allowed(request.held_back)
        return row

    def _take_running(self) -> list[Row]:
        return [row for row in self._batch.clear() if row.answers]

    def _work(self) -> None:
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        """The worker loop. Nothing escapes it: a failure fails the requests it concerns (a
        row, a prefill, or at worst the running batch) and the loop goes on."""
        while self._queue.next_turn(bool(len(self._batch)), self._release_cache):
            try:
                admitted, cancelled = self._scheduler.admit(list(self._batch))
                for row in cancelled:
                    self._finish(row, "cancelled")
                self._drop_cancelled()
                if admitted or len(self._batch):
                    self._runner.step(admitted)
            except Exception as exc:
                log.exception("engine step failed")
                for row in self._batch.clear():
                    if row.answers:
                        self._finish(row, "error", error=f"generation failed: {exc}")

    def _release_cache(self) -> None:
        """Nothing runs: give the KV cache's memory back (it grows again on demand), and tell
        the observer that the engine is idle."""
        self._batch.release_cache()
        idle = getattr(self.observer, "on_idle", None)
        if idle is not None:
            idle()

    def _drop_cancelled(self) -> None:
        """Cancellation takes effect before the next step: the rows leave the batch now."""
        cancelled = [row for row in self._batch if row.handle.cancelled.is_set()]
        for row in cancelled:
            self._batch.retire(row)
        for row in cancelled:
            if row.answers:
                self._finish(row, "cancelled")

    def _finish(self, row: Row, reason: str, error: str | None = None) -> None:
        """Answer ``row``'s request (its rows have left the batch, or never joined); a beam
        search answers with its beams, the best as the output."""
        output, log_probs, beams = row.generated, row.log_probs, None
        if row.group is not None:
            beams = [_beam(*entry) for entry in row.group.search.finished]
            if beams:
                output, log_probs = beams[0].output_ids, beams[0].log_probs
        self._answer(row, output, log_probs, reason, error, beams=beams)


def _beam(hypothesis: Hypothesis, tokens: list[int], log_probs: list[float]) -> Beam:
    return Beam(
        tokens, log_probs, hypothesis.cum_log_prob, hypothesis.score, hypothesis.finish_reason
    )
