"""Streamed completions: :class:`CompletionStream`, which a caller iterates and can cancel
(leaving early, ``close()``, Ctrl-C, its timeout, or ``cancel()`` from another thread: each
stops the request on the server). The wire is :mod:`client.transport`'s."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from client.results import Closing, Completion, Piece
from client.transport import ResponseStream, StreamCancelledError

__all__ = ["CompletionStream", "StreamCancelledError"]


class CompletionStream(Closing, Iterator[str]):
    """The pieces of one streamed completion, as the server generates them.

    Iterate it for the text pieces; once exhausted, :attr:`completion` holds the whole
    :class:`Completion` (with token counts). Closing it early (``close()``, leaving a ``with``
    block, ``break`` followed by the stream being dropped, Ctrl-C) stops the request on the
    server: over gRPC a stop request by id, then the stream closed; over HTTP the connection
    closed.
    """

    def __init__(
        self,
        prompt: str,
        open_stream: Callable[[], ResponseStream],
        return_log_probs: bool,
        started: float,
    ) -> None:
        self.prompt = prompt
        self._open = open_stream  # on the first read: server errors are raised while iterating
        self._stream: ResponseStream | None = None
        self._cancelled = False
        self._pieces = self._read()
        self._return_log_probs = return_log_probs
        self._started = started
        self._texts: list[str] = []
        self._log_probs: list[float] = []
        self._first: Piece | None = None
        self._last: Piece | None = None
        self._accounted: Piece | None = None  # the piece with the engine's account
        self._first_piece_s: float | None = None
        self.completion: Completion | None = None

    def _read(self) -> Iterator[Piece]:
        if self._cancelled:
            raise StreamCancelledError()
        self._stream = self._open()
        yield from self._stream.pieces()

    def __iter__(self) -> CompletionStream:
        return self

    def __next__(self) -> str:
        while True:
            try:
                piece = next(self._pieces)
            except StopIteration:
                self._finish()
                raise
            if piece.finish_reason is not None:
                self._accounted = piece
            if piece.sequence_length is not None:
                self._first = self._first or piece
                self._last = piece
            self._log_probs.extend(piece.log_probs)
            if piece.text:
                self._first_piece_s = self._first_piece_s or time.perf_counter() - self._started
                self._texts.append(piece.text)
                return piece.text

    def _finish(self) -> None:
        if self.completion is not None:
            return
        completion = "".join(self._texts)
        total = self._last.sequence_length or 0 if self._last else 0
        generated = len(self._log_probs)
        last = self._last
        self.completion = Completion(
            prompt=self.prompt,
            completion=completion,
            text=self.prompt + completion,
            total_tokens=total,
            prompt_tokens=self._account(
                "prompt_tokens", total - generated if self._first else None
            ),
            completion_tokens=self._account("completion_tokens", generated),
            finish_reason=self._account("finish_reason", None),
            cum_log_prob=last.cum_log_prob if self._return_log_probs and last else None,
            log_probs=tuple(self._log_probs) if self._return_log_probs else None,
            latency_s=time.perf_counter() - self._started,
            first_piece_s=self._first_piece_s,
        )

    @property
    def finish_reason(self) -> str | None:
        """Why the generation ended, once the final piece came (the engine's reason,
        contract/finish.py), even before the iteration ended; None before."""
        return self._accounted.finish_reason if self._accounted else None

    def _account(self, name: str, otherwise):
        """The engine's account on the last piece, or ``otherwise`` from a server without it."""
        value = getattr(self._accounted, name, None) if self._accounted else None
        return otherwise if value is None else value

    def cancel(self) -> None:
        """Cancel the request on the server, from any thread: a reader waiting for the next
        piece wakes at once with :class:`StreamCancelledError` (``close`` cannot do this: a
        generator cannot be closed while another thread runs it)."""
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel()

    def close(self) -> None:
        """Stop reading; a request still generating is stopped on the server."""
        self._pieces.close()
        if self._stream is not None:
            self._stream.close()
