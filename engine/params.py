"""Request options the engine accepts, and their limits. No torch here: clients import it to
refuse a bad option before sending, with the same rules and words as the server."""

from __future__ import annotations

from dataclasses import dataclass


class InvalidRequestError(ValueError):
    """A request the engine refuses; the message names the offending option."""


@dataclass(frozen=True)
class SamplingParams:
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
        if not self.temperature >= 0.0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not self.repetition_penalty > 0.0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0 (1.0 = none), got {self.repetition_penalty}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidRequestError(f"random_seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0)
