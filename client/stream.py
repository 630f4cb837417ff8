"""Streamed completions: the pieces of one request over gRPC streaming or Triton's HTTP
``generate_stream``, and :class:`CompletionStream`, which a caller iterates and can cancel
(leaving early, ``close()``, Ctrl-C, its timeout, or ``cancel()`` from another thread: each
cancels the request on the server)."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from client.request import CompletionRequest, generate_body, requested_outputs, stop_inputs
from client.results import CodegenError, Completion, TimedOutError
from contract.tensors import STREAM_MODEL

if TYPE_CHECKING:
    from client.client import CodegenClient


class StreamCancelledError(CodegenError):
    """The stream was cancelled by its own reader (``CompletionStream.cancel``)."""

    def __init__(self) -> None:
        super().__init__("the stream was cancelled by the client; the server stops generating")


class StreamCancel:
    """A stream's cancel switch, safe from any thread: sets a flag and wakes the stream's
    reader (``wake``, set by the piece source) so that it cancels the request at once."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.wake: Callable[[], None] | None = None

    def __call__(self) -> None:
        self.requested.set()
        wake = self.wake
        if wake is not None:
            with contextlib.suppress(Exception):
                wake()


_WOKEN = object()  # what a cancel puts on a gRPC stream's answer queue
STOP_WAIT_S = 2.0  # how long a stream left early waits for its stop request's answer


def _protocol_module(protocol: str) -> ModuleType:
    """``tritonclient.grpc`` or ``tritonclient.http``, imported on first use (they are slow
    to import and pull in gRPC / gevent)."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def _flat(value: Any) -> list:
    """A JSON value of a streamed tensor as a list (Triton writes one element as a scalar)."""
    return value if isinstance(value, list) else [value]


@dataclass
class _Piece:
    text: str
    sequence_length: int
    cum_log_prob: float
    log_probs: list[float]


class CompletionStream(Iterator[str]):
    """The pieces of one streamed completion, as the server generates them.

    Iterate it for the text pieces; once exhausted, :attr:`completion` holds the whole
    :class:`Completion` (with token counts). Closing it early (``close()``, leaving a ``with``
    block, ``break`` followed by the stream being dropped, Ctrl-C) cancels the request on the
    server: the gRPC request is stopped (see :func:`grpc_pieces`), the HTTP connection is
    closed.
    """

    def __init__(
        self,
        prompt: str,
        pieces: Iterator[_Piece],
        return_log_probs: bool,
        started: float,
        cancel: StreamCancel | None = None,
    ) -> None:
        self.prompt = prompt
        self._pieces = pieces
        self._cancel = cancel or StreamCancel()
        self._return_log_probs = return_log_probs
        self._started = started
        self._texts: list[str] = []
        self._log_probs: list[float] = []
        self._first: _Piece | None = None
        self._last: _Piece | None = None
        self._first_piece_s: float | None = None
        self.completion: Completion | None = None

    def __iter__(self) -> CompletionStream:
        return self

    def __next__(self) -> str:
        while True:
            try:
                piece = next(self._pieces)
            except StopIteration:
                self._finish()
                raise
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
        total = self._last.sequence_length if self._last else 0
        generated = len(self._log_probs)
        self.completion = Completion(
            prompt=self.prompt,
            completion=completion,
            text=self.prompt + completion,
            total_tokens=total,
            prompt_tokens=total - generated if self._first else None,
            completion_tokens=generated,
            cum_log_prob=self._last.cum_log_prob if self._return_log_probs and self._last else None,
            log_probs=tuple(self._log_probs) if self._return_log_probs else None,
            latency_s=time.perf_counter() - self._started,
            first_piece_s=self._first_piece_s,
        )

    def cancel(self) -> None:
        """Cancel the request on the server, from any thread: a reader waiting for the next
        piece wakes at once with :class:`StreamCancelledError` (``close`` cannot do this: a
        generator cannot be closed while another thread runs it)."""
        self._cancel()

    def close(self) -> None:
        """Stop reading; a request still generating is cancelled on the server."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def grpc_pieces(
    owner: CodegenClient, request: CompletionRequest, cancel: StreamCancel
) -> Iterator[_Piece]:
    """Pieces from gRPC bidirectional streaming; leaving early stops the request: a stop
    request with its id on the same stream (which does not depend on Triton passing the
    stream's cancellation on), then the stream closed; cancelled only if the stop went
    unanswered (:func:`_send_stop` says why)."""
    module = owner._module()
    try:
        # one client per stream: a gRPC client carries at most one stream at a time
        client = module.InferenceServerClient(owner.target.address, ssl=owner.target.ssl)
    except Exception as exc:
        raise owner._error(exc) from exc
    answers: queue.Queue = queue.Queue()
    cancel.wake = lambda: answers.put((None, _WOKEN))
    request_id = f"codegen-stream-{uuid.uuid4().hex}"
    finished = started = False
    try:
        if cancel.requested.is_set():
            raise StreamCancelledError()
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            client.async_stream_infer(
                STREAM_MODEL,
                request.infer_inputs(module),
                outputs=requested_outputs(module),
                request_id=request_id,
                enable_empty_final_response=True,
            )
            started = True
        except Exception as exc:
            # a stream that failed (e.g. nothing listens) reports why through the callback
            reported = None
            with contextlib.suppress(queue.Empty):
                reported = answers.get_nowait()[1]
            raise owner._error(reported or exc) from exc
        while True:
            try:
                result, error = answers.get(timeout=owner.timeout)
            except queue.Empty:
                raise TimedOutError(
                    f"no answer from {owner.url} within {owner.timeout:g} s"
                ) from None
            if error is _WOKEN or cancel.requested.is_set():
                raise StreamCancelledError()
            if error is not None:
                finished = True  # an error response is the request's last: nothing to stop
                raise owner._error(error)
            final = result.get_response().parameters["triton_final_response"].bool_param
            text = result.as_numpy("OUTPUT_0")
            if text is not None:
                yield _Piece(
                    text=text.reshape(-1)[0].decode("utf-8", errors="replace"),
                    sequence_length=int(result.as_numpy("sequence_length").reshape(-1)[0]),
                    cum_log_prob=float(result.as_numpy("cum_log_probs").reshape(-1)[0]),
                    log_probs=[float(x) for x in result.as_numpy("output_log_probs").ravel()],
                )
            if final:
                finished = True
                return
    finally:
        cancel.wake = None
        if started and not finished:
            with contextlib.suppress(Exception):
                finished = _send_stop(client, module, request_id, answers)
        with contextlib.suppress(Exception):
            client.stop_stream(cancel_requests=not finished)
        with contextlib.suppress(Exception):
            client.close()


