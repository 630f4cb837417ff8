"""Triton adapter for the server's one engine (decoupled), which ``gptj`` and
``ensemble_stream`` call (BLS): one copy of the weights, one running batch for both paths.

``execute`` validates and submits each request, then returns ``None``; the engine's thread
answers through the response senders (backend/engine_answers.py), once per request (unary)
or with each new token (``stream``; several at once when the reader lags).
A caller whose client went away cancels through the channel in backend/cancel.py.
"""

from backend.engine_stage import start_engine, submit_requests


class TritonPythonModel:
    def initialize(self, args):
        self.stage = start_engine(args)

    def execute(self, requests):
        submit_requests(self.stage, requests)
        return None

    def finalize(self):
        self.stage.stop()
