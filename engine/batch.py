"""The torch engine's running batch: its rows, and the four things kept per row.

Row ``i`` of the batch is, at once, ``rows[i]`` (the request or beam it generates for), row
``i`` of the KV cache, row ``i`` of the sampler (settings, seed, tokens so far), and entry ``i``
of ``last``/``position`` (the next decode step's input). A row that joins, leaves or takes
another's place must move in all of them together, so :class:`Batch` alone changes them: the
scheduler chooses who joins, the step runner reads the rows and reports what happened.

A beam search of width k is k rows (:class:`BeamGroup`); its prompt is prefilled once on the
first row, and after each step every beam takes its parent's cache (:meth:`Batch.reorder`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from engine.beams import BeamSearch
from engine.cache import KVCache, Segment
from engine.editor_stops import LineStops
from engine.interface import GenerationRequest, Handle, Listener
from engine.models import ModelConfig
from engine.sampling import Sampler


@dataclass(eq=False)  # rows are told apart by identity: a beam's rows may hold equal values
class Row:
    """One row of the running batch: a request, or one beam of a beam search."""

    request: GenerationRequest
    listener: Listener
    handle: Handle
    submitted: float
    end_id: int
    tokens: list[int]  # prompt + generated so far (the sampler reads it for multi-token bad words)
    stops: dict[int, list[tuple[int, ...]]]  # stop words by their last token
    admitted: float = 0.0
    log_probs: list[float] = field(default_factory=list)
    group: BeamGroup | None = None  # the beam search this row is a beam of
    lines: LineStops | None = None  # the editor's stop rules, when it sent any
    heal: tuple[int, ...] = ()  # token healing: what the first token may be, held-back id first

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.request.prompt_ids) :]

    @property
    def reach(self) -> int:
        """Positions the row can occupy: its prompt and every token it may generate."""
        return len(self.request.prompt_ids) + self.request.max_new_tokens

    @property
    def answers(self) -> bool:
        """Whether this row answers its request: all do but the extra beams of a search."""
        return self.group is None or self is self.group.beams[0]

    @property
    def answer_from(self) -> int:
        """Where the answer's own tokens start in ``tokens``: a healed row's first token begins
        with the user's held-back text, so a stop word may not end on it."""
        return len(self.request.prompt_ids) + bool(self.heal)

    def stopped(self, token: int) -> bool:
        """Whether appending ``token`` completed a stop word (checks only words ending in it)."""
        produced = len(self.tokens) - self.answer_from
        return any(
            len(word) <= produced and tuple(self.tokens[-len(word) :]) == word
            for word in self.stops.get(token, ())
        )

    def completes_stop(self, before: list[int], token: int) -> bool:
        """Whether ``token`` after the tokens ``before`` completes one of the stop words."""
        produced = len(before) + 1 - self.answer_from
        return any(
            len(word) <= produced and tuple(before[len(before) + 1 - len(word) :]) == word[:-1]
            for word in self.stops.get(token, ())
        )

    def beam_row(self) -> Row:
        """Another row of this request's beam search, for now a copy of this one."""
        return replace(self, tokens=list(self.tokens), log_probs=list(self.log_probs))


@dataclass(eq=False)
class BeamGroup:
    """A beam search request's rows (``beams[0]`` answers it) and its search state."""

    search: BeamSearch
    beams: list[Row]


