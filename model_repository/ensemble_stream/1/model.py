"""Triton adapter for the streaming pipeline (decoupled): one response per piece of text.

tokenize here (``preprocessing.tokenize.Preprocessor``, the ``preprocessing`` model's logic)
-> the ``engine`` model (a BLS call streaming a response per token; the server's one engine,
shared with the unary path) -> incremental detokenization with
``postprocessing.detokenize.IncrementalDecoder``, which never splits a character, so the
pieces concatenate to exactly the unary completion. A client that goes away cancels its
request (Triton marks it cancelled), which is passed on to the engine; it drops the sequence at
its next step. A stop request (``stop`` true, the stream's request id) does the same at once.
The logic is in backend/caller_answers.py.
"""

from pathlib import Path

import numpy as np

from backend.caller_answers import stream_pieces
from backend.engine_calls import EngineCalls, copied
from backend.io import engine_limits, model_parameters, read_inputs, requested_outputs
from backend.stop_request import answer_stream_stop, client_request_id
from contract.tensors import ENSEMBLE_INPUTS, STOP_INPUT
from postprocessing.detokenize import Postprocessor
from preprocessing.tokenize import Preprocessor


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        path = params["tokenizer_path"]
        self.preprocessor = Preprocessor(
            Path(args["model_repository"]) / path, params.get("fim_order", "auto")
        )
        self.postprocessor = Postprocessor(Path(args["model_repository"]) / path)
        self.calls = EngineCalls(args["model_name"], engine_limits(args))

    def execute(self, requests):
        for request in requests:
            arrays = copied(read_inputs(request, (*ENSEMBLE_INPUTS, STOP_INPUT)))
            sender, client_id = request.get_response_sender(), client_request_id(request)
            if bool(np.asarray(arrays.pop(STOP_INPUT.name, False)).any()):
                answer_stream_stop(self.calls, sender, client_id)
                continue
            stream_pieces(
                self.calls,
                self.preprocessor,
                self.postprocessor,
                sender,
                arrays,
                requested_outputs(request),
                client_id,
            )
        return None

    def finalize(self):
        self.calls.stop()
