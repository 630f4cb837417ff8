"""How the engine model answers: one thread of its own sends every response, never the
engine's.

A response sent from the python backend is a round trip to the server and, for a BLS caller,
on to the caller's stub, which must queue it before ``send`` returns. Sent from the engine's
thread, that was a round trip per streamed row per token (64 a step at a full batch), and the
engine stepped only between them. Here the engine only hands tokens over and steps on; the
sender thread sends each stream's tokens as one response, so a stream whose last response is
still on its way gets its new tokens together in the next. Whether a client went away (a
question to the server too) is asked from the same thread, in order with the final response:
asking it of a request already answered crashes r24.10 (backend/engine_calls.py, ``Call``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from backend.io import FINAL, error_response, response
from contract.tensors import ENGINE_ERROR
from engine.interface import GenerationRequest, GenerationResult
from engine.tensors import tensors_from_results

CANCELLED = "cancelled: the client went away or its timeout passed"
CHECK_EVERY = 8  # tokens between two questions to Triton whether a client went away


class ResponsePump:
    """The thread that sends the engine's responses, in the order they were handed over."""

    def __init__(self) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="engine-replies", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception as exc:  # one request's failure must not stop the others' answers
                pb_utils.Logger.log_error(f"could not send an engine response: {exc!r}")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


class UnaryReply:
    """Collects the rows of one unary request and sends its single response."""

    def __init__(
        self,
        pump: ResponsePump,
        sender,
        rows: int,
        return_log_probs: bool,
        beam_width: int,
        done: Callable[[], None],
        requested: frozenset[str] | None = None,
    ) -> None:
        self.pump, self.sender = pump, sender
        self.requested = requested
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.beam_width = beam_width
        self.done = done
        self.lock = threading.Lock()
        self.answered = False  # only the pump's thread reads and writes it

    def listeners(self) -> list[UnaryRow]:
        return [UnaryRow(self, index) for index in range(len(self.results))]

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        self.pump.submit(self._send)

    def _send(self) -> None:
        self.answered = True
        self.done()
        errors = [r.error for r in self.results if r.error]
        if any(r.finish_reason == "cancelled" for r in self.results):
            errors.append(CANCELLED)
        if errors:
            self.sender.send(error_response(errors[0]), flags=FINAL)
        else:
            outputs = tensors_from_results(self.results, self.return_log_probs, self.beam_width)
            self.sender.send(response(outputs, self.requested), flags=FINAL)


class UnaryRow:
    """One prompt of a unary request: only its end matters, and whether its client is still
    there (a direct client of the engine model; a BLS caller cancels through the channel),
    asked every few tokens (a question to the server, so not every token)."""

    def __init__(self, reply: UnaryReply, index: int) -> None:
        self.reply, self.index, self.handle = reply, index, None
        self.tokens = 0
        self.checking = False  # a question already waits for the pump

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.tokens += 1
        if self.tokens % CHECK_EVERY == 0 and not self.checking:
            self.checking = True
            self.reply.pump.submit(self._check)

    def _check(self) -> None:
        self.checking = False
        if not self.reply.answered and self.reply.sender.is_cancelled():
            self.handle.cancel()  # the engine drops the row at its next step

    def on_finish(self, result: GenerationResult) -> None:
        self.reply.finish(self.index, result)


class StreamReply:
    """One streamed prompt: responses carrying the tokens generated since the last one (the
    length so far), then a final response (an error, or none)."""

    def __init__(
        self,
        pump: ResponsePump,
        sender,
        row: GenerationRequest,
        log_probs: bool,
        done: Callable[[], None],
        requested: frozenset[str] | None = None,
    ) -> None:
        self.pump, self.sender, self.done, self.handle = pump, sender, done, None
        self.requested = requested
        self.want_log_probs = log_probs
        self.lock = threading.Lock()
        self.tokens: list[int] = []  # handed over, not yet sent
        self.log_probs: list[float] = []
        self.result: GenerationResult | None = None
        self.queued = False
        # the pump's thread alone uses these
        self.length = len(row.prompt_ids)
        self.cumulative = 0.0
        self.unchecked = 0
        self.closed = False

    def on_token(self, token_id: int, log_prob: float) -> None:
        with self.lock:
            self.tokens.append(token_id)
            self.log_probs.append(log_prob if self.want_log_probs else 0.0)
            self._queue()

    def on_finish(self, result: GenerationResult) -> None:
        with self.lock:
            self.result = result
            self._queue()

    def _queue(self) -> None:
        if not self.queued:
            self.queued = True
            self.pump.submit(self._flush)

    def _flush(self) -> None:
        with self.lock:
            tokens, log_probs, result = self.tokens, self.log_probs, self.result
            self.tokens, self.log_probs = [], []
            self.queued = False
        if self.closed:
            return
        if tokens:
            try:
                self._send_tokens(tokens, log_probs)
            except Exception as exc:  # still send the final response, which the caller awaits
                pb_utils.Logger.log_error(f"could not send a stream's tokens: {exc!r}")
        if result is not None:
            self._finish(result)

    def _send_tokens(self, tokens: list[int], log_probs: list[float]) -> None:
        self.length += len(tokens)
        self.cumulative += sum(log_probs)
        self.unchecked += len(tokens)
        if self.unchecked >= CHECK_EVERY:
            self.unchecked = 0
            if self.sender.is_cancelled():
                self.handle.cancel()
                return
        outputs = {
            "output_ids": np.array([[tokens]], dtype=np.uint32),
            "sequence_length": np.array([[self.length]], dtype=np.uint32),
            "cum_log_probs": np.array([[self.cumulative]], dtype=np.float32),
            "output_log_probs": np.array([[log_probs]], dtype=np.float32),
        }
        self.sender.send(response(outputs, self.requested))

    def _finish(self, result: GenerationResult) -> None:
        self.closed = True
        self.done()
        message = result.error or (CANCELLED if result.finish_reason == "cancelled" else None)
        if message is None:
            self.sender.send(flags=FINAL)
        elif self.requested is None or ENGINE_ERROR.name in self.requested:
            error = np.array([[message.encode()]], dtype=np.object_)
            self.sender.send(response({ENGINE_ERROR.name: error}, self.requested), flags=FINAL)
        else:  # a direct gRPC client that did not ask for the error output
            self.sender.send(error_response(message), flags=FINAL)
