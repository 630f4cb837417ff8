"""How the engine's callers answer their clients: ``gptj``'s one final response, passed on
from the engine, and ``ensemble_stream``'s text pieces, detokenized as the engine's tokens come.
Both parse their request once (:meth:`backend.engine_calls.EngineCalls.parse`) and answer an
invalid one at once; a stop request naming a call ends it with an error saying so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import triton_python_backend_utils as pb_utils

from backend.engine_calls import Call, EngineCalls
from backend.io import FINAL, error_response, response, tokenize
from backend.stop_request import answer_stop, stopped_message
from contract.options import InvalidRequestError
from contract.tensors import ENGINE_ERROR, RESULT_OUTPUT_NAMES, STOP_INPUT
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.tokenize import Preprocessor


def engine_error(reply) -> str | None:
    """The error an engine response carries: an error response (the first response of a
    request), or the ``error`` output that ends a stream (contract/tensors.py says why)."""
    if reply.has_error():
        return reply.error().message()
    tensor = pb_utils.get_output_tensor_by_name(reply, ENGINE_ERROR.name)
    if tensor is None:
        return None
    return tensor.as_numpy().reshape(-1)[0].decode("utf-8", errors="replace")


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
        rows = calls.parse(arrays, stream=False)
    except InvalidRequestError as exc:
        sender.send(error_response(str(exc)), flags=FINAL)
        return

    def work(call: Call) -> None:
        answer = error_response("internal error: the engine sent no response")
        for reply in calls.responses(call, rows, stream=False):
            if (error := engine_error(reply)) is not None:
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


class _Pieces:
    """A stream's answer: text pieces (never a split character), each with the log probs of
    the tokens it carries, then a final response."""

    def __init__(self, call: Call, decoder: IncrementalDecoder, prompt_len: int, log_probs: bool):
        self.call = call
        self.decoder = decoder
        self.length = prompt_len
        self.want_log_probs = log_probs
        self.pending: list[float] = []  # log probs of tokens not yet sent
        self.cumulative = 0.0
        self.account: dict[str, np.ndarray] = {}  # the engine's finish reason and counts

    def _response(self, piece: str, final: bool = False):
        log_probs = self.pending if self.want_log_probs else [0.0] * len(self.pending)
        self.pending = []
        outputs = {
            "OUTPUT_0": np.array([[piece.encode("utf-8")]], dtype=np.object_),
            "sequence_length": np.array([[self.length]], dtype=np.uint32),
            "cum_log_probs": np.array(
                [[self.cumulative if self.want_log_probs else 0.0]], dtype=np.float32
            ),
            "output_log_probs": np.array([log_probs], dtype=np.float32),
        }
        if final:
            outputs.update(self.account)
        return response(outputs, self.call.requested)

    def push(self, token_ids: list[int], log_probs: list[float]) -> bool:
        """Add one engine response's tokens; send the text they complete as one piece (several
        tokens when the engine ran ahead of this reader). False: the client went away."""
        text = []
        for token_id, log_prob in zip(token_ids, log_probs, strict=True):
            self.length += 1
            self.cumulative += log_prob
            self.pending.append(log_prob)
            text.append(self.decoder.push(token_id))
        piece = "".join(text)
        if not piece:
            return True
        if self.call.client_gone():
            return False
        self.call.send(self._response(piece))
        return True

    def finish(self) -> None:
        self.call.final(self._response(self.decoder.flush(), final=True))


def stream_pieces(
    calls: EngineCalls,
    preprocessor: Preprocessor,
    postprocessor: Postprocessor,
    sender,
    arrays: Mapping[str, np.ndarray],
    requested: frozenset[str] | None = None,
    client_id: str = "",
) -> None:
    """The streaming model: tokenize (in process, ``preprocessing``'s logic), stream the
    engine's tokens (BLS to ``engine``), send text pieces as they complete. A stop request naming
    ``client_id`` ends it with an error saying so."""

    def work(call: Call) -> None:
        try:
            rows = calls.parse(tokenize(preprocessor, arrays), stream=True)
        except InvalidRequestError as exc:
            call.final(error_response(str(exc)))
            return
        prompt, log_probs = rows[0].prompt_ids, rows[0].return_log_probs
        decoder = IncrementalDecoder(postprocessor, prompt, rows[0].held_back)
        pieces = _Pieces(call, decoder, len(prompt), log_probs)
        wanted = True
        for reply in calls.responses(call, rows, stream=True):
            if (error := engine_error(reply)) is not None:
                if wanted and not call.client_gone():
                    why = stopped_message(client_id) if call.stopped else error
                    call.final(error_response(why))
                else:
                    call.final()  # close the request; nobody reads it
                wanted = False
                continue  # an error is the last response: read to the end
            tokens = pb_utils.get_output_tensor_by_name(reply, "output_ids")
            if tokens is None:  # the final response: what happened
                pieces.account = {
                    t.name(): np.array(t.as_numpy())
                    for t in reply.output_tensors()
                    if t.name() in RESULT_OUTPUT_NAMES
                }
            if tokens is None or not wanted:
                continue  # the final response carries nothing; or a cancelled stream drains
            chosen = pb_utils.get_output_tensor_by_name(reply, "output_log_probs").as_numpy()
            if not pieces.push(tokens.as_numpy().reshape(-1).tolist(), chosen.reshape(-1).tolist()):
                wanted = False
                calls.cancel(call)  # the engine drops the row at its next step
        if wanted:
            pieces.finish()
        else:
            call.final()

    calls.start(sender, work, requested, client_id)
