"""Log probs under temperature and the repetition penalty, for the openvino backend.

FasterTransformer's sampling layers apply the temperature and the repetition penalty to the
logits in place, then take the softmax of what is left over the whole vocabulary, and sum the
log of the chosen token's probability into ``cum_log_probs``. The torch engine reports the same:
the log prob of the distribution the token was drawn from, after penalty and temperature, before
top-k/top-p (engine/sampling.py). The pipeline reports the model's own log probs instead, the
log-softmax of the raw logits, and keeps the logits to itself. The raw log prob cannot be turned
into the adjusted one: the normaliser needs every logit, and the penalty each logit's sign.

So such requests are scored here, beside the pipeline: the same export compiled as the plain
stateful model it is, one infer request (its own KV state) per scored request, fed the prompt
once and then each generated token, reading the logits of the next position. That is one more
single-row forward pass per generated token, paid only by requests that ask for log probs under a
temperature or penalty; the pipeline still chooses every token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contract.options import SamplingParams
from engine.openvino_model import MODEL_FILE


def adjusted_log_prob(
    logits: np.ndarray, token: int, seen: np.ndarray, temperature: float, penalty: float
) -> float:
    """``token``'s log prob after the repetition penalty on the ``seen`` tokens (divide
    positive logits, multiply negative ones) and the temperature, over the whole vocabulary."""
    z = logits.astype(np.float64)
    if penalty != 1.0:
        z = np.where(seen, np.where(z < 0, z * penalty, z / penalty), z)
    z = z / temperature
    top = z.max()
    return float(z[token] - top - np.log(np.exp(z - top).sum()))


def needs_scoring(sampling: SamplingParams, beam_width: int, log_probs: bool) -> bool:
    """Whether the pipeline's own log probs differ from the contract's for this request."""
    return (
        log_probs
        and beam_width == 1
        and (effective_temperature(sampling) != 1.0 or sampling.repetition_penalty != 1.0)
    )


def effective_temperature(sampling: SamplingParams) -> float:
    """Temperature 0 means greedy search, whose log probs are taken at temperature 1 (as the
    torch engine's are)."""
    return sampling.temperature if sampling.temperature > 0 else 1.0


class ScoredRow:
    """One request's own KV state: gives each generated token its adjusted log prob.

    A token is fed to the model only when the next one is scored, so the last token of a
    request costs no forward pass.
    """

    def __init__(self, infer_request, prompt: list[int], sampling: SamplingParams, vocab: int):
        self._request = infer_request
        self._request.reset_state()
        self._length = 0
        self._temperature = effective_temperature(sampling)
        self._penalty = sampling.repetition_penalty
        self._seen = np.zeros(vocab, dtype=bool)
        self._seen[[t for t in prompt if 0 <= t < vocab]] = True
        self._logits = self._feed(prompt)
        self._pending: int | None = None

    def _feed(self, tokens: list[int]) -> np.ndarray:
        start, self._length = self._length, self._length + len(tokens)
        outputs = self._request.infer(
            {
                "input_ids": np.array([tokens], dtype=np.int64),
                "attention_mask": np.ones((1, self._length), dtype=np.int64),
                "position_ids": np.arange(start, self._length, dtype=np.int64)[None, :],
                "beam_idx": np.zeros(1, dtype=np.int32),
            }
        )
        return np.asarray(outputs["logits"])[0, -1]

    def log_prob(self, token: int) -> float:
        """The adjusted log prob of ``token``, the request's next generated token."""
        if self._pending is not None:
            self._logits = self._feed([self._pending])
        value = adjusted_log_prob(self._logits, token, self._seen, self._temperature, self._penalty)
        if 0 <= token < self._seen.shape[0]:
            self._seen[token] = True
        self._pending = token
        return value


class LogProbScorer:
    """The export compiled once (on first use) with the pipeline's own precision; each scored
    request gets an infer request of its own."""

    def __init__(self, model_dir: Path, properties: dict[str, object], vocab_size: int) -> None:
        self.model_dir, self.vocab_size = Path(model_dir), vocab_size
        # the paged-attention cache settings mean nothing to a plain model's compile
        self.properties = {k: v for k, v in properties.items() if "CACHE_PRECISION" not in k}
        self._compiled = None

    def open(self, prompt: list[int], sampling: SamplingParams) -> ScoredRow:
        if self._compiled is None:
            import openvino  # imported where used: importing the module must not need it

            core = openvino.Core()
            self._compiled = core.compile_model(
                str(self.model_dir / MODEL_FILE), "CPU", self.properties
            )
        return ScoredRow(self._compiled.create_infer_request(), prompt, sampling, self.vocab_size)