def _send_stop(client: Any, module: ModuleType, request_id: str, answers: queue.Queue) -> bool:
    """Send the stop request for ``request_id`` on its stream and wait (a little) until both
    the stop request and the stream's request ended (a final response or an error each).
    True: both did, so the stream can be closed without a gRPC cancel. Triton 2.51 races a
    cancellation that arrives while a request is completing (a segfault in its gRPC stream
    handler: triton-inference-server/server#7840), and a stop completes the request just then."""
    client.async_stream_infer(
        STREAM_MODEL, stop_inputs(module), request_id=request_id, enable_empty_final_response=True
    )
    ends = 0
    deadline = time.monotonic() + STOP_WAIT_S
    while ends < 2 and (left := deadline - time.monotonic()) > 0:
        try:
            result, error = answers.get(timeout=left)
        except queue.Empty:
            break
        if error is _WOKEN:
            continue
        ended = error is not None  # an error response is its request's last
        if ended or result.get_response().parameters["triton_final_response"].bool_param:
            ends += 1
    return ends == 2


def http_pieces(
    owner: CodegenClient, request: CompletionRequest, cancel: StreamCancel
) -> Iterator[_Piece]:
    """Pieces from Triton's HTTP ``generate_stream`` (server-sent events); leaving early
    closes the connection, which cancels the request."""
    import requests
    import sseclient

    scheme = "https" if owner.target.ssl else "http"
    endpoint = f"{scheme}://{owner.target.address}/v2/models/{STREAM_MODEL}/generate_stream"
    if cancel.requested.is_set():
        raise StreamCancelledError()
    try:
        response = requests.post(
            endpoint,
            json=generate_body(request),
            stream=True,
            timeout=(owner.connect_timeout, owner.timeout),
        )
    except Exception as exc:
        raise owner._error(exc) from exc
    cancel.wake = response.close  # a read blocked in another thread fails at once
    try:
        if response.status_code != 200:
            raise CodegenError(_http_error_message(response))
        events = sseclient.SSEClient(response.iter_content(chunk_size=None))
        for event in events.events():
            if cancel.requested.is_set():
                raise StreamCancelledError()
            try:
                data = json.loads(event.data)
            except json.JSONDecodeError as exc:
                raise CodegenError(f"unexpected answer from the server: {event.data!r}") from exc
            if "error" in data:
                raise CodegenError(str(data["error"]))
            yield _Piece(
                text=str(_flat(data.get("OUTPUT_0", ""))[0]),
                sequence_length=int(_flat(data.get("sequence_length", 0))[0]),
                cum_log_prob=float(_flat(data.get("cum_log_probs", 0.0))[0]),
                log_probs=[float(x) for x in _flat(data.get("output_log_probs", []))],
            )
        if cancel.requested.is_set():
            raise StreamCancelledError()
    except CodegenError:
        raise
    except Exception as exc:
        if cancel.requested.is_set():
            raise StreamCancelledError() from exc
        raise owner._error(exc) from exc
    finally:
        cancel.wake = None
        response.close()


def _http_error_message(response: Any) -> str:
    """The server's message from a refused HTTP request (JSON or one server-sent event)."""
    body = response.text.strip()
    for candidate in (body, body.removeprefix("data:").strip()):
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    return f"HTTP {response.status_code}: {body or response.reason}"
