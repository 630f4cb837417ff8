"""The soak's clients: one :class:`Worker` per closed-loop client thread, able to send every
kind of the mix and to end each request in the :class:`~loadtest.soak.results.Ledger`.

Every request goes through the client's transport (:mod:`client.transport`): valid ones built
by ``CompletionRequest``, invalid and hostile ones as raw tensors, so nothing on the client
side refuses them first. Every call has a deadline, so a request that gets no answer is
counted, never waited for forever.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import httpx

from client.request import CompletionRequest, generate_body, requested_outputs, to_infer_inputs
from client.results import CodegenError, TimedOutError, error_message, resolve_target
from client.transport import Transport
from contract.tensors import ENSEMBLE_MODEL
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
        endpoints, deadline = params.endpoints, params.deadline_s
        self.transports = {
            "grpc": Transport(resolve_target(endpoints.grpc, "grpc"), deadline),
            "http": Transport(resolve_target(endpoints.host, "http"), deadline),
        }
        self.sent = 0

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

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
            outcome = rejected(f"{type(exc).__name__}: {exc}")
        return self.ledger.end(ticket, outcome.status, outcome.category, outcome.message)

    def _send(self, kind: str, case: str, transport: str) -> Outcome:
        p = self.params
        if case:
            tensors = raw_tensors(CASES[case], self.valid_request(), p.context)
            if transport == "stream":
                inputs = to_infer_inputs(tensors, self.transports["grpc"].module)
                return self.stream(transport, self.valid_request(), None, inputs)
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
        wire = self.transports[transport]
        kwargs = {"client_timeout": timeout} if transport == "grpc" else {}
        try:
            wire.call("infer", ENSEMBLE_MODEL, to_infer_inputs(tensors, wire.module),
                      outputs=requested_outputs(wire.module), **kwargs)  # fmt: skip
        except TimedOutError:
            wire.close()  # a connection given up on is not reused
            if vanishing:
                return Outcome(ABANDONED, "", "client timeout passed (on purpose)")
            return Outcome(UNANSWERED, "", f"no answer within {timeout:g} s")
        except CodegenError as exc:
            if transport == "http":
                wire.close()  # a refused connection may leave the pool broken
            return rejected(str(exc))
        return Outcome(OK)

    def stream(
        self, transport: str, request: CompletionRequest, leave_after: int | None,
        inputs: list | None = None,
    ) -> Outcome:  # fmt: skip
        """A stream to its final answer; ``leave_after``: closed after that many pieces (the
        client vanishing mid-stream); ``inputs``: raw tensors in the request's place."""
        wire = self.transports["grpc" if transport in ("stream-grpc", "stream") else "http"]
        pieces = 0
        try:
            stream = wire.stream(request, inputs)
            for piece in stream.pieces():
                pieces += bool(piece.text)
                if leave_after is not None and pieces >= leave_after:
                    stream.close()
                    return Outcome(ABANDONED, "", f"left after {pieces} piece(s) (on purpose)")
        except TimedOutError as exc:
            return Outcome(UNANSWERED, "", str(exc))
        except CodegenError as exc:
            return rejected(str(exc))
        return Outcome(OK)

    def http_drop(self, request: CompletionRequest, after: float) -> Outcome:
        """POST to the ensemble's ``generate`` and drop the connection after ``after``
        seconds without an answer: a client that vanishes mid-request over HTTP."""
        url = f"{self.params.endpoints.http_url}/v2/models/{ENSEMBLE_MODEL}/generate"
        try:
            response = httpx.post(url, json=generate_body(request),
                                  timeout=httpx.Timeout(after, connect=10.0))  # fmt: skip
        except httpx.ReadTimeout:
            return Outcome(ABANDONED, "", f"connection dropped after {after:.2f} s (on purpose)")
        if response.status_code == 200:
            return Outcome(OK)
        return rejected(error_message(response.content, response.status_code))
