"""Triton adapter for the GPT-J stage of the unary ensemble (also called directly).

It runs no engine: each request goes to the ``engine`` model (the one engine of the server,
shared with the streaming model) and its one final response comes back in this stage's layout.
``execute`` returns at once and a worker thread answers through the response sender, so
requests overlap and batch in the engine; backend/caller_answers.py has the logic.
"""

from backend.caller_answers import forward_final
from backend.engine_calls import EngineCalls, copied
from backend.io import engine_limits, read_inputs, requested_outputs
from backend.stop_request import client_request_id
from contract.tensors import MODEL_STAGE_INPUTS, STOP_INPUT


class TritonPythonModel:
    def initialize(self, args):
        self.calls = EngineCalls(args["model_name"], engine_limits(args))

    def execute(self, requests):
        for request in requests:
            arrays = copied(read_inputs(request, (*MODEL_STAGE_INPUTS, STOP_INPUT)))
            forward_final(
                self.calls,
                request.get_response_sender(),
                arrays,
                requested_outputs(request),
                client_request_id(request),
            )
        return None

    def finalize(self):
        self.calls.stop()
