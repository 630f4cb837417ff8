"""The engine model's answers, sent by a thread of their own rather than the engine's.

In python_backend r24.10 a response's ``send`` is a round trip: it returns once the caller's
stub has queued the response (backend/bls_ready.py), about 0.25 ms on an idle 2-core machine
and more under load. Sent from the engine's thread, every answer held up the next forward pass.

So the engine's thread only records what is to be said, and :class:`Deliveries` says it, in
order. A stream whose earlier tokens are still waiting when new ones come gets them all in one
response (its outputs hold that response's new tokens, as the contract allows). The metrics'
round trips (backend/engine_stage.py, ``EngineMetrics``) go through the same thread.

How far a stream may run ahead of its hand-over is bounded (``stream_run_ahead`` tokens, the
engine's config): after each step the engine's thread waits while a stream has that many tokens
not handed over. Unbounded, a fast model generated tens of tokens for a client that had already
left (they were on their way to it); bounded at 1, a step waits for every stream's sends.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from backend.io import FINAL, error_response, response
from contract.finish import STOP_WORD
from engine.interface import GenerationRequest, GenerationResult
from engine.tensors import result_account, tensors_from_results
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from postprocessing.stop_text import StopText

log = logging.getLogger(__name__)

CANCELLED = "cancelled: the client went away or its timeout passed"
# The longest the engine's thread waits for its answers to catch up (a caller that hangs must
# not stop everyone's generation)
KEEP_UP_S = 1.0
CHECK_EVERY = 8  # tokens between two questions to Triton whether a client went away


class Deliveries:
    """One thread that runs what the engine's thread hands it, in the order handed."""

    def __init__(self, run_ahead: int = 1, name: str = "engine-answers") -> None:
        if run_ahead < 1:
            raise ValueError(f"stream_run_ahead must be at least 1, got {run_ahead}")
        self.run_ahead = run_ahead
        self._cond = threading.Condition()
        self._work: deque[Callable[[], None]] = deque()
        self._behind: set[int] = set()  # streams with run_ahead or more tokens unsent
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, work: Callable[[], None]) -> None:
        with self._cond:
            self._work.append(work)
            self._cond.notify_all()

    def behind(self, stream: int, is_behind: bool) -> None:
        """Stream ``stream`` (an id) has ``run_ahead`` or more unsent tokens, or no more."""
        with self._cond:
            if is_behind:
                self._behind.add(stream)
            elif stream in self._behind:
                self._behind.discard(stream)
                self._cond.notify_all()

    def keep_up(self) -> None:
        """(the engine's thread, after each step) Wait while a stream has ``run_ahead`` or more
        tokens not handed over, so that a client that leaves finds little generated for it."""
        with self._cond:
            caught_up = self._cond.wait_for(lambda: not self._behind, KEEP_UP_S)
        if not caught_up:
            log.warning("the engine's answers are over %.0f s behind: stepping on", KEEP_UP_S)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._work and not self._stopping:
                    self._cond.wait()
                if not self._work:
                    return
                work = self._work.popleft()
            try:
                work()
            except Exception:  # one answer failing must not stop the others
                log.exception("sending an engine answer failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)


class Reply:
    """Collects the rows of one unary request; its single response is sent by ``deliveries``."""

    def __init__(
        self,
        sender,
        rows: int,
        return_log_probs: bool,
        beam_width: int,
        done: Callable[[], None],
        deliveries: Deliveries,
        requested: frozenset[str] | None = None,
        watch_client: bool = True,
    ) -> None:
        self.sender = sender
        self.requested = requested
        # whether Triton can say that its client went away: not for a BLS caller's request,
        # whose cancellation Triton 2.51 does not pass on (the caller's comes by
        # backend/cancel.py), and asking is a round trip on the engine's thread
        self.watch_client = watch_client
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.beam_width = beam_width
        self.done = done
        self.deliveries = deliveries
        self.lock = threading.Lock()

    def listeners(self, stops: Sequence[TextStop | None] = ()) -> list[Row]:
        """A listener per row; ``stops``: each row's stop words to find in its text."""
        stops = list(stops) or [None] * len(self.results)
        return [Row(self, index, stop) for index, stop in enumerate(stops)]

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        self.done()
        self.deliveries.call(self._send)

    def _send(self) -> None:
        results = [r for r in self.results if r is not None]
        errors = [r.error for r in results if r.error]
        if any(r.finish_reason == "cancelled" for r in results):
            errors.append(CANCELLED)
        if errors:
            self.sender.send(error_response(errors[0]), flags=FINAL)
        else:
            outputs = tensors_from_results(results, self.return_log_probs, self.beam_width)
            self.sender.send(response(outputs, self.requested), flags=FINAL)


class TextStop:
    """A unary row's stop words found in its text, as :class:`TextStream` finds a stream's:
    the engine matches them on tokens only, and the model may write a stop word in other
    tokens (one that ends inside a token, or a ``"\\n\\n"`` inside ``"\\n\\n\\n"``)."""

    def __init__(self, decoder: IncrementalDecoder, words: Sequence[str]) -> None:
        self.decoder = decoder
        self.stop_text = StopText(words)

    @classmethod
    def of(cls, postprocessor: Postprocessor, row: GenerationRequest) -> TextStop | None:
        """None for a row without stop words, or a beam search (its tokens are not final
        until it ends; the engine refuses or matches its stop words on tokens)."""
        words = [postprocessor.decode(list(word)) for word in row.stop_words]
        if not any(words) or row.beam.width > 1:
            return None
        return cls(IncrementalDecoder(postprocessor, row.prompt_ids, row.held_back), words)

    def ends_at(self, token_id: int) -> bool:
        """Whether the text reaches a stop word with this token."""
        return self.stop_text.push(self.decoder.push(token_id))[1]


class Row:
    """One prompt of a unary request: only its end matters, and whether its client is still
    there (a direct client of the engine model; a BLS caller cancels through the channel),
    asked every few tokens (a question to the server, so not every token). With a
    :class:`TextStop`, a stop word found in its text ends it at that token: the row is
    dropped, and its answer is what came through that token, ``stop_word``."""

    def __init__(self, reply: Reply, index: int, stop: TextStop | None = None) -> None:
        self.reply, self.index, self.handle = reply, index, None
        self.stop = stop
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.stopped = False  # a stop word in its text ended it

    def on_token(self, token_id: int, log_prob: float) -> None:
        if self.stopped:
            return
        self.tokens.append(token_id)
        self.log_probs.append(log_prob)
        if self.stop is not None and self.stop.ends_at(token_id):
            self.stopped = True
            self.handle.cancel()  # the engine drops the row at its next step
        elif (
            self.reply.watch_client
            and len(self.tokens) % CHECK_EVERY == 0
            and self.reply.sender.is_cancelled()
        ):
            self.handle.cancel()

    def on_finish(self, result: GenerationResult) -> None:
        if self.stopped:  # the engine's account of it (timings, reuse), cut at the stop word
            count = len(self.tokens)
            result = dataclasses.replace(
                result,
                output_ids=self.tokens,
                log_probs=self.log_probs,
                finish_reason=STOP_WORD,
                error=None,
                tokens_past_stop=max(0, len(result.output_ids) - count),
            )
        self.reply.finish(self.index, result)


class TextStream:
    """One streamed prompt, answered in text: a response with each piece the new tokens
    complete (never a split character; several tokens at once when the reader lags), then a
    final one with the rest of the text and what happened, or an error. A stop word found in
    the text ends it there, with the stop word last (postprocessing/stop_text.py), even where
    the engine's match on tokens did not end the row.

    After each piece it asks Triton whether the client went away (deliveries' thread, so the
    engine never waits on that round trip); if so the row is dropped at the engine's next step.
    """

    def __init__(
        self,
        sender,
        row: GenerationRequest,
        decoder: IncrementalDecoder,
        done: Callable[[], None],
        deliveries: Deliveries,
        requested: frozenset[str] | None = None,
        client_id: str = "",
        stop_words: tuple[str, ...] = (),
    ):
        self.sender, self.done, self.handle = sender, done, None
        self.decoder = decoder
        self.stop_text = StopText(stop_words)
        self.prompt_ids = row.prompt_ids
        self.generated: list[int] = []  # the tokens read so far (their text sent or held)
        self._ended = False  # a stop word in the text ended it: its final response is sent
        self.deliveries = deliveries
        self.requested = requested
        self.client_id = client_id
        self.stopped = False  # a stop request named it
        self.length = len(row.prompt_ids)
        self.want_log_probs = row.return_log_probs
        self.cumulative = 0.0
        self._lock = threading.Lock()
        self._tokens: list[int] = []  # generated, not yet handed to deliveries
        self._log_probs: list[float] = []
        self._unsent_log_probs: list[float] = []  # of tokens whose text is not yet sent
        self._result: GenerationResult | None = None
        self._queued = False  # a flush is waiting in deliveries
        self._unsent = 0  # generated, their response not yet handed over
        self._gone = False
        self.generating = False  # its first token came: its prompt is prefilled
        self.passes_waited = 0  # engine passes seen since it was submitted, before its first token

    def on_token(self, token_id: int, log_prob: float) -> None:
        with self._lock:
            self.generating = True
            if self._gone:
                return
            self._tokens.append(token_id)
            self._log_probs.append(log_prob if self.want_log_probs else 0.0)
            self._unsent += 1
            if self._unsent == self.deliveries.run_ahead:
                self.deliveries.behind(id(self), True)
            self._queue()

    def on_finish(self, result: GenerationResult) -> None:
        self.done()
        with self._lock:
            self._result = result
            self._queue()

    def ask_if_left(self) -> None:
        """(deliveries' thread, after an engine step) Whether the client of a stream still in
        its prefill went away: a long prompt is prefilled in chunks, one per step, and sends no
        piece until it ends, so without this a prompt nobody waits for any more is prefilled
        to its end. Asked on the thread that sends the final response, and only while its
        result has not come: asking a request already answered crashes r24.10."""
        with self._lock:
            waiting = not self.generating and self._result is None and not self._gone
        if waiting and self.handle is not None and self.sender.is_cancelled():
            self._gone = True
            self.handle.cancel()  # the engine drops the row before its next step

    def stop(self) -> None:
        """A stop request named this stream: it ends with an error saying so."""
        self.stopped = True
        self.handle.cancel()

    def _queue(self) -> None:
        """(under the lock) Have deliveries flush this stream, once however many wait."""
        if not self._queued:
            self._queued = True
            self.deliveries.call(self._flush)

    def _flush(self) -> None:
        """Deliveries' thread: send what is waiting, in one response, then the end if it came."""
        with self._lock:
            tokens, log_probs = self._tokens, self._log_probs
            self._tokens, self._log_probs = [], []
            result, self._queued = self._result, False
        if tokens and not self._gone:
            try:
                self._send_text(tokens, log_probs)
            except Exception:  # the end, if it came, is still sent: the request must close
                log.exception("sending a stream's text failed; it is cancelled")
        with self._lock:
            self._unsent -= len(tokens)
            if self._unsent < self.deliveries.run_ahead or self._gone or result is not None:
                self.deliveries.behind(id(self), False)
        if result is not None and not self._ended:
            self._send_end(result)

    def _outputs(self, piece: str) -> dict[str, np.ndarray]:
        log_probs, self._unsent_log_probs = self._unsent_log_probs, []
        return {
            "OUTPUT_0": np.array([[piece.encode("utf-8")]], dtype=np.object_),
            "sequence_length": np.array([[self.length]], dtype=np.uint32),
            "cum_log_probs": np.array([[self.cumulative]], dtype=np.float32),
            "output_log_probs": np.array([log_probs], dtype=np.float32),
        }

    def _send_text(self, tokens: list[int], log_probs: list[float]) -> None:
        piece, stopped, before = "", False, len(self.generated)
        for token in tokens:  # one by one: a stop word's last token is where the answer ends
            self.generated.append(token)
            text, stopped = self.stop_text.push(self.decoder.push(token))
            piece += text
            if stopped:
                break
        count = len(self.generated) - before
        self.length += count
        self.cumulative += sum(log_probs[:count])
        self._unsent_log_probs.extend(log_probs[:count])
        if not piece and not stopped:
            return  # a character not complete yet: its tokens go with the next piece
        try:
            if stopped:
                self._end_at_stop_word(piece)
                return
            self.sender.send(response(self._outputs(piece), self.requested))
        except Exception:
            self._gone = True  # the request cannot be answered any more: stop generating it
            self.handle.cancel()
            raise
        # asked after the piece went, not before: the question is a round trip (0.2-0.3 ms),
        # and a piece sent to a client that left is dropped by the server
        if self.sender.is_cancelled():  # the client left: stop generating for it
            self._gone = True
            self.handle.cancel()

    def _end_at_stop_word(self, piece: str) -> None:
        """The text reached a stop word: answer with it and the account now, and drop the row
        (its later tokens and its end are not sent: the request is answered)."""
        self._gone = True
        self.handle.cancel()
        ended = GenerationResult(self.prompt_ids, self.generated, [], STOP_WORD)
        outputs = self._outputs(piece) | result_account([ended])
        self.sender.send(response(outputs, self.requested), flags=FINAL)
        self._ended = True  # (a send that failed leaves the row's own end to close it)

    def _send_end(self, result: GenerationResult) -> None:
        message = result.error
        if message is None and result.finish_reason == "cancelled":
            message = stopped_message(self.client_id) if self.stopped else CANCELLED
        if message is not None:
            self.sender.send(error_response(message), flags=FINAL)
            return
        tail, stopped = self.stop_text.push(self.decoder.flush())
        outputs = self._outputs(tail if stopped else tail + self.stop_text.flush())
        outputs |= result_account([result])
        self.sender.send(response(outputs, self.requested), flags=FINAL)


def stopped_message(client_id: str) -> str:
    return f"stopped: a stop request for request id {client_id!r} ended this generation"
