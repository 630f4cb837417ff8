"""A continuous-batching generation engine behind a small interface.

``submit(request, listener)`` queues a sequence; a single worker thread runs the model: each
iteration it prefills newly admitted sequences, then runs one decode step for every running
sequence, and tells each listener about its new token and, at the end, its result. Sequences join
and leave between steps, so a short request never waits for a long one to finish. The Triton
adapter only sees this interface; the batching strategy can change behind it.

A beam search request of width k runs as k rows of the same batch (``engine.beams`` decides
which continuations survive); its prompt is prefilled once, and after each step the rows take
their parent beam's cache, so beams join and leave between steps like any other request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from contract.options import DEFAULT_MAX_BEAM_WIDTH
from engine.beams import BeamSearch, Hypothesis
from engine.gptj import GPTJ, KVCache, Segment
from engine.interface import (  # re-exported: callers import the data types from here too
    Beam,
    GenerationRequest,
    GenerationResult,
    Handle,
    Listener,
    ModelLimits,
    NullListener,
    StepObserver,
    check_cache_budget,
)
from engine.sampling import Sampler

log = logging.getLogger(__name__)


@dataclass(eq=False)  # rows are told apart by identity: a beam's rows may hold equal values
class _Sequence:
    request: GenerationRequest
    listener: Listener
    handle: Handle
    submitted: float
    end_id: int | None
    tokens: list[int]  # prompt + generated so far (the sampler reads it for multi-token bad words)
    stops: dict[int, list[tuple[int, ...]]]  # stop words by their last token
    admitted: float = 0.0
    log_probs: list[float] = field(default_factory=list)
    group: _BeamGroup | None = None  # the beam search this row is a beam of

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.request.prompt_ids) :]

    def stopped(self, token: int) -> bool:
        """Whether appending ``token`` completed a stop word (checks only words ending in it)."""
        produced = len(self.tokens) - len(self.request.prompt_ids)
        return any(
            len(word) <= produced and tuple(self.tokens[-len(word) :]) == word
            for word in self.stops.get(token, ())
        )

    def completes_stop(self, before: list[int], token: int) -> bool:
        """Whether ``token`` after the tokens ``before`` completes one of the stop words."""
        produced = len(before) + 1 - len(self.request.prompt_ids)
        return any(
            len(word) <= produced and tuple(before[len(before) + 1 - len(word) :]) == word[:-1]
            for word in self.stops.get(token, ())
        )

    def beam_row(self) -> _Sequence:
        """Another row of this request's beam search, for now a copy of this one."""
        return replace(self, tokens=list(self.tokens), log_probs=list(self.log_probs))


@dataclass(eq=False)
class _BeamGroup:
    """A beam search request's rows (``beams[0]`` answers it) and its search state."""

    search: BeamSearch
    beams: list[_Sequence]


__all__ = [
    "Beam",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "Handle",
    "Listener",
    "NullListener",
    "StepObserver",
]


