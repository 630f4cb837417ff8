"""How ``gptj`` answers its clients: the engine's one final response, passed on. It checks
its request (:meth:`backend.engine_calls.EngineCalls.check`) and answers an invalid one at once;
a stop request naming a call ends it with an error saying so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import triton_python_backend_utils as pb_utils

from backend.engine_answers import stopped_message
from backend.engine_calls import Call, EngineCalls
from backend.io import FINAL, error_response
from backend.stop_request import answer_stop
from contract.options import InvalidRequestError
from contract.tensors import STOP_INPUT


def forward_final(
    calls: EngineCalls,
    sender,
    arrays: Mapping[str, np.ndarray],
    requested: frozenset[str] | None = None,
    client_id: str = "",
) -> None:
    """The unary model stage: the engine's one final response, passed on (the outputs the
    request asked for). An invalid request is answered at once, in ``execute``; a stop
    request (``stop`` true) stops the requests with its id (see :func:`answer_stop`)."""
    arrays = dict(arrays)
    if bool(np.asarray(arrays.pop(STOP_INPUT.name, False)).any()):
        answer_stop(calls, sender, arrays, client_id, requested)
        return
    try:
        calls.check(arrays)
    except InvalidRequestError as exc:
        sender.send(error_response(str(exc)), flags=FINAL)
        return

    def work(call: Call) -> None:
        answer = error_response("internal error: the engine sent no response")
        for reply in calls.responses(call, arrays):
            if reply.has_error():
                error = reply.error().message()
                answer = error_response(stopped_message(client_id) if call.stopped else error)
            elif reply.output_tensors():
                tensors = [
                    tensor
                    for tensor in reply.output_tensors()
                    if requested is None or tensor.name() in requested
                ]
                answer = pb_utils.InferenceResponse(output_tensors=tensors)
        call.final(answer)

    calls.start(sender, work, requested, client_id)
