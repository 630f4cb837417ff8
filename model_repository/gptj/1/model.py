"""Triton adapter for the GPT-J stage: tensors in, engine requests out, answers sent later.

The engine runs in its own thread; ``execute`` only validates and submits, then returns
``None``. Each Triton request is answered through its response sender once all of its rows have
finished, which lets requests overlap and batch continuously.
"""

import threading

from backend.engine_stage import start_engine, submit_requests
from backend.io import FINAL, error_response, read_inputs, response
from contract.tensors import MODEL_STAGE_INPUTS
from engine.engine import GenerationResult
from engine.tensors import requests_from_tensors, tensors_from_results


class _Reply:
    """Collects the rows of one Triton request and sends its single response."""

    def __init__(self, sender, rows: int, return_log_probs: bool, beam_width: int) -> None:
        self.sender = sender
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.beam_width = beam_width
        self.lock = threading.Lock()

    def listeners(self) -> list["_Row"]:
        return [_Row(self, index) for index in range(len(self.results))]

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        errors = [r.error for r in self.results if r.error]
        if any(r.finish_reason == "cancelled" for r in self.results):
            errors.append("cancelled: the client went away or its timeout passed")
        if errors:
            self.sender.send(error_response(errors[0]), flags=FINAL)
        else:
            outputs = tensors_from_results(self.results, self.return_log_probs, self.beam_width)
            self.sender.send(response(outputs), flags=FINAL)


class _Row:
    """One prompt of a request: only its end matters to a unary reply, and whether its client
    is still there, asked every few tokens (a question to the server, so not every token)."""

    CHECK_EVERY = 8  # tokens

    def __init__(self, reply: _Reply, index: int) -> None:
        self.reply, self.index, self.handle = reply, index, None
        self.tokens = 0

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.tokens += 1
        if self.tokens % self.CHECK_EVERY == 0 and self.reply.sender.is_cancelled():
            self.handle.cancel()  # the engine drops the row at its next step

    def on_finish(self, result: GenerationResult) -> None:
        self.reply.finish(self.index, result)


def _parse(request):
    return requests_from_tensors(read_inputs(request, MODEL_STAGE_INPUTS))


def _listeners(sender, rows, return_log_probs: bool) -> list[_Row]:
    return _Reply(sender, len(rows), return_log_probs, rows[0].beam.width).listeners()


class TritonPythonModel:
    def initialize(self, args):
        self.stage = start_engine(args)

    def execute(self, requests):
        submit_requests(self.stage.engine, requests, _parse, _listeners)
        return None

    def finalize(self):
        self.stage.engine.stop()
