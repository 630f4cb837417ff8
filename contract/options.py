"""Request options with their defaults and limits, and the error that names a bad one.

The engine, the Triton stages and the client library all check options with these rules, so a
client refuses a bad option before sending it, in the same words the server would use.
Semantics are FasterTransformer's: ``top_k == 0 and top_p == 0`` (or ``top_k == 1``, or
``temperature == 0``) is greedy search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.finish import EDITOR_STOPS

DEFAULT_MAX_TOKENS = 64  # request_output_len a client sends when none is given
MAX_SEED = 2**64  # random_seed is a uint64
# Sampling values past these overflow float32 logits (a positive temperature of 1e-30 turns
# them into inf), so they are refused up front; temperature 0 is greedy search.
MIN_TEMPERATURE = 1e-3
REPETITION_PENALTY_RANGE = (1e-2, 1e2)
# Input caps, checked before any work is done, so a hostile request costs next to nothing.
MAX_PROMPT_BYTES = 256 * 1024  # far above any model's context in text
MAX_WORDS_PER_LIST = 64  # stop or bad words per prompt
MAX_TOKENS_PER_WORD = 32
# Beam search: a server's own limit (max_beam_width in engine/config.pbtxt) is at most this.
DEFAULT_MAX_BEAM_WIDTH = 8


class InvalidRequestError(ValueError):
    """A request the server refuses; the message names the offending option."""


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens; the defaults are the contract's (greedy search)."""

    top_k: int = 0
    top_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise InvalidRequestError(f"runtime_top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise InvalidRequestError(f"runtime_top_p must be in [0, 1], got {self.top_p}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise InvalidRequestError(
                f"temperature must be >= 0 and finite, got {self.temperature}"
            )
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature {self.temperature} is too small to sample with (it overflows the "
                f"logits): use 0 for greedy search, or at least {MIN_TEMPERATURE}"
            )
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            raise InvalidRequestError(
                "repetition_penalty must be > 0 and finite (1.0 = none), got "
                f"{self.repetition_penalty}"
            )
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise InvalidRequestError(
                f"repetition_penalty must be in [{low}, {high}] (1.0 = none), got "
                f"{self.repetition_penalty}"
            )
        if self.seed is not None and not 0 <= self.seed < MAX_SEED:
            raise InvalidRequestError(f"random_seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0)


DEFAULT_SAMPLING = SamplingParams()


@dataclass(frozen=True)
class BeamParams:
    """Beam search options, FasterTransformer's: ``width`` 1 is no beam search.

    ``len_penalty`` divides a finished beam's cumulative log-prob by its length (generated
    tokens, the end token included) raised to that power; 0 ranks by the log-prob alone.
    ``diversity_rate`` is added, times its rank, to each parent beam's 2nd, 3rd... best
    continuation while choosing the next beams (negative values favour beams from different
    parents); it changes which beams are kept, never the log-probs they report.
    """

    width: int = 1
    len_penalty: float = 0.0
    diversity_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.width < 1:
            raise InvalidRequestError(f"beam_width must be >= 1, got {self.width}")
        for name, value in (
            ("len_penalty", self.len_penalty),
            ("beam_search_diversity_rate", self.diversity_rate),
        ):
            if not math.isfinite(value):
                raise InvalidRequestError(f"{name} must be finite, got {value}")

    def score(self, cum_log_prob: float, length: int) -> float:
        """The value beams are ranked by: ``cum_log_prob / length ** len_penalty``."""
        if self.len_penalty == 0.0 or length <= 0:
            return cum_log_prob
        return cum_log_prob / length**self.len_penalty


NO_BEAMS = BeamParams()

# The finish reasons of the editor stop rules, one per rule (contract/finish.py).
EDITOR_STOP_REASONS = EDITOR_STOPS
MAX_INDENT = 1024  # columns; far past any real line


@dataclass(frozen=True)
class EditorStops:
    """Where an editor wants a completion to end, decided on each token inside the engine's
    loop, so that nothing is generated past it (llama.cpp's server has the same controls):

    - ``single_line``: at the first newline of the answer (the token that carries it is the
      last one);
    - ``n_indent`` (llama.cpp's): at a line after the answer's first newline that is indented
      by fewer than that many spaces or tabs, blank lines included; the token that starts such
      a line's text is not part of the answer;
    - ``t_max_predict_ms`` (llama.cpp's): once that many milliseconds have passed since the
      first token and the answer holds a newline (0: no budget).
    """

    single_line: bool = False
    n_indent: int = 0
    t_max_predict_ms: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.n_indent <= MAX_INDENT:
            raise InvalidRequestError(
                f"n_indent must be in [0, {MAX_INDENT}] (0 = off), got {self.n_indent}"
            )
        if self.t_max_predict_ms < 0:
            raise InvalidRequestError(
                f"t_max_predict_ms must be >= 0 (0 = no budget), got {self.t_max_predict_ms}"
            )

    @property
    def active(self) -> bool:
        return self.single_line or self.n_indent > 0 or self.t_max_predict_ms > 0


NO_EDITOR_STOPS = EditorStops()