class Batch:
    """The running rows, with their cache rows, sampler rows, last tokens and positions.

    Rows ``0 .. len(self) - 1`` are in use, contiguous, in the same order everywhere.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_batch_size: int,
    ) -> None:
        self.config, self.dtype, self.device = config, dtype, device
        self.max_batch_size = max_batch_size
        self.cache = KVCache.empty(config, dtype, device)
        self.sampler = Sampler(config.vocab_size, device, max_batch_size)
        # each row's last token and its position: the next decode step's input
        self.last = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.position = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self._rows: list[Row] = []

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(list(self._rows))

    def __getitem__(self, rows: slice) -> list[Row]:
        return self._rows[rows]

    def index(self, row: Row) -> int:
        return self._rows.index(row)

    def decode_segment(self) -> Segment | None:
        """The running rows' next decode step (one token each), or None when none runs."""
        decoding = len(self._rows)
        if not decoding:
            return None
        return Segment(
            self.last[:decoding, None],
            self.position[:decoding],
            torch.zeros(decoding, dtype=torch.long, device=self.device),
            slice(0, decoding),
        )

    def join(self, admitted: list[Row], started: float) -> Segment:
        """Give the admitted requests rows after the running ones (a beam search's other beams
        take rows after all of them, with no prefill of their own: its first step gives them
        the prompt's cache). Returns the segment that prefills their prompts."""
        first = len(self._rows)
        lengths = [len(row.request.prompt_ids) for row in admitted]
        self._rows.extend(admitted)
        for row in admitted:
            if row.request.rows > 1:
                beams = [row] + [row.beam_row() for _ in range(row.request.rows - 1)]
                search = BeamSearch(row.request.beam, row.end_id, row.request.max_new_tokens)
                row.group = BeamGroup(search, beams)
                for beam in beams:
                    beam.group = row.group
                self._rows.extend(beams[1:])
        self.reserve()
        tokens = torch.zeros((len(admitted), max(lengths)), dtype=torch.long)
        for i, row in enumerate(admitted):
            tokens[i, : lengths[i]] = torch.tensor(row.request.prompt_ids)
        for row in self._rows[first:]:
            row.admitted = started
            self.sampler.add(row.request.sampling, row.tokens, row.request.bad_words, row.heal)
        self.position[first : len(self._rows)] = torch.tensor(
            [len(row.request.prompt_ids) - 1 for row in self._rows[first:]]
        )
        rows = slice(first, first + len(admitted))
        return Segment(
            tokens.to(self.device),
            torch.zeros(len(admitted), dtype=torch.long, device=self.device),
            self.position[rows],
            rows,
        )

    def leave(self, first: int) -> None:
        """Undo :meth:`join`: drop the rows from ``first`` on (a prefill that failed)."""
        while len(self._rows) > first:
            if self.sampler.rows == len(self._rows):
                self.sampler.remove(self.sampler.rows - 1)
            self._rows.pop()

    def reserve(self) -> None:
        """Room in the KV cache for every running row's whole request."""
        self.cache.reserve(len(self._rows), max(row.reach for row in self._rows))

    def advance(self, chosen: torch.Tensor, span: slice) -> None:
        """The rows in ``span`` took the tokens ``chosen``: they are the next step's input."""
        self.sampler.advance(chosen, span)
        self.last[span] = chosen
        self.position[span] += 1

    def reorder(
        self,
        where: list[int],
        sources: list[int],
        length: int,
        histories: list[tuple[list[int], list[float]]],
    ) -> None:
        """Beams continue other beams: row ``where[i]`` takes row ``sources[i]``'s first
        ``length`` cache positions and its sampler state, and the history ``histories[i]``
        (tokens and log probs: the parent's, and its new token's)."""
        self.cache.reorder(where, sources, length)
        self.sampler.reorder(where, sources)
        for index, (tokens, log_probs) in zip(where, histories, strict=True):
            row = self._rows[index]
            row.tokens, row.log_probs = tokens, log_probs
            self.sampler.tokens[index] = tokens  # the same list: the row extends both

    def retire(self, row: Row) -> None:
        """Remove a running row, moving the last row into its place to stay contiguous."""
        index = self._rows.index(row)
        last = self._rows.pop()
        self.sampler.remove(index)
        if last is not row:
            end = len(self._rows)
            self.cache.move_row(end, index, len(last.tokens))
            self.last[index] = self.last[end]
            self.position[index] = self.position[end]
            self._rows[index] = last

    def clear(self) -> list[Row]:
        """Empty the batch after a failed step (the sampler's state may be half-changed, so it
        starts afresh); returns the rows that were running."""
        rows, self._rows = self._rows, []
        self.sampler = Sampler(self.config.vocab_size, self.device, self.max_batch_size)
        return rows

    def release_cache(self) -> bool:
        """Give the KV cache's memory back (only while nothing runs); it grows again on
        demand. Returns whether there was memory to give back."""
        if not self.cache.nbytes:
            return False
        self.cache = KVCache.empty(self.config, self.dtype, self.device)
        return True
