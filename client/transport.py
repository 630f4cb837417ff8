"""How a request travels, written once for the client and every load profile: unary gRPC and
HTTP through ``tritonclient``, a gRPC stream, Triton's HTTP ``generate_stream`` and the
OpenAI API's server-sent events (``httpx``), stop by request id, and every failure as the
client's own error types (:mod:`client.results`).

A stream is a :class:`ResponseStream`: its answers arrive on a queue (gRPC's callback thread,
or a reader thread for HTTP), so a reader waits with a timeout of its own choosing
(:meth:`ResponseStream.read`), any thread can wake it (:meth:`~ResponseStream.cancel`), and
leaving it is :meth:`~ResponseStream.close` (a stop request by id first, as the product client
does) or :meth:`~ResponseStream.abandon` (the connection dropped, as an editor does).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from client import request as wire
from client.request import CompletionRequest, generate_body, stop_inputs
from client.results import (
    Closing,
    CodegenError,
    Piece,
    ServerUnavailableError,
    Target,
    TimedOutError,
    error_message,
    resolve_target,
)
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL

STOP_WAIT_S = 2.0  # how long a stream left early waits for its stop request's answer
REPORT_WAIT_S = 5.0  # how long a stream that failed to start waits to be told why
IDLE_STREAM_CLIENTS = 32  # gRPC stream clients kept open per server for the next streams
_WOKEN = object()  # what a cancel puts on a stream's answer queue


class StreamCancelledError(CodegenError):
    """The stream was cancelled by its own reader (``cancel``)."""

    def __init__(self) -> None:
        super().__init__("the stream was cancelled by the client; the server stops generating")


def protocol_module(protocol: str) -> ModuleType:
    """``tritonclient.grpc`` or ``tritonclient.http``, imported on first use (they are slow
    to import and pull in gRPC / gevent)."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


class ResponseStream:
    """The answers of one streamed request, read with a timeout, cancelled from any thread."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.answers: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.finished = False  # the last answer (or an error) came: nothing left to stop
        # an HTTP stream's reader leaves by itself once it has read this many pieces of text:
        # a client that leaves at its first piece, without a hand-off to another thread first
        self.leave_after: int | None = None

    def read(self, timeout: float) -> Piece | None:
        """The next answer, or None when none came within ``timeout`` seconds. Raises the
        server's error as a CodegenError, StreamCancelledError once cancelled."""
        if self.cancelled.is_set():
            raise StreamCancelledError()
        try:
            answer, error = self.answers.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if error is _WOKEN or self.cancelled.is_set():
            raise StreamCancelledError()
        if error is not None:
            self.finished = True  # an error response is the request's last
            raise self.transport.error(error)
        self.finished = answer.final
        return answer

    def pieces(self) -> Iterator[Piece]:
        """Every answer to the last, each waited for up to the transport's timeout; the
        stream is closed when they end, fail, or the reader leaves."""
        try:
            while not self.finished:
                piece = self.read(self.transport.timeout)
                if piece is None:
                    url, timeout = self.transport.url, self.transport.timeout
                    raise TimedOutError(f"no answer from {url} within {timeout:g} s")
                yield piece
        finally:
            self.close()

    def cancel(self) -> None:
        """Wake a reader at once with StreamCancelledError (safe from any thread)."""
        self.cancelled.set()
        self.answers.put((None, _WOKEN))

    def close(self) -> None:
        """Leave the stream; a request still generating is stopped on the server."""

    def abandon(self) -> None:
        """Leave at once, dropping the connection (what an editor does at a keystroke)."""