class Engine:
    """Runs GPT-J generation for many concurrent requests on one model (a GenerationBackend)."""

    def __init__(
        self,
        model: GPTJ,
        max_batch_size: int = 32,
        max_prefill_tokens: int = 4096,
        observer: StepObserver | None = None,
        max_cache_tokens: int | None = None,
        max_beam_width: int = DEFAULT_MAX_BEAM_WIDTH,
    ) -> None:
        self.model = model
        self.config = model.config
        self.max_batch_size = max_batch_size
        self.max_beam_width = min(max_beam_width, max_batch_size)
        self.max_prefill_tokens = max_prefill_tokens
        # rows x positions the KV cache may hold (None: rows x the context, the most it can need)
        self.max_cache_tokens = max_cache_tokens or max_batch_size * model.config.n_positions
        self.observer = observer
        weights = next(model.parameters())
        self.device = weights.device
        self._dtype = weights.dtype
        self.cache = KVCache.empty(model.config, weights.dtype, self.device)
        self.sampler = Sampler(self.config.vocab_size, self.device, max_batch_size)
        # each running row's last token and its position: the next decode step's input
        self._last = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self._position = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._unfinished = 0  # rows submitted and not yet finished (waiting, prefilling, running)
        self._thread: threading.Thread | None = None

    # -- interface ----------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError, naming the option, for a request that cannot run."""
        self.limits.check(request)
        total = len(request.prompt_ids) + request.max_new_tokens
        needed = request.beam.width * KVCache.capacity_for(total)
        check_cache_budget(request, needed, self.max_cache_tokens)

    @property
    def limits(self) -> ModelLimits:
        return ModelLimits(self.config.vocab_size, self.config.n_positions, self.max_beam_width)

    def submit(self, request: GenerationRequest, listener: Listener) -> Handle:
        """Queue a request; the listener hears each token and then the result."""
        self.validate(request)
        end_id = request.end_id
        if end_id is None or not 0 <= end_id < self.config.vocab_size:
            end_id = self.config.eos_token_id
        stops: dict[int, list[tuple[int, ...]]] = {}
        for word in request.stop_words:
            stops.setdefault(word[-1], []).append(tuple(word))
        handle = Handle()
        if request.beam.width > 1:  # its rows are greedy: the beam search chooses the tokens
            request = replace(request, sampling=replace(request.sampling, top_k=1, top_p=0.0))
        seq = _Sequence(
            request, listener, handle, time.perf_counter(), end_id, list(request.prompt_ids), stops
        )
        with self._cond:
            if self._stopping:
                raise RuntimeError("engine is stopped")
            self._waiting.append(seq)
            self._unfinished += request.rows
            self._cond.notify()
        return handle

    def wait_for_room(self, rows: int) -> None:
        """Block until ``rows`` more sequences fit in the running batch.

        The Triton adapter calls this before submitting, so that a request the engine cannot
        start yet waits in Triton's queue, where ``nv_inference_queue_duration_us`` and the
        pending-request count show the overload (and an autoscaler can act on it), rather than
        in a private queue no metric sees. A request wider than the batch waits for an empty
        engine.
        """
        with self._cond:
            while self._unfinished > 0 and self._unfinished + rows > self.max_batch_size:
                if self._stopping:
                    return
                self._cond.wait()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Blocking convenience: submit and wait for the result."""
        done = threading.Event()
        box: list[GenerationResult] = []

        class _Wait(NullListener):
            def on_finish(self, result: GenerationResult) -> None:
                box.append(result)
                done.set()

        self.submit(request, _Wait())
        done.wait()
        return box[0]

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="gptj-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        for seq in list(self._waiting) + _answering(self._running):
            self._finish(seq, "cancelled", error="server is shutting down")
        self._waiting.clear()
        self._running.clear()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def cache_bytes(self) -> int:
        """Memory the KV cache holds now (released when the engine is idle)."""
        return self.cache.nbytes

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running (false before start and after stop)."""
        return self._thread is not None and self._thread.is_alive()

    # -- worker -------------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        """The worker loop. Nothing escapes it: a failure fails the requests it concerns (a
        row, a prefill, or at worst the running batch) and the loop goes on."""
        while True:
            with self._cond:
                if not (self._waiting or self._running or self._stopping):
                    self._release_cache()
                while not (self._waiting or self._running or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                with self._cond:
                    admitted = self._admit()
                self._drop_cancelled()
                if admitted or self._running:
                    self._step(admitted)
            except Exception as exc:
                log.exception("engine step failed")
                self._fail_running(f"generation failed: {exc}")

    def _fail_running(self, error: str) -> None:
        running, self._running = self._running, []
        for seq in _answering(running):
            self._finish(seq, "error", error=error)
        self.sampler = Sampler(self.config.vocab_size, self.device, self.max_batch_size)

    def _release_cache(self) -> None:
        """Give the KV cache's memory back while nothing runs; it grows again on demand."""
        if self.cache.nbytes:
            self.cache = KVCache.empty(self.config, self._dtype, self.device)
            idle = getattr(self.observer, "on_idle", None)
            if idle is not None:
                idle()

    def _admit(self) -> list[_Sequence]:
        """Take waiting sequences while there are free rows and prefill budget."""
        admitted: list[_Sequence] = []
        free = self.max_batch_size - len(self._running)
        longest = 0
        reach = max((_reach(s) for s in self._running), default=0)
        taken = 0  # rows the admitted sequences take (beam searches take several)
        while self._waiting:
            seq = self._waiting[0]
            if seq.handle.cancelled.is_set():
                self._waiting.popleft()
                self._finish(seq, "cancelled")
                continue
            if taken + seq.request.rows > free:
                break
            length = max(longest, len(seq.request.prompt_ids))
            if admitted and length * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            rows = len(self._running) + taken + seq.request.rows
            reach = max(reach, _reach(seq))
            if rows * KVCache.capacity_for(reach) > self.max_cache_tokens:
                break  # waits until finished sequences free the cache
            longest = length
            taken += seq.request.rows
            admitted.append(self._waiting.popleft())
        return admitted

    def _step(self, admitted: list[_Sequence]) -> None:
        """One forward pass: the next token of every running sequence and the first of every
        admitted one, whose prompts are prefilled in the same pass (the weights are read once
        for both). If that pass fails, the admitted requests fail ("prefill failed") and the
        running ones take their step alone; only a failure of that step fails them."""
        started = time.perf_counter()
        decoding = len(self._running)
        segments = []
        if decoding:
            segments.append(
                Segment(
                    self._last[:decoding, None],
                    self._position[:decoding],
                    torch.zeros(decoding, dtype=torch.long, device=self.device),
                    slice(0, decoding),
                )
            )
        prompt_tokens = sum(len(seq.request.prompt_ids) for seq in admitted)
        if admitted:
            try:
                segments.append(self._join(admitted, started))
                logits = self.model.step(segments, self.cache)
            except Exception as exc:  # e.g. out of memory: fail these requests, not the batch
                log.exception("prefill failed")
                self._leave(decoding, admitted, f"prefill failed: {exc}")
                if not decoding:
                    return
                segments, admitted, prompt_tokens = segments[:1], [], 0
        if not admitted:
            self._reserve()
            logits = self.model.step(segments, self.cache)
        rows = slice(0, decoding + len(admitted))
        self._advance(self._running[: rows.stop], logits, rows, started, prompt_tokens)

    def _join(self, admitted: list[_Sequence], started: float) -> Segment:
        """Give the admitted sequences their rows, after the running ones (a beam search's other
        beams take rows after them, with no prefill of their own: its first step gives them the
        prompt's cache). Returns the segment that prefills their prompts."""
        first = len(self._running)
        lengths = [len(seq.request.prompt_ids) for seq in admitted]
        self._running.extend(admitted)
        for seq in admitted:
            if seq.request.rows > 1:
                beams = [seq] + [seq.beam_row() for _ in range(seq.request.rows - 1)]
                search = BeamSearch(seq.request.beam, seq.end_id, seq.request.max_new_tokens)
                seq.group = _BeamGroup(search, beams)
                for beam in beams:
                    beam.group = seq.group
                self._running.extend(beams[1:])
        self._reserve()
        tokens = torch.zeros((len(admitted), max(lengths)), dtype=torch.long)
        for i, seq in enumerate(admitted):
            tokens[i, : lengths[i]] = torch.tensor(seq.request.prompt_ids)
        for seq in self._running[first:]:
            seq.admitted = started
            self.sampler.add(seq.request.sampling, seq.tokens, seq.request.bad_words)
        self._position[first : len(self._running)] = torch.tensor(
            [len(seq.request.prompt_ids) - 1 for seq in self._running[first:]]
        )
        rows = slice(first, first + len(admitted))
        return Segment(
            tokens.to(self.device),
            torch.zeros(len(admitted), dtype=torch.long, device=self.device),
            self._position[rows],
            rows,
        )

    def _leave(self, first: int, admitted: list[_Sequence], error: str) -> None:
        """Undo :meth:`_join` (rows from ``first`` on) and answer the admitted requests."""
        while len(self._running) > first:
            if self.sampler.rows == len(self._running):
                self.sampler.remove(self.sampler.rows - 1)
            self._running.pop()
        for seq in admitted:
            self._finish(seq, "error", error=error)

    def _reserve(self) -> None:
        """Room in the KV cache for every running sequence's whole request."""
        self.cache.reserve(len(self._running), max(_reach(s) for s in self._running))

    def _advance(
        self,
        seqs: list[_Sequence],
        logits: torch.Tensor,
        rows: slice,
        started: float,
        prompt_tokens: int,
    ) -> None:
        """Pick each sequence's next token, tell its listener, retire the finished ones.

        ``rows`` are the pass's rows (``seqs``); the rows after them, if any, are the other
        beams of beam searches that were just prefilled, which move on with them.
        """
        logits, norm = self.sampler.process(logits, rows)
        chosen, log_probs = self.sampler.choose(logits, norm, rows)
        span = slice(rows.start, len(self._running))
        if span.stop > rows.stop:
            chosen = torch.cat([chosen, chosen.new_zeros(span.stop - rows.stop)])
        groups = list({id(s.group): s.group for s in self._running[span] if s.group}.values())
        for group in groups:
            self._step_beams(group, logits, norm, rows, chosen, span)
        self.sampler.advance(chosen, span)
        self._last[span] = chosen
        self._position[span] += 1
        finished: list[tuple[_Sequence, str, str | None]] = []
        for seq, token, log_prob in zip(seqs, chosen.tolist(), log_probs.tolist(), strict=False):
            if seq.group is not None:
                continue
            if seq.handle.cancelled.is_set():
                finished.append((seq, "cancelled", None))
                continue
            if log_prob != log_prob:  # NaN: this row's settings left no token to choose
                error = "no token can be generated: bad_words_list bans every token"
                finished.append((seq, "error", error))
                continue
            if token == seq.end_id:
                finished.append((seq, "end_id", None))
                continue
            seq.tokens.append(token)
            seq.log_probs.append(log_prob)
            try:
                seq.listener.on_token(token, log_prob)
            except Exception as exc:  # its client is gone, say: end this request only
                log.warning("a listener failed; ending its request: %r", exc)
                finished.append((seq, "error", f"could not deliver a token: {exc}"))
                continue
            if seq.stops and seq.stopped(token):
                finished.append((seq, "stop_word", None))
            elif len(seq.tokens) - len(seq.request.prompt_ids) >= seq.request.max_new_tokens:
                finished.append((seq, "length", None))
        for group in groups:
            outcome = self._beams_outcome(group)
            if outcome is not None:
                finished.append((group.beams[0], *outcome))
        if self.observer is not None:
            self.observer.on_step(
                len(seqs), len(seqs), prompt_tokens, time.perf_counter() - started
            )
        for seq, reason, error in finished:
            for row in seq.group.beams if seq.group else (seq,):
                self._retire(row)
            self._finish(seq, reason, error)

    def _step_beams(
        self,
        group: _BeamGroup,
        logits: torch.Tensor,
        norm: torch.Tensor,
        rows: slice,
        chosen: torch.Tensor,
        span: slice,
    ) -> None:
        """One beam search step: choose the continuations, keep the finished hypotheses, and
        give each beam's row its parent's cache and sampler state and its new token."""
        search, beams = group.search, group.beams
        where = [self._running.index(beam) for beam in beams]
        parents = [row for row in where if row < rows.stop]  # all but right after prefill
        offsets = torch.tensor([row - rows.start for row in parents], device=logits.device)
        step_log_probs = (logits[offsets] - norm[offsets, None]).float().cpu()

        def ends(parent: int, token: int) -> bool:
            beam = beams[parent]
            return bool(beam.stops) and beam.completes_stop(beam.tokens, token)

        choices, ended = search.step(step_log_probs, ends)
        for hypothesis in ended:
            parent = beams[hypothesis.parent]
            extra = [] if hypothesis.token is None else [hypothesis.token]
            extra_log_probs = [] if hypothesis.token is None else [hypothesis.log_prob]
            search.add(hypothesis, parent.generated + extra, parent.log_probs + extra_log_probs)
        if search.done:
            return
        histories = [
            ([*beams[c.parent].tokens, c.token], [*beams[c.parent].log_probs, c.log_prob])
            for c in choices
        ]
        sources = [where[c.parent] for c in choices]
        self.cache.reorder(where, sources, len(beams[0].tokens))
        self.sampler.reorder(where, sources)
        for beam, row, choice, (tokens, log_probs) in zip(
            beams, where, choices, histories, strict=True
        ):
            beam.tokens, beam.log_probs = tokens, log_probs
            self.sampler.tokens[row] = tokens
            chosen[row - span.start] = choice.token

    def _beams_outcome(self, group: _BeamGroup) -> tuple[str, str | None] | None:
        """(finish reason, error) once a beam search has ended, after telling its listener
        about the step; None while it runs."""
        leader, search = group.beams[0], group.search
        if leader.handle.cancelled.is_set():
            return "cancelled", None
        if search.done:
            if not search.finished:
                return "error", "no token can be generated: bad_words_list bans every token"
            return search.finished[0][0].finish_reason, None
        try:
            leader.listener.on_token(leader.tokens[-1], leader.log_probs[-1])
        except Exception as exc:
            log.warning("a listener failed; ending its request: %r", exc)
            return "error", f"could not deliver a token: {exc}"
        return None

    def _drop_cancelled(self) -> None:
        cancelled = [s for s in self._running if s.handle.cancelled.is_set()]
        for seq in cancelled:
            self._retire(seq)
        for seq in _answering(cancelled):
            self._finish(seq, "cancelled")

    def _retire(self, seq: _Sequence) -> None:
        """Remove a running sequence, moving the last row into its place to stay contiguous."""
        row = self._running.index(seq)
        last = self._running.pop()
        self.sampler.remove(row)
        if last is not seq:
            end = len(self._running)
            self.cache.move_row(end, row, len(last.tokens))
            self._last[row] = self._last[end]
            self._position[row] = self._position[end]
            self._running[row] = last

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        now = time.perf_counter()
        result = GenerationResult(
            prompt_ids=list(seq.request.prompt_ids),
            output_ids=list(seq.generated),
            log_probs=list(seq.log_probs),
            finish_reason=reason,
            error=error,
            queue_seconds=(seq.admitted or now) - seq.submitted,
            total_seconds=now - seq.submitted,
        )
        if seq.group is not None:
            result.beams = [_beam(*entry) for entry in seq.group.search.finished]
            if result.beams:
                result.output_ids = list(result.beams[0].output_ids)
                result.log_probs = list(result.beams[0].log_probs)
        with self._cond:  # a re-entrant lock: _admit calls this while holding it
            self._unfinished -= seq.request.rows
            self._cond.notify_all()  # room for requests held in wait_for_room
        for hook in (seq.listener.on_finish, getattr(self.observer, "on_finish", None)):
            if hook is None:
                continue
            try:
                hook(result)
            except Exception:  # never let a listener end the worker
                log.exception("on_finish failed")


def _reach(seq: _Sequence) -> int:
    """Positions a sequence can occupy: its prompt and every token it may generate."""
    return len(seq.request.prompt_ids) + seq.request.max_new_tokens


def _answering(seqs: list[_Sequence]) -> list[_Sequence]:
    """The rows that answer their request: all but the extra beams of a beam search."""
    return [s for s in seqs if s.group is None or s is s.group.beams[0]]


def _beam(hypothesis: Hypothesis, tokens: list[int], log_probs: list[float]) -> Beam:
    return Beam(
        tokens, log_probs, hypothesis.cum_log_prob, hypothesis.score, hypothesis.finish_reason
    )
