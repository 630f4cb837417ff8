"""Triton adapter for the tokenizer; the logic is in ``preprocessing.tokenize``."""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from contract.options import InvalidRequestError
from preprocessing.tokenize import Preprocessor


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = config["parameters"]["tokenizer_path"]["string_value"]
        self.preprocessor = Preprocessor(Path(args["model_repository"]) / path)

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        def get(name):
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

        try:
            ids, lengths = self.preprocessor.prompts(get("QUERY"))
            bad = self.preprocessor.words(get("BAD_WORDS_DICT"), "INPUT_2 (bad words)")
            stop = self.preprocessor.words(get("STOP_WORDS_DICT"), "INPUT_3 (stop words)")
        except InvalidRequestError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        outputs = {
            "INPUT_ID": ids,
            "REQUEST_INPUT_LEN": lengths,
            "BAD_WORDS_IDS": bad,
            "STOP_WORDS_IDS": stop,
            "REQUEST_OUTPUT_LEN": get("REQUEST_OUTPUT_LEN"),
        }
        return pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])
