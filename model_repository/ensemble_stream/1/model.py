"""Triton adapter for the streaming pipeline (decoupled): one response per piece of text.

preprocessing (a BLS call to that model) -> this model's engine -> incremental detokenization
with ``postprocessing.detokenize.IncrementalDecoder``, which never splits a character, so the
pieces concatenate to exactly the unary completion. A client that goes away cancels its request
(Triton marks it cancelled); the engine then drops the sequence at its next step.
"""

import numpy as np

from backend.engine_stage import start_engine, submit_requests
from backend.io import FINAL, error_response, response, tokenize
from contract.options import InvalidRequestError
from contract.tensors import OPTION_INPUTS
from engine.engine import GenerationResult
from engine.tensors import requests_from_tensors
from postprocessing.detokenize import IncrementalDecoder, Postprocessor


class _Stream:
    """Listener that forwards each new piece of text to the client as it is produced."""

    def __init__(self, sender, decoder: IncrementalDecoder, prompt_len: int, log_probs: bool):
        self.sender = sender
        self.decoder = decoder
        self.length = prompt_len
        self.want_log_probs = log_probs
        self.pending: list[float] = []  # log probs of tokens not yet sent
        self.cumulative = 0.0
        self.handle = None

    def _response(self, piece: str):
        log_probs = self.pending if self.want_log_probs else [0.0] * len(self.pending)
        self.pending = []
        outputs = {
            "OUTPUT_0": np.array([[piece.encode("utf-8")]], dtype=np.object_),
            "sequence_length": np.array([[self.length]], dtype=np.uint32),
            "cum_log_probs": np.array([[self.cumulative if self.want_log_probs else 0.0]],
                                      dtype=np.float32),
            "output_log_probs": np.array([log_probs], dtype=np.float32),
        }  # fmt: skip
        return response(outputs)

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.length += 1
        self.cumulative += log_prob
        self.pending.append(log_prob)
        piece = self.decoder.push(token_id)
        if not piece:
            return
        if self.sender.is_cancelled():
            if self.handle is not None:
                self.handle.cancel()
            return
        self.sender.send(self._response(piece))

    def on_finish(self, result: GenerationResult) -> None:
        if result.finish_reason == "cancelled" and self.sender.is_cancelled():
            self.sender.send(flags=FINAL)  # close the request; nobody reads it
            return
        if result.error:
            self.sender.send(error_response(result.error), flags=FINAL)
        else:
            self.sender.send(self._response(self.decoder.flush()), flags=FINAL)


def _parse(request):
    rows, log_probs = requests_from_tensors(tokenize(request, OPTION_INPUTS))
    if len(rows) != 1:
        raise InvalidRequestError(f"streaming takes one prompt per request, got {len(rows)}")
    if rows[0].beam.width > 1:
        raise InvalidRequestError(
            f"beam_width={rows[0].beam.width} cannot stream: beams are ranked only once they "
            "finish; send it to the unary `ensemble` instead"
        )
    return rows, log_probs


class TritonPythonModel:
    def initialize(self, args):
        self.stage = start_engine(args)
        self.postprocessor = Postprocessor(self.stage.checkpoint)

    def execute(self, requests):
        submit_requests(self.stage.engine, requests, _parse, self._listeners)
        return None

    def _listeners(self, sender, rows, log_probs: bool) -> list[_Stream]:
        prompt = rows[0].prompt_ids
        decoder = IncrementalDecoder(self.postprocessor, prompt)
        return [_Stream(sender, decoder, len(prompt), log_probs)]

    def finalize(self):
        self.stage.engine.stop()
