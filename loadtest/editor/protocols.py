"""The two ways a typist's request travels, each an :class:`Exchange` it can wait on until a
deadline and abandon at a keystroke, from the thread that sent it:

- ``openai``: ``POST /v1/completions`` with ``stream: true`` (server-sent events), over a plain
  socket: waiting is ``select`` with the deadline as its timeout, abandoning is closing the
  socket (what an editor's HTTP client does). :class:`SseDecoder` reads the response.
- ``grpc``: a gRPC stream to ``ensemble_stream`` with tritonclient; abandoning is
  ``stop_stream(cancel_requests=True)``, as a raw gRPC client cancels.

Neither blocks past the deadline it is given, so a typist never waits on a request longer than
its pause. The suffix goes as OpenAI's ``suffix`` field, or the ``suffix`` input of
``ensemble_stream``; a server that does not take one refuses it with an error naming
``suffix``, which :mod:`loadtest.editor.suffix` looks for.
"""

from __future__ import annotations

import contextlib
import json
import queue
import select
import socket
import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from client.request import CompletionRequest, requested_outputs
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL

SUFFIX = "suffix"  # the OpenAI field and the ensemble_stream input
SAMPLING: dict[str, Any] = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}  # as the sweep's
ERROR_CHARS = 300


@dataclass
class Exchange:
    """One request from the moment it was sent; subclasses read the wire."""

    sent: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None  # sent -> first piece of text
    latency_s: float | None = None  # sent -> the end of the answer (answered only)
    pieces: int = 0  # pieces of text read
    tokens_read: int = 0  # tokens those pieces carried, where the wire says (else = pieces)
    completion_tokens: int | None = None  # the server's count, for an answered request
    prompt_tokens: int | None = None  # the server's count, where it gives one
    finished: bool = False
    error: str = ""

    @property
    def over(self) -> bool:
        return self.finished or bool(self.error)

    def wait(self, deadline: float) -> bool:
        """Read until the answer ends, fails, or ``deadline`` (monotonic) passes; whether it
        is over. (This base is an exchange that failed before anything was sent.)"""
        return self.over

    def abandon(self) -> None:
        """The next keystroke: stop reading and close the request."""

    def _piece(self, tokens: int) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.sent
        self.pieces += 1
        self.tokens_read += tokens

    def _fail(self, message: str) -> None:
        self.error = (message or "unknown error")[:ERROR_CHARS]


# --- OpenAI over server-sent events --------------------------------------------------------


class SseDecoder:
    """An HTTP/1.1 response carrying server-sent events, fed as bytes arrive: the status,
    then each event's ``data`` (chunked or plain bodies). A non-200 body is kept whole."""

    def __init__(self) -> None:
        self.buffer = b""
        self.status: int | None = None
        self.chunked = False
        self.body = b""  # de-chunked body not yet split into events
        self.error_body = b""
        self.ended = False  # the final zero-size chunk came

    def feed(self, data: bytes) -> list[str]:
        """The ``data`` fields of the events completed by ``data``."""
        self.buffer += data
        if self.status is None:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return []
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
            }
            self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            self.buffer = rest
        self._dechunk()
        if self.status != 200:
            self.error_body += self.body
            self.body = b""
            return []
        events = []
        while b"\n\n" in self.body:
            event, _, self.body = self.body.partition(b"\n\n")
            data = [
                line[5:].lstrip().decode()
                for line in event.replace(b"\r\n", b"\n").split(b"\n")
                if line.startswith(b"data:")
            ]
            if data:
                events.append("\n".join(data))
        return events

    def _dechunk(self) -> None:
        if not self.chunked:
            self.body += self.buffer
            self.buffer = b""
            return
        while not self.ended:
            size_line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if len(rest) < size + 2:
                return
            if size == 0:
                self.ended = True
            self.body += rest[:size]
            self.buffer = rest[size + 2 :]


def error_text(body: bytes, status: int | None) -> str:
    """An OpenAI error body's message with its ``param`` (``status``: the HTTP status)."""
    try:
        error = json.loads(body)["error"]
        param = f" [param: {error['param']}]" if error.get("param") else ""
        return f"HTTP {status}: {error['message']}{param}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:200].decode(errors='replace')}"


