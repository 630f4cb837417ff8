"""Triton adapter for the detokenizer; the logic is in ``postprocessing.detokenize``."""

from pathlib import Path

import triton_python_backend_utils as pb_utils

from backend.io import error_response, model_parameters, read_inputs, response
from contract.tensors import POSTPROCESSING_INPUTS
from postprocessing.detokenize import Postprocessor


class TritonPythonModel:
    def initialize(self, args):
        path = model_parameters(args)["tokenizer_path"]
        self.postprocessor = Postprocessor(Path(args["model_repository"]) / path)

    def execute(self, requests):
        inputs = [read_inputs(request, POSTPROCESSING_INPUTS) for request in requests]
        try:
            return [response(out) for out in self.postprocessor.batch_requests(inputs)]
        except Exception:  # find the request that broke the batch; the others still get answers
            return [self._alone(one) for one in inputs]

    def _alone(self, inputs):
        try:
            return response(self.postprocessor.tensors(inputs))
        except Exception as exc:
            pb_utils.Logger.log_error(f"postprocessing failed: {exc!r}")
            return error_response(f"internal error in postprocessing: {exc}")
