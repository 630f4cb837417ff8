"""Triton adapter for the detokenizer; the logic is in ``postprocessing.detokenize``."""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from postprocessing.detokenize import Postprocessor


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = config["parameters"]["tokenizer_path"]["string_value"]
        self.postprocessor = Postprocessor(Path(args["model_repository"]) / path)

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH")
            texts = self.postprocessor.batch(
                tokens, None if lengths is None else lengths.as_numpy()
            )
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", texts)]))
        return responses
