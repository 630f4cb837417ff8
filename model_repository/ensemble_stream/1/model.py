"""Triton adapter for the streaming pipeline (decoupled): one response per piece of text.

preprocessing (a BLS call) -> the ``engine`` model (a BLS call streaming a response per token;
the server's one engine, shared with the unary path) -> incremental detokenization with
``postprocessing.detokenize.IncrementalDecoder``, which never splits a character, so the
pieces concatenate to exactly the unary completion. A client that goes away cancels its
request (Triton marks it cancelled), which is passed on to the engine; it drops the sequence at
its next step. The logic is in backend/engine_calls.py.
"""

from pathlib import Path

from backend.engine_calls import EngineCalls, copied, stream_pieces
from backend.io import model_parameters, read_inputs, requested_outputs
from contract.tensors import ENSEMBLE_INPUTS
from postprocessing.detokenize import Postprocessor


class TritonPythonModel:
    def initialize(self, args):
        path = model_parameters(args)["tokenizer_path"]
        self.postprocessor = Postprocessor(Path(args["model_repository"]) / path)
        self.calls = EngineCalls(args["model_name"])

    def execute(self, requests):
        for request in requests:
            arrays = copied(read_inputs(request, ENSEMBLE_INPUTS))
            stream_pieces(
                self.calls,
                self.postprocessor,
                request.get_response_sender(),
                arrays,
                requested_outputs(request),
            )
        return None

    def finalize(self):
        self.calls.stop()
