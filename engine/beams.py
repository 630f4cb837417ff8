"""Beam search for one request: which continuations to keep each step, and which have finished.

The engine runs a request of width k as k rows of its running batch and asks a
:class:`BeamSearch` after every step which k continuations survive (and from which parent
beam each comes), then reorders the rows' caches to match. The rules are those of
transformers' ``generate(num_beams=k, do_sample=False)`` with FasterTransformer's options:

- the 2k best continuations over all beams (cumulative log-prob) are considered in order; one
  that ends (the end token, or a completed stop word) becomes a finished hypothesis if it is
  among the first k, the others become the next beams until there are k;
- a finished hypothesis is ranked by ``cum_log_prob / length ** len_penalty`` (length: the
  generated tokens, the end token included), and the k best are kept;
- ``diversity_rate`` times its rank within its parent is added to each parent's continuations
  while choosing (FasterTransformer's diverse beam search), not to the log-probs reported;
- the search ends when k hypotheses are finished and no running beam can beat the worst of
  them (its log-prob can only fall), or when the beams reach the requested length, where the
  k best continuations of the last step are the hypotheses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from contract.options import BeamParams


@dataclass(frozen=True)
class Choice:
    """A continuation kept as a running beam: parent beam, new token, their log-probs."""

    parent: int
    token: int
    log_prob: float
    cum_log_prob: float


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: its generated tokens (end token excluded) and how it ranks."""

    parent: int  # the running beam it extends
    token: int | None  # its last token (None for the end token, which is not kept)
    log_prob: float  # of that last token, end token included
    cum_log_prob: float
    score: float
    finish_reason: str  # "end_id" | "stop_word" | "length"


class BeamSearch:
    """The beams of one request. The engine keeps each beam's tokens; this keeps the scores."""

    def __init__(self, params: BeamParams, end_id: int, max_new_tokens: int) -> None:
        self.params = params
        self.width = params.width
        self.end_id = end_id
        self.max_new_tokens = max_new_tokens
        self.cum = torch.zeros(1)  # running beams' cumulative log-probs (one before step 1)
        self.generated = 0  # tokens every running beam has
        self.finished: list[tuple[Hypothesis, list[int], list[float]]] = []
        self.done = False

    def step(
        self,
        log_probs: torch.Tensor,
        ends: Callable[[int, int], bool],
    ) -> tuple[list[Choice], list[Hypothesis]]:
        """From each running beam's next-token log-probs [beams, V] (float32), the beams to
        continue and the hypotheses that finished at this step. ``ends(parent, token)`` says
        whether that token completes one of the request's stop words on that beam."""
        k = self.width
        scores = log_probs + self.cum[:, None]
        per_parent = min(2 * k, scores.shape[1])
        values, tokens = torch.topk(scores, per_parent, dim=-1)
        ranked = values
        if self.params.diversity_rate:
            ranked = values + self.params.diversity_rate * torch.arange(per_parent)
        order = torch.topk(ranked.flatten(), min(2 * k, ranked.numel())).indices.tolist()
        length = self.generated + 1
        last_step = length >= self.max_new_tokens
        choices: list[Choice] = []
        finished: list[Hypothesis] = []
        for rank, flat in enumerate(order):
            parent, column = divmod(flat, per_parent)
            cum = float(values[parent, column])
            if cum == float("-inf"):
                break  # nothing left to choose from (every token banned)
            token = int(tokens[parent, column])
            log_prob = float(log_probs[parent, token])
            reason = None
            if token == self.end_id:
                reason = "end_id"
            elif ends(parent, token):
                reason = "stop_word"
            elif last_step:
                reason = "length"
            if reason is not None:
                if rank < k:  # only the k best may finish, as in transformers
                    kept = None if reason == "end_id" else token
                    score = self.params.score(cum, length)
                    finished.append(Hypothesis(parent, kept, log_prob, cum, score, reason))
                continue
            choices.append(Choice(parent, token, log_prob, cum))
            if len(choices) == k:
                break
        self.generated = length
        self.cum = torch.tensor([c.cum_log_prob for c in choices], dtype=torch.float32)
        self.done = last_step or not choices or self._cannot_improve(finished)
        return choices, finished

    def add(self, hypothesis: Hypothesis, tokens: list[int], log_probs: list[float]) -> None:
        """Keep a finished hypothesis (its generated tokens and their log-probs) if among the
        k best so far."""
        self.finished.append((hypothesis, tokens, log_probs))
        self.finished.sort(key=lambda entry: entry[0].score, reverse=True)
        del self.finished[self.width :]

    def _cannot_improve(self, finished_now: list[Hypothesis]) -> bool:
        """transformers' default test: k hypotheses, and the best running beam's score at its
        current length is no better than the worst of them."""
        scores = sorted([h.score for h, _, _ in self.finished] + [h.score for h in finished_now])
        if len(scores) < self.width:
            return False
        worst = scores[-self.width]
        best_running = self.params.score(float(self.cum.max()), self.generated)
        return best_running <= worst