class StreamSession:
    """A gRPC client and its bidirectional stream, carrying one request at a time and kept
    open between them: the next request is one more message on it.

    A request that ended with its final answer leaves the stream clean, ready for the next;
    one that failed, was stopped or cancelled closes it (an error response leaves no sign of
    which request it ended, so nothing later could tell a stale one). A kept stream the server
    closed meanwhile (it restarted, say) is noticed, and the next request starts a fresh one."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.open = False  # a stream is started on the client
        self._reader: GrpcStream | None = None  # whose request the stream carries now

    def send(self, reader: GrpcStream, model: str, inputs: list, request_id: str) -> None:
        """Send ``reader``'s request, whose answers go to it until :meth:`release`."""
        self._reader = reader
        kept = self.open
        if not self.open:
            self.client.start_stream(callback=self._answer)
            self.open = True
        try:
            self._infer(model, inputs, request_id)
        except Exception:
            if not kept:
                raise
            self.close(cancel=True)  # a kept stream that died unnoticed: once more, fresh
            self.client.start_stream(callback=self._answer)
            self.open = True
            self._infer(model, inputs, request_id)

    def _infer(self, model: str, inputs: list, request_id: str) -> None:
        self.client.async_stream_infer(
            model,
            inputs,
            outputs=self._reader.outputs,
            request_id=request_id,
            enable_empty_final_response=True,
        )

    def stop_request(self, model: str, request_id: str) -> None:
        """The stop request for ``request_id`` (:meth:`GrpcStream.close`), on this stream."""
        self.client.async_stream_infer(
            model,
            stop_inputs(self._reader.module),
            request_id=request_id,
            enable_empty_final_response=True,
        )

    def _answer(self, result: Any, error: Any) -> None:
        reader = self._reader
        if reader is not None:
            reader.answer(result, error)
        elif error is not None:  # the kept stream ended between requests
            self.open = False

    def release(self, keep_stream: bool, cancel: bool) -> bool:
        """The request ended (or was left): keep the stream for the next request, or close
        it (a cancel drops what it still carries). Whether the client can be used again."""
        self._reader = None
        if keep_stream and self.open and not _under_gevent():
            return True
        return self.close(cancel)

    def close(self, cancel: bool) -> bool:
        self.open = False
        try:
            self.client.stop_stream(cancel_requests=cancel)
        except Exception:
            return False
        return True


def _under_gevent() -> bool:
    """Whether gevent has patched this process's threads (a Locust load harness). gRPC then
    polls an open stream's channel in a greenlet that blocks the whole process while it waits:
    idle kept streams starved the soak's users until requests went unanswered (`make soak`).
    There a session keeps its client and channel, and each request starts its own stream."""
    gevent = sys.modules.get("gevent.monkey")
    return gevent is not None and gevent.is_module_patched("threading")


class StreamClients:
    """The process's gRPC stream sessions, kept open between streams, by server.

    tritonclient runs one stream at a time on an ``InferenceServerClient``, and each client
    opens a channel of its own. Made for every request, the channel and its connection (2.7 ms)
    and the stream's two threads (1.25 ms) were in each stream's first token (a warm resent
    prompt, docs/performance.md). A request takes an idle session here and gives it back when it
    ends, so the channel and the stream are made once and carry request after request. A
    session never carries two requests at once (streams sharing one channel at once hung the
    editor profile's gRPC typists under gevent, tests/test_loadtest_editor_server.py). The
    pool is the process's, not a transport's: the API gives each worker thread a client of its
    own, and their streams reuse the same sessions. The sessions' channels to one server share
    one TCP connection (gRPC's subchannel pool): streams in flight at once are HTTP/2 streams on
    it, not connections of their own."""

    def __init__(self, keep: int = IDLE_STREAM_CLIENTS) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, bool], list[StreamSession]] = {}

    def take(self, module: ModuleType, target: Target) -> StreamSession:
        """An idle session with ``target``, or a new one."""
        with self._lock:
            idle = self._idle.get((target.address, target.ssl))
            if idle:
                return idle.pop()
        return StreamSession(module.InferenceServerClient(target.address, ssl=target.ssl))

    def give_back(self, session: StreamSession, target: Target, reusable: bool) -> None:
        """Keep ``session`` for the next request, or close its client (its channel failed,
        or enough are kept)."""
        if reusable:
            with self._lock:
                idle = self._idle.setdefault((target.address, target.ssl), [])
                if len(idle) < self.keep:
                    idle.append(session)
                    return
        self._close(session)

    def close_all(self) -> None:
        """Close every idle session: a kept stream's reading thread would hold up the exit."""
        with self._lock:
            idle = [session for sessions in self._idle.values() for session in sessions]
            self._idle.clear()
        for session in idle:
            self._close(session)

    @staticmethod
    def _close(session: StreamSession) -> None:
        session.close(cancel=True)
        with contextlib.suppress(Exception):
            session.client.close()


