"""Triton adapter for the GPT-J stage: tensors in, engine requests out, answers sent later.

The engine (``engine.engine.Engine``) runs in its own thread; ``execute`` only validates and
submits, then returns ``None``. Each Triton request is answered through its response sender
once all of its rows have finished, which lets requests overlap and batch continuously.
"""

import threading

import triton_python_backend_utils as pb_utils

from contract.options import InvalidRequestError
from engine.engine import GenerationResult
from engine.tensors import requests_from_tensors, tensors_from_results
from serving.stage import error_response, read_inputs, start_engine

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Reply:
    """Collects the rows of one Triton request and sends its single response."""

    def __init__(self, sender, rows: int, return_log_probs: bool) -> None:
        self.sender = sender
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.lock = threading.Lock()

    def listener(self, index: int):
        reply = self

        class _Row:
            def on_token(self, token_id: int, log_prob: float) -> None:
                pass

            def on_finish(self, result: GenerationResult) -> None:
                reply.finish(index, result)

        return _Row()

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        errors = [r.error for r in self.results if r.error]
        if errors:
            response = error_response(errors[0])
        else:
            outputs = tensors_from_results(self.results, self.return_log_probs)
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor(k, v) for k, v in outputs.items()]
            )
        self.sender.send(response, flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
        self.stage = start_engine(args)

    def execute(self, requests):
        engine = self.stage.engine
        for request in requests:
            sender = request.get_response_sender()
            try:
                rows, return_log_probs = requests_from_tensors(read_inputs(request))
                for row in rows:
                    engine.validate(row)
            except InvalidRequestError as exc:
                sender.send(error_response(str(exc)), flags=FINAL)
                continue
            engine.wait_for_room(len(rows))  # overload waits in Triton's queue, visibly
            reply = _Reply(sender, len(rows), return_log_probs)
            for index, row in enumerate(rows):
                engine.submit(row, reply.listener(index))
        return None

    def finalize(self):
        self.stage.engine.stop()
