"""The soak's clients: one :class:`Worker` per closed-loop client thread, able to send every
kind of the mix and to end each request in the :class:`~loadtest.soak.results.Ledger`.

Valid requests go through the project's own client paths (``CompletionRequest`` tensors with
tritonclient, ``CodegenClient.open_stream`` for streams); invalid and hostile ones as raw
tensors through tritonclient directly, so nothing on the client side refuses them first. Every
call has a deadline, so a request that gets no answer is counted, never waited for forever.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.client import CodegenClient, CodegenError
from client.request import CompletionRequest, generate_body, requested_outputs, to_infer_inputs
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL
from loadtest.soak.cases import (
    ABANDONED,
    CASES,
    HOSTILE_CASES,
    HOSTILE_TRANSPORTS,
    INVALID,
    INVALID_CASES,
    INVALID_TRANSPORTS,
    OK,
    REJECTED,
    STREAM,
    UNANSWERED,
    UNARY_GRPC,
    UNARY_HTTP,
    VANISH_STREAM,
    VANISH_UNARY,
    Tensors,
    classify_error,
    raw_tensors,
)
from loadtest.soak.results import Ledger, Record
from reporting.triton import Endpoints

# Valid requests sample as a completion service would (as the load test does); the seed is
# the prompt's index, so a prompt always gets the same completion.
SAMPLING: dict[str, Any] = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}
LOCAL_TIMEOUT = "local_timeout"  # the client's own timeout passed: abandoned or unanswered


@dataclass(frozen=True)
class ClientParams:
    """What every worker needs: where to send, how much, and how long to wait."""

    endpoints: Endpoints
    prompts: tuple[str, ...]
    max_tokens: int  # of a valid request
    long_tokens: int  # of a request a client abandons (long enough to be running then)
    deadline_s: float  # no answer within this: unanswered
    context: int  # the model's context in tokens
    vanish_after_s: tuple[float, float] = (0.2, 1.0)  # a vanishing unary client's timeout
    vanish_pieces: tuple[int, int] = (1, 4)  # pieces a vanishing stream reads first


@dataclass
class Outcome:
    status: str
    category: str = ""
    message: str = ""


def rejected(message: str) -> Outcome:
    return Outcome(REJECTED, classify_error(message), message)


def _server_message(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return exc.message() or str(exc)
    return f"{type(exc).__name__}: {exc}"


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, InferenceServerException):
        return str(exc.status()) == "StatusCode.DEADLINE_EXCEEDED"
    text = f"{type(exc).__name__} {exc}".lower()
    return (
        isinstance(exc, TimeoutError | socket.timeout) or "timed out" in text or "timeout" in text
    )


class Rotation:
    """Which case, over which transport, a raw kind sends next: every case over every
    transport in turn (the caller holds the ledger's lock)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def next(self, kind: str) -> tuple[str, str]:
        cases, transports = (
            (INVALID_CASES, INVALID_TRANSPORTS)
            if kind == INVALID
            else (HOSTILE_CASES, HOSTILE_TRANSPORTS)
        )
        n = self.count.get(kind, 0)
        self.count[kind] = n + 1
        return cases[n % len(cases)].name, transports[(n // len(cases)) % len(transports)]


class Worker:
    """One client thread's connections (made on first use, remade after a timeout)."""

    def __init__(self, index: int, params: ClientParams, ledger: Ledger, seed: int = 0) -> None:
        self.index, self.params, self.ledger = index, params, ledger
        self.rng = random.Random(seed * 1_000_003 + index)
        self._grpc: Any = None
        self._http: Any = None
        self.sent = 0

    # -- connections ----------------------------------------------------------------------

    def grpc(self) -> Any:
        if self._grpc is None:
            self._grpc = grpcclient.InferenceServerClient(self.params.endpoints.grpc)
        return self._grpc

    def http(self) -> Any:
        if self._http is None:
            self._http = httpclient.InferenceServerClient(
                self.params.endpoints.host,
                connection_timeout=10.0,
                network_timeout=self.params.deadline_s,
            )
        return self._http

    def reset(self, which: str) -> None:
        client = self._grpc if which == "grpc" else self._http
        with contextlib.suppress(Exception):
            if client is not None:
                client.close()
        if which == "grpc":
            self._grpc = None
        else:
            self._http = None

    def close(self) -> None:
        self.reset("grpc")
        self.reset("http")

    # -- requests -------------------------------------------------------------------------

    def valid_request(self, max_tokens: int | None = None) -> CompletionRequest:
        prompts = self.params.prompts
        i = self.rng.randrange(len(prompts))
        return CompletionRequest(
            prompts[i], max_tokens=max_tokens or self.params.max_tokens, seed=i, **SAMPLING
        )

    def run(self, kind: str, phase: str, case: str = "", transport: str = "") -> Record:
        """Send one request of ``kind`` and record how it ended."""
        self.sent += 1
        transport = transport or {
            UNARY_GRPC: "grpc",
            UNARY_HTTP: "http",
            STREAM: self.rng.choice(("stream-grpc", "stream-http")),
            VANISH_STREAM: self.rng.choice(("stream-grpc", "stream-http")),
            VANISH_UNARY: self.rng.choice(("grpc", "raw-http")),
        }.get(kind, "grpc")
        ticket = self.ledger.begin(kind, case, transport, phase)
        try:
            outcome = self._send(kind, case, transport)
        except Exception as exc:  # a client-side failure is still an end, with its text
            outcome = rejected(_server_message(exc))
        return self.ledger.end(ticket, outcome.status, outcome.category, outcome.message)

    def _send(self, kind: str, case: str, transport: str) -> Outcome:
        p = self.params
        if case:
            tensors = raw_tensors(CASES[case], self.valid_request(), p.context)
            if transport == "stream":
                return self.raw_stream(tensors, p.deadline_s)
            return self.unary(transport, tensors, p.deadline_s)
        if kind in (UNARY_GRPC, UNARY_HTTP):
            return self.unary(transport, self.valid_request().tensors(), p.deadline_s)
        if kind == STREAM:
            return self.stream(transport, self.valid_request(), None)
        if kind == VANISH_STREAM:
            pieces = self.rng.randint(*p.vanish_pieces)
            return self.stream(transport, self.valid_request(p.long_tokens), pieces)
        if kind == VANISH_UNARY:
            after = self.rng.uniform(*p.vanish_after_s)
            request = self.valid_request(p.long_tokens)
            if transport == "raw-http":
                return self.http_drop(request, after)
            return self.unary("grpc", request.tensors(), after, vanishing=True)
        raise ValueError(f"unknown kind {kind!r}")

    def unary(
        self, transport: str, tensors: Tensors, timeout: float, vanishing: bool = False
    ) -> Outcome:
        """The unary ensemble over gRPC or HTTP; ``vanishing``: the client timeout is the
        client leaving on purpose (abandoned), else the soak's deadline (unanswered)."""
        module = grpcclient if transport == "grpc" else httpclient
        client = self.grpc() if transport == "grpc" else self.http()
        kwargs = {"client_timeout": timeout} if transport == "grpc" else {}
        try:
            client.infer(
                ENSEMBLE_MODEL,
                to_infer_inputs(tensors, module),
                outputs=requested_outputs(module),
                **kwargs,
            )
        except Exception as exc:
            if _is_timeout(exc):
                self.reset(transport)
                if vanishing:
                    return Outcome(ABANDONED, "", "client timeout passed (on purpose)")
                return Outcome(UNANSWERED, "", f"no answer within {timeout:g} s")
            if transport == "http":
                self.reset("http")  # a refused connection may leave the pool broken
            return rejected(_server_message(exc))
        return Outcome(OK)

    def stream(
        self, transport: str, request: CompletionRequest, leave_after: int | None
    ) -> Outcome:
        """A stream through ``CodegenClient``; ``leave_after``: close it after that many pieces
        (the client vanishing mid-stream)."""
        protocol = "grpc" if transport == "stream-grpc" else "http"
        url = self.params.endpoints.grpc if protocol == "grpc" else self.params.endpoints.host
        codegen = CodegenClient(url, protocol, timeout=self.params.deadline_s)
        pieces = 0
        try:
            stream = codegen.open_stream(request)
            with stream:
                for _ in stream:
                    pieces += 1
                    if leave_after is not None and pieces >= leave_after:
                        return Outcome(ABANDONED, "", f"left after {pieces} piece(s) (on purpose)")
        except CodegenError as exc:
            message = str(exc)
            if message.startswith("no answer from"):
                return Outcome(UNANSWERED, "", message)
            return rejected(message)
        finally:
            codegen.close()
        return Outcome(OK)

    def raw_stream(self, tensors: Tensors, timeout: float) -> Outcome:
        """Raw tensors to the streaming model over a gRPC stream, to the final response."""
        client = grpcclient.InferenceServerClient(self.params.endpoints.grpc)
        answers: queue.Queue = queue.Queue()
        finished = False
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            client.async_stream_infer(
                STREAM_MODEL,
                to_infer_inputs(tensors, grpcclient),
                outputs=requested_outputs(grpcclient),
                enable_empty_final_response=True,
            )
            deadline = time.monotonic() + timeout
            while True:
                try:
                    result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    return Outcome(UNANSWERED, "", f"no answer within {timeout:g} s")
                if error is not None:
                    finished = True
                    return rejected(_server_message(error))
                response = result.get_response()
                if response.parameters["triton_final_response"].bool_param:
                    finished = True
                    return Outcome(OK)
        finally:
            with contextlib.suppress(Exception):
                client.stop_stream(cancel_requests=not finished)
            with contextlib.suppress(Exception):
                client.close()

    def http_drop(self, request: CompletionRequest, after: float) -> Outcome:
        """POST to the ensemble's ``generate`` and drop the connection after ``after``
        seconds without reading: a client that vanishes mid-request over HTTP."""
        endpoints = self.params.endpoints
        host, _, port = endpoints.host.rpartition(":")
        body = json.dumps(generate_body(request)).encode()
        head = (
            f"POST /v2/models/{ENSEMBLE_MODEL}/generate HTTP/1.1\r\nHost: {endpoints.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        with socket.create_connection((host, int(port)), timeout=10.0) as sock:
            sock.sendall(head + body)
            readable, _, _ = select.select([sock], [], [], after)
            if not readable:
                return Outcome(
                    ABANDONED, "", f"connection dropped after {after:.2f} s (on purpose)"
                )
            answer = sock.recv(65536).decode(errors="replace")
        status_line, _, rest = answer.partition("\r\n")
        if " 200 " in status_line + " ":
            return Outcome(OK)
        return rejected(rest.partition("\r\n\r\n")[2].strip() or status_line)