STREAM_CLIENTS = StreamClients()
# tritonclient reads a stream on a thread that is not a daemon, and the interpreter waits for
# such threads before it runs atexit's callbacks: this hook runs before that wait (as
# concurrent.futures' own does)
threading._register_atexit(lambda: STREAM_CLIENTS.close_all())
# A kept stream's reader waits inside gRPC, and a process forked then (a launcher's child
# runs Python before its exec) aborted in gRPC's poller ("Check failed: next_worker->state ==
# KICKED", tests/test_overload.py in a suite that streamed before): no kept stream crosses a fork
os.register_at_fork(before=lambda: STREAM_CLIENTS.close_all())


class GrpcStream(ResponseStream):
    """One request on a gRPC stream session taken from :data:`STREAM_CLIENTS` and given back
    when it ends."""

    def __init__(self, transport: Transport, model: str, inputs: list, request_id: str) -> None:
        super().__init__(transport)
        self.module = transport.module
        self.model, self.request_id = model, request_id
        self.outputs = wire.requested_outputs(self.module)
        self.stopping = False
        self.clean_end = False  # its final answer came, no error: the stream can carry more
        self.unreachable = False  # the server could not be reached: the channel is not reused
        self.session: StreamSession | None = STREAM_CLIENTS.take(self.module, transport.target)
        try:
            self.session.send(self, model, inputs, request_id)
        except Exception as exc:
            # a stream that failed (e.g. nothing listens) reports why through the callback,
            # which tritonclient calls just after it marks the stream invalid: wait for it
            reported = None
            with contextlib.suppress(queue.Empty):
                reported = self.answers.get(timeout=REPORT_WAIT_S)[1]
            self.unreachable = True
            self._end(cancel=False)
            raise transport.error(reported or exc) from exc

    def answer(self, result: Any, error: Any) -> None:
        """(the stream's thread) One answer: for this request, or its stop request's."""
        if error is not None:
            self.clean_end = False
            self.unreachable |= getattr(error, "status", lambda: None)() == "StatusCode.UNAVAILABLE"
            self.answers.put((None, error))
            return
        piece = Piece.from_result(result)
        self.clean_end = piece.final and not self.stopping
        self.answers.put((piece, None))

    def close(self) -> None:
        """A stop request with the stream's id on the stream, then the stream closed; a gRPC
        cancel only if the stop went unanswered: Triton 2.51 races a cancellation that
        arrives while a request completes (triton-inference-server/server#7840)."""
        if self.session is not None and not self.finished:
            with contextlib.suppress(Exception):
                self.finished = self._send_stop()
        self._end(cancel=not self.finished)

    def abandon(self) -> None:
        self._end(cancel=not self.finished)

    def _send_stop(self) -> bool:
        """Send the stop request and wait (a little) until both it and the stream's request
        ended: True when both did."""
        self.stopping = True
        self.session.stop_request(self.model, self.request_id)
        ends, deadline = 0, time.monotonic() + STOP_WAIT_S
        while ends < 2 and (left := deadline - time.monotonic()) > 0:
            try:
                answer, error = self.answers.get(timeout=left)
            except queue.Empty:
                break
            if error is not _WOKEN and (error is not None or answer.final):
                ends += 1
        return ends == 2

    def _end(self, cancel: bool) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        keep = self.finished and self.clean_end and not cancel
        reusable = session.release(keep, cancel) and not self.unreachable
        STREAM_CLIENTS.give_back(session, self.transport.target, reusable)


