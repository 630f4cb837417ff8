"""One step of the torch engine: the forward pass, and what its tokens mean for each request.

A step prefills the newly admitted prompts and decodes every running row in the same forward
pass (the weights are read once for both), then picks each row's token, tells its listener,
and finishes the requests that ended: end token, stop word, length, cancellation, a listener
that failed, or no token left to choose. It changes the rows only through :class:`Batch` and
answers requests only through the ``finish`` callback it is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from engine.batch import Batch, BeamGroup, Row
from engine.interface import StepObserver
from engine.models import CausalLM

log = logging.getLogger(__name__)

Finish = Callable[[Row, str, str | None], None]  # row, finish reason, error
NO_TOKEN = "no token can be generated: bad_words_list bans every token"


class StepRunner:
    """Runs forward steps on ``batch`` with ``model``; ``finish`` answers a request."""

    def __init__(
        self, model: CausalLM, batch: Batch, finish: Finish, observer: StepObserver | None = None
    ) -> None:
        self.model, self.batch, self.finish, self.observer = model, batch, finish, observer

    def step(self, admitted: list[Row]) -> None:
        """One forward pass: the next token of every running row and the first of every
        admitted request. If the pass fails, the admitted requests fail ("prefill failed") and
        the running ones take their step alone; only a failure of that step fails them (the
        engine's worker catches it)."""
        started = time.perf_counter()
        batch = self.batch
        decoding = len(batch)
        decode = batch.decode_segment()
        segments = [] if decode is None else [decode]
        prompt_tokens = sum(len(row.request.prompt_ids) for row in admitted)
        if admitted:
            try:
                segments.append(batch.join(admitted, started))
                logits = self.model.step(segments, batch.cache)
            except Exception as exc:  # e.g. out of memory: fail these requests, not the batch
                log.exception("prefill failed")
                batch.leave(decoding)
                for row in admitted:
                    self.finish(row, "error", f"prefill failed: {exc}")
                if not decoding:
                    return
                segments, admitted, prompt_tokens = segments[:1], [], 0
        if not admitted:
            batch.reserve()
            logits = self.model.step(segments, batch.cache)
        rows = slice(0, decoding + len(admitted))
        self._advance(logits, rows, started, prompt_tokens)

    def _advance(
        self, logits: torch.Tensor, rows: slice, started: float, prompt_tokens: int
    ) -> None:
        """Pick each row's next token, tell its listener, retire the finished requests.

        ``rows`` are the pass's rows; the rows after them, if any, are the other beams of beam
        searches that were just prefilled, which move on with them.
        """
        batch = self.batch
        passed = batch[rows]
        logits, norm = batch.sampler.process(logits, rows)
        chosen, log_probs = batch.sampler.choose(logits, norm, rows)
        span = slice(rows.start, len(batch))
        if span.stop > rows.stop:
            chosen = torch.cat([chosen, chosen.new_zeros(span.stop - rows.stop)])
        groups = list({id(r.group): r.group for r in batch[span] if r.group}.values())
        for group in groups:
            self._step_beams(group, logits, norm, rows, chosen, span)
        batch.advance(chosen, span)
        finished: list[tuple[Row, str, str | None]] = []
        for row, token, log_prob in zip(passed, chosen.tolist(), log_probs.tolist(), strict=False):
            if row.group is None:
                outcome = self._take(row, token, log_prob)
                if outcome is not None:
                    finished.append((row, *outcome))
        for group in groups:
            outcome = self._beams_outcome(group)
            if outcome is not None:
                finished.append((group.beams[0], *outcome))
        if self.observer is not None:
            seconds = time.perf_counter() - started
            self.observer.on_step(len(passed), len(passed), prompt_tokens, seconds)
        for row, reason, error in finished:
            for member in row.group.beams if row.group else (row,):
                batch.retire(member)
            self.finish(row, reason, error)

    def _take(self, row: Row, token: int, log_prob: float) -> tuple[str, str | None] | None:
        """(finish reason, error) if the request ends at this token; else None, after telling
        its listener about the token."""
        if row.handle.cancelled.is_set():
            return "cancelled", None
        if log_prob != log_prob:  # NaN: this row's settings left no token to choose
            return "error", NO_TOKEN
        if token == row.end_id:
            return "end_id", None
        keep, rule = row.lines.verdict(token) if row.lines else (True, None)
        if not keep:  # the editor's answer ended before this token
            return rule or "stop_word", None
        row.tokens.append(token)
        row.log_probs.append(log_prob)
        try:
            row.listener.on_token(token, log_prob)
        except Exception as exc:  # its client is gone, say: end this request only
            log.warning("a listener failed; ending its request: %r", exc)
            return "error", f"could not deliver a token: {exc}"
        if rule is not None:
            return rule, None
        if row.stops and row.stopped(token):
            return "stop_word", None
        if len(row.generated) >= row.request.max_new_tokens:
            return "length", None
        return None

    def _step_beams(
        self,
        group: BeamGroup,
        logits: torch.Tensor,
        norm: torch.Tensor,
        rows: slice,
        chosen: torch.Tensor,
        span: slice,
    ) -> None:
        """One beam search step: choose the continuations, keep the finished hypotheses, and
        give each beam's row its parent's cache and sampler state and its new token."""
        search, beams = group.search, group.beams
        where = [self.batch.index(beam) for beam in beams]
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
        self.batch.reorder(where, sources, len(beams[0].tokens), histories)
        for row, choice in zip(where, choices, strict=True):
            chosen[row - span.start] = choice.token

    def _beams_outcome(self, group: BeamGroup) -> tuple[str, str | None] | None:
        """(finish reason, error) once a beam search has ended, after telling its listener
        about the step; None while it runs."""
        leader, search = group.beams[0], group.search
        if leader.handle.cancelled.is_set():
            return "cancelled", None
        if search.done:
            if not search.finished:
                return "error", NO_TOKEN
            return search.finished[0][0].finish_reason, None
        try:
            leader.listener.on_token(leader.tokens[-1], leader.log_probs[-1])
        except Exception as exc:
            log.warning("a listener failed; ending its request: %r", exc)
            return "error", f"could not deliver a token: {exc}"
        return None