class OpenAIExchange(Exchange):
    def __init__(self, host: str, port: int, body: dict[str, Any]) -> None:
        super().__init__()
        self.decoder = SseDecoder()
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.sock: socket.socket | None = socket.create_connection((host, port), timeout=10.0)
        self.sock.sendall(head + payload)
        self.sock.setblocking(False)

    def wait(self, deadline: float) -> bool:
        while not self.over and self.sock is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                return False
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                self._fail(f"connection error: {exc}")
                break
            if not data:
                self._closed_by_server()
                break
            for event in self.decoder.feed(data):
                self._event(event)
        self._close()
        return True

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            if not self.error:
                self.finished = True
                self.latency_s = time.monotonic() - self.sent
            return
        message = json.loads(data)
        if "error" in message:
            self._fail(error_text(data.encode(), 200))
            return
        for choice in message.get("choices", []):
            if choice.get("text"):
                self._piece(1)  # an SSE chunk carries a piece, of one token or more
        usage = message.get("usage")
        if usage:
            self.completion_tokens = usage.get("completion_tokens")
            self.prompt_tokens = usage.get("prompt_tokens")

    def _closed_by_server(self) -> None:
        status = self.decoder.status
        if status is not None and status != 200:
            self._fail(error_text(self.decoder.error_body, status))
        elif not self.finished:
            self._fail("the API closed the stream before [DONE]")

    def _close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def abandon(self) -> None:
        self._close()


# --- gRPC streams to ensemble_stream --------------------------------------------------------


def _takes_suffix() -> bool:
    """Whether the client's request builder knows a suffix (fill in the middle) yet."""
    return SUFFIX in {f.name for f in fields(CompletionRequest)}


def grpc_inputs(request: CompletionRequest, suffix: str) -> list[Any]:
    """The request's inputs, with the suffix input when there is a suffix: through the
    request builder once it takes one, else added here as the one BYTES tensor it is."""
    if not suffix:
        return request.infer_inputs(grpcclient)
    if _takes_suffix():
        return CompletionRequest(**{**_fields(request), SUFFIX: suffix}).infer_inputs(grpcclient)
    inputs = request.infer_inputs(grpcclient)
    tensor = grpcclient.InferInput(SUFFIX, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[suffix.encode()]], dtype=np.object_))
    return [*inputs, tensor]


def _fields(request: CompletionRequest) -> dict[str, Any]:
    return {f.name: getattr(request, f.name) for f in fields(request) if f.init}


def _final(result: Any) -> bool:
    parameter = result.get_response().parameters.get("triton_final_response")
    return bool(parameter is not None and parameter.bool_param)


class GrpcExchange(Exchange):
    def __init__(self, url: str, request: CompletionRequest, suffix: str) -> None:
        super().__init__()
        self.answers: queue.Queue = queue.Queue()
        self.client: Any = grpcclient.InferenceServerClient(url)
        self.generated = 0
        try:
            self.client.start_stream(
                callback=lambda result, error: self.answers.put((result, error))
            )
            self.client.async_stream_infer(
                STREAM_MODEL,
                grpc_inputs(request, suffix),
                outputs=requested_outputs(grpcclient),
                enable_empty_final_response=True,
            )
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            self._stop(cancel=False)

    def wait(self, deadline: float) -> bool:
        while not self.over:
            try:
                result, error = self.answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if error is not None:
                message = error.message() if hasattr(error, "message") else str(error)
                self._fail(message or str(error))
                break
            text = result.as_numpy("OUTPUT_0")
            if text is not None and any(len(t) for t in text.reshape(-1)):
                log_probs = result.as_numpy("output_log_probs")
                tokens = int(log_probs.size) if log_probs is not None else 1
                self.generated += tokens
                self._piece(tokens)
            if _final(result):
                lengths = result.as_numpy("sequence_length")
                self.finished = True
                self.latency_s = time.monotonic() - self.sent
                self.completion_tokens = self.generated
                if lengths is not None:
                    self.prompt_tokens = int(lengths.reshape(-1)[0]) - self.generated
        self._stop(cancel=False)
        return True

    def _stop(self, cancel: bool) -> None:
        if self.client is None:
            return
        with contextlib.suppress(Exception):
            self.client.stop_stream(cancel_requests=cancel)
        with contextlib.suppress(Exception):
            self.client.close()
        self.client = None

    def abandon(self) -> None:
        self._stop(cancel=True)


# --- what a typist holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Sender:
    """Opens exchanges over one protocol: ``openai`` (the API's base URL) or ``grpc``."""

    protocol: str
    address: str  # host:port of the API, or Triton's gRPC host:port
    max_tokens: int

    def open(self, prefix: str, suffix: str, seed: int) -> Exchange:
        if self.protocol == "openai":
            host, _, port = self.address.rpartition(":")
            body: dict[str, Any] = {
                "model": ENSEMBLE_MODEL,
                "prompt": prefix,
                "max_tokens": self.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "seed": seed,
                **SAMPLING,
            }
            if suffix:
                body[SUFFIX] = suffix
            try:
                return OpenAIExchange(host, int(port), body)
            except OSError as exc:
                failed = Exchange()
                failed._fail(f"cannot connect to {self.address}: {exc}")
                return failed
        if self.protocol == "grpc":
            request = CompletionRequest(prefix, max_tokens=self.max_tokens, seed=seed, **SAMPLING)
            return GrpcExchange(self.address, request, suffix)
        raise ValueError(f"unknown protocol {self.protocol!r}: openai or grpc")