class SseStream(ResponseStream):
    """Server-sent events of an HTTP POST on the transport's ``httpx`` client, sent and read
    by a thread of its own, so that opening one never blocks. Leaving it shuts its socket down
    at once, whatever the reader is doing (a ``close`` from another thread would wait for the
    next piece): the server sees the client gone and cancels the request."""

    def __init__(
        self,
        transport: Transport,
        url: str,
        body: dict,
        parse: Callable[[dict], Piece],
        ends_with_done: bool = False,  # the OpenAI API ends with [DONE]; Triton, with the body
    ) -> None:
        super().__init__(transport)
        self.parse, self.ends_with_done = parse, ends_with_done
        self.http = transport.http
        trace = {"trace": self._trace}  # hands over the connection as soon as it is made
        self.request = self.http.build_request("POST", url, json=body, extensions=trace)
        self.socket: socket.socket | None = None
        self.left = threading.Event()
        self.reader = threading.Thread(target=self._read, name="sse-reader", daemon=True)
        self.reader.start()

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.socket = info["return_value"].get_extra_info("socket")
            if self.left.is_set():
                self._shut()

    def _read(self) -> None:
        texts = 0
        try:
            response = self.http.send(self.request, stream=True)
            try:
                if response.status_code != 200:
                    status = response.status_code
                    raise CodegenError(error_message(response.read(), status))
                for line in response.iter_lines():
                    data = line[5:].strip() if line.startswith("data:") else None
                    if data == "[DONE]":
                        break
                    if data:
                        message = json.loads(data)
                        if "error" in message:
                            raise CodegenError(error_message(data.encode(), 200))
                        piece = self.parse(message)
                        texts += bool(piece.text)
                        self.answers.put((piece, None))
                        if self.leave_after is not None and texts >= self.leave_after:
                            self.abandon()
                            return
                else:
                    if self.ends_with_done:
                        raise CodegenError("the API closed the stream before [DONE]")
                self.answers.put((Piece(final=True), None))
            finally:
                response.close()
        except Exception as exc:
            if not self.left.is_set():
                self.answers.put((None, exc))

    def cancel(self) -> None:
        super().cancel()
        self.abandon()  # a read blocked in the reader thread fails at once

    def close(self) -> None:
        self.abandon()

    def abandon(self) -> None:
        self.left.set()
        self._shut()

    def _shut(self) -> None:
        if self.socket is not None:
            with contextlib.suppress(OSError):
                self.socket.shutdown(socket.SHUT_RDWR)


