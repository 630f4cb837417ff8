"""Triton adapter for the tokenizer; the logic is in ``preprocessing.tokenize``."""

from pathlib import Path

import triton_python_backend_utils as pb_utils

from backend.io import error_response, model_parameters, read_inputs, response
from contract.options import InvalidRequestError
from contract.tensors import PREPROCESSING_INPUTS
from preprocessing.tokenize import Preprocessor


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        path = params["tokenizer_path"]
        self.preprocessor = Preprocessor(
            Path(args["model_repository"]) / path, params.get("fim_order", "auto")
        )

    def execute(self, requests):
        inputs = [read_inputs(request, PREPROCESSING_INPUTS) for request in requests]
        try:
            answers = self.preprocessor.batch(inputs)
        except Exception:  # find the request that broke the batch; the others still get answers
            answers = [self._alone(one) for one in inputs]
        return [_respond(answer) for answer in answers]

    def _alone(self, inputs):
        try:
            return self.preprocessor.batch([inputs])[0]
        except Exception as exc:
            return exc


def _respond(answer):
    if isinstance(answer, InvalidRequestError):
        return error_response(str(answer))
    if isinstance(answer, Exception):  # a bug: fail this request only, and say so in the log
        pb_utils.Logger.log_error(f"preprocessing failed: {answer!r}")
        return error_response(f"internal error in preprocessing: {answer}")
    return response(answer)