class Transport(Closing):
    """One server, one protocol (``grpc`` or ``http``), one timeout: unary calls, streams and
    stops, every failure raised as a CodegenError."""

    def __init__(self, target: Target | str, timeout: float = 600.0, connect: float = 10.0) -> None:
        """``target``: a resolved :class:`Target`, or ``host:port`` of a gRPC endpoint."""
        self.target = target if isinstance(target, Target) else resolve_target(target, "grpc")
        self.timeout, self.connect_timeout = timeout, connect
        self._client: Any = None
        self._lock = threading.Lock()
        self._accounts: dict[str, bool] = {}  # model -> whether it gives the engine's account

    @functools.cached_property
    def module(self) -> ModuleType:
        return protocol_module(self.target.protocol)

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def triton(self) -> Any:
        """The unary tritonclient, opened on first use."""
        if self._client is None:
            kwargs: dict[str, Any] = {"ssl": self.target.ssl}
            if self.target.protocol == "http":
                kwargs.update(connection_timeout=self.connect_timeout, network_timeout=self.timeout)
            self._client = self.module.InferenceServerClient(self.target.address, **kwargs)
        return self._client

    @functools.cached_property
    def http(self) -> Any:
        """One ``httpx`` client for every HTTP stream: a new one per request would build an
        SSL context each time (about 20 ms, in every first token it measured)."""
        import httpx

        timeout = httpx.Timeout(self.timeout, connect=self.connect_timeout)
        # a connection per stream: it is the stream's to shut down when its reader leaves
        return httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if "http" in self.__dict__:
            with contextlib.suppress(Exception):
                self.__dict__.pop("http").close()

    def error(self, exc: BaseException) -> CodegenError:
        """A tritonclient / httpx / requests / socket exception as a CodegenError a person can
        act on."""
        from tritonclient.utils import InferenceServerException

        if isinstance(exc, CodegenError):
            return exc
        timed_out = TimedOutError(f"no answer from {self.url} within {self.timeout:g} s")
        if isinstance(exc, InferenceServerException):
            message = exc.message() or str(exc)
            if exc.status() == "StatusCode.UNAVAILABLE":
                return ServerUnavailableError(self.url, message)
            return (
                timed_out
                if exc.status() == "StatusCode.DEADLINE_EXCEEDED"
                else (CodegenError(message))
            )
        import httpx
        import requests

        if isinstance(exc, TimeoutError | requests.Timeout | httpx.TimeoutException) or (
            "timed out" in str(exc).lower()
        ):
            return timed_out
        if isinstance(exc, OSError | requests.ConnectionError | httpx.TransportError):
            return ServerUnavailableError(self.url, str(exc) or type(exc).__name__)
        return CodegenError(f"{type(exc).__name__}: {exc}")

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A unary tritonclient call (``infer``, ``is_server_ready``, ...)."""
        try:
            return getattr(self.triton, method)(*args, **kwargs)
        except Exception as exc:
            raise self.error(exc) from exc

    def infer(
        self, request: CompletionRequest, request_id: str = "", model: str = ENSEMBLE_MODEL
    ) -> Any:
        kwargs = {"client_timeout": self.timeout} if self.target.protocol == "grpc" else {}
        return self.call(
            "infer",
            model,
            request.infer_inputs(self.module),
            outputs=self.outputs(model),
            request_id=request_id,
            **kwargs,
        )

    def outputs(self, model: str) -> list:
        """What to ask ``model`` for: the engine's account only where it is served (asked once)."""
        if model not in self._accounts:
            self._accounts[model] = wire.gives_account(self.call("get_model_metadata", model))
        return wire.requested_outputs(self.module, self._accounts[model])

    def stop(self, request_id: str) -> bool:
        """Stop the unary request with ``request_id`` still generating: True when it was
        stopped, False when nothing with that id was generating."""
        try:
            self.call(
                "infer",
                ENSEMBLE_MODEL,
                stop_inputs(self.module),
                outputs=self.outputs(ENSEMBLE_MODEL),
                request_id=request_id,
            )
        except CodegenError as exc:
            if "no request with id" in str(exc):
                return False
            raise
        return True

    def stream(
        self, request: CompletionRequest, inputs: list | None = None, request_id: str = ""
    ) -> ResponseStream:
        """Stream a one-prompt request from the ``engine`` model, which takes the ensemble's
        inputs and streams text: a gRPC stream, or ``generate_stream`` over HTTP. Not through
        ``ensemble_stream``, the same model under the ensemble's name: there the engine would
        not see this client leave (Triton 2.51 passes an ensemble's cancellation on only
        between steps). ``inputs`` replace the request's own tensors."""
        request_id = request_id or f"codegen-stream-{uuid.uuid4().hex}"
        if self.target.protocol == "grpc":
            inputs = inputs if inputs is not None else request.infer_inputs(self.module)
            return GrpcStream(self, ENGINE_MODEL, inputs, request_id)
        scheme = "https" if self.target.ssl else "http"
        url = f"{scheme}://{self.target.address}/v2/models/{ENGINE_MODEL}/generate_stream"
        return SseStream(self, url, generate_body(request), Piece.from_generate)

    def openai_stream(self, body: dict[str, Any], route: str = "completions") -> ResponseStream:
        """``POST /v1/completions`` (or ``/v1/chat/completions``: ``route``) with ``stream:
        true`` to the OpenAI-compatible API at this transport's address."""
        scheme = "https" if self.target.ssl else "http"
        url = f"{scheme}://{self.target.address}/v1/{route}"
        body = {**body, "stream": True}
        return SseStream(self, url, body, Piece.from_openai, ends_with_done=True)
