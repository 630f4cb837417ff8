"""One soak request of any kind on the client's transport, reported as one Locust ``request``
event (:class:`Requests`); every call has a deadline. It imports no Locust."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from client.request import CompletionRequest, generate_body, requested_outputs, to_infer_inputs
from client.results import CodegenError, TimedOutError, error_message, resolve_target
from client.transport import Transport
from contract.tensors import ENSEMBLE_MODEL
from loadtest.editor.protocols import SAMPLING  # as a completion service samples
from loadtest.soak import cases as c
from reporting.triton import Endpoints

SHED = ("queue_full", "timeout")  # the refusals the event table's outcome calls shed
VANISH_AFTER_S = (0.2, 1.0)  # a vanishing unary client's timeout
VANISH_PIECES = (1, 4)  # pieces a vanishing stream reads before it is closed
STREAMS = ("stream-grpc", "stream-http")


@dataclass(frozen=True)
class ClientParams:
    endpoints: Endpoints
    prompts: tuple[str, ...]
    max_tokens: int  # of a valid request
    long_tokens: int  # of a request a client abandons (long enough to be running then)
    deadline_s: float  # no answer within this: unanswered
    context: int  # the model's context in tokens


@dataclass
class Outcome:
    status: str
    category: str = ""
    message: str = ""
    first_token_s: float | None = None


def rejected(message: str) -> Outcome:
    return Outcome(c.REJECTED, c.classify_error(message), message)


class Requests:
    """Fires one ``request`` event on ``events`` (None: none) per request as it ends, with the
    soak's columns in its context, and keeps those in flight, so that what never ends is
    reported unanswered (:meth:`close`). ``window``: the phase, or what names it."""

    def __init__(self, events: Any, window: str | Callable[[], str] = "") -> None:
        self.events, self.window = events, window  # greenlets: none runs inside another's call
        self.in_flight: dict[int, tuple[str, str, str, float, str]] = {}
        self.ended: list[dict[str, Any]] = []  # every end: the ramp's measure, the drill's summary
        self.sent = 0

    def begin(self, kind: str, case: str, transport: str) -> int:
        ticket, self.sent = self.sent, self.sent + 1
        window = self.window() if callable(self.window) else self.window
        self.in_flight[ticket] = (kind, case, transport, time.time(), window)
        return ticket

    def end(self, ticket: int, outcome: Outcome) -> None:
        if (entry := self.in_flight.pop(ticket, None)) is None:
            return
        kind, case, transport, started, window = entry
        self.ended.append(
            {
                "transport": transport,
                "started": started,
                "ended": time.time(),
                "status": outcome.status,
                "category": outcome.category,
                "message": outcome.message[:400],
            }
        )
        if self.events is None:
            return
        first, failed = outcome.first_token_s, outcome.status in (c.REJECTED, c.UNANSWERED)
        self.events.request.fire(
            request_type=kind,
            name=case or kind,
            response_time=(time.time() - started) * 1000,
            response_length=0,
            exception=CodegenError(outcome.message) if failed else None,
            start_time=started,
            context={
                "outcome": {c.OK: "ok", c.ABANDONED: "abandoned"}.get(outcome.status)
                or ("shed" if outcome.category in SHED else "error"),
                "first_token_ms": None if first is None else first * 1000,
                "tokens": 0,
                "window": window,
                "status": outcome.status,
                "category": outcome.category,
                "case": case,
                "transport": transport,
            },
        )

    def close(self, reason: str) -> int:
        """End everything still in flight as unanswered; how many there were."""
        tickets = list(self.in_flight)
        for ticket in tickets:
            self.end(ticket, Outcome(c.UNANSWERED, "", reason))
        return len(tickets)


class Client:
    """One client's connections (made on first use, remade after a timeout) and its choices."""

    def __init__(self, index: int, params: ClientParams, requests: Requests, seed: int = 0):
        self.params, self.requests = params, requests
        self.rng = random.Random(seed * 1_000_003 + index)
        address, deadline = params.endpoints, params.deadline_s
        self.transports = {
            "grpc": Transport(resolve_target(address.grpc, "grpc"), deadline),
            "http": Transport(resolve_target(address.host, "http"), deadline),
        }

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def valid_request(self, max_tokens: int | None = None) -> CompletionRequest:
        i = self.rng.randrange(len(self.params.prompts))  # the seed is the prompt's index
        return CompletionRequest(
            self.params.prompts[i],
            max_tokens=max_tokens or self.params.max_tokens,
            seed=i,
            **SAMPLING,
        )

    def run(self, kind: str, case: str = "", transport: str = "") -> Outcome:
        """Send one request of ``kind`` and report how it ended."""
        transport = (
            transport
            or {
                c.UNARY_GRPC: "grpc",
                c.UNARY_HTTP: "http",
                c.STREAM: self.rng.choice(STREAMS),
                c.VANISH_STREAM: self.rng.choice(STREAMS),
                c.VANISH_UNARY: self.rng.choice(("grpc", "raw-http")),
            }[kind]
        )
        ticket = self.requests.begin(kind, case, transport)
        try:
            outcome = self._send(kind, case, transport)
        except Exception as exc:  # a client-side failure is still an end, with its text
            outcome = rejected(f"{type(exc).__name__}: {exc}")
        self.requests.end(ticket, outcome)
        return outcome

    def _send(self, kind: str, case: str, transport: str) -> Outcome:
        p = self.params
        if case:
            tensors = c.raw_tensors(c.CASES[case], self.valid_request(), p.context)
            if transport == "stream":
                inputs = to_infer_inputs(tensors, self.transports["grpc"].module)
                return self.stream(transport, self.valid_request(), None, inputs)
            return self.unary(transport, tensors, p.deadline_s)
        if kind in (c.UNARY_GRPC, c.UNARY_HTTP):
            return self.unary(transport, self.valid_request().tensors(), p.deadline_s)
        if kind == c.STREAM:
            return self.stream(transport, self.valid_request(), None)
        if kind == c.VANISH_STREAM:
            pieces = self.rng.randint(*VANISH_PIECES)
            return self.stream(transport, self.valid_request(p.long_tokens), pieces)
        after, request = self.rng.uniform(*VANISH_AFTER_S), self.valid_request(p.long_tokens)
        if transport == "raw-http":
            return self.http_drop(request, after)
        return self.unary("grpc", request.tensors(), after, vanishing=True)

    def unary(
        self, transport: str, tensors: c.Tensors, timeout: float, vanishing: bool = False
    ) -> Outcome:
        """The unary ensemble; ``vanishing``: the client timeout is the client leaving on
        purpose (abandoned), else the soak's deadline (unanswered)."""
        wire = self.transports[transport]
        kwargs = {"client_timeout": timeout} if transport == "grpc" else {}
        try:
            wire.call(
                "infer",
                ENSEMBLE_MODEL,
                to_infer_inputs(tensors, wire.module),
                outputs=requested_outputs(wire.module),
                **kwargs,
            )
        except TimedOutError:
            wire.close()  # a connection given up on is not reused
            if vanishing:
                return Outcome(c.ABANDONED, "", "client timeout passed (on purpose)")
            return Outcome(c.UNANSWERED, "", f"no answer within {timeout:g} s")
        except CodegenError as exc:
            if transport == "http":
                wire.close()  # a refused connection may leave the pool broken
            return rejected(str(exc))
        return Outcome(c.OK)

    def stream(
        self,
        transport: str,
        request: CompletionRequest,
        leave_after: int | None,
        inputs: list | None = None,
    ) -> Outcome:
        """A stream to its final answer, or closed after ``leave_after`` pieces (abandoning is
        closing the stream); ``inputs``: raw tensors in the request's place."""
        wire = self.transports["grpc" if transport in ("stream-grpc", "stream") else "http"]
        pieces, sent, first = 0, time.perf_counter(), None
        try:
            stream = wire.stream(request, inputs)
            for piece in stream.pieces():  # closed when they end, fail or the loop leaves
                if piece.text and first is None:
                    first = piece.arrived - sent
                pieces += bool(piece.text)
                if leave_after is not None and pieces >= leave_after:
                    stream.close()
                    return Outcome(
                        c.ABANDONED, "", f"left after {pieces} piece(s) (on purpose)", first
                    )
        except TimedOutError as exc:
            return Outcome(c.UNANSWERED, "", str(exc), first)
        except CodegenError as exc:
            return Outcome(c.REJECTED, c.classify_error(str(exc)), str(exc), first)
        return Outcome(c.OK, first_token_s=first)

    def http_drop(self, request: CompletionRequest, after: float) -> Outcome:
        """POST to ``generate`` and drop the connection unread after ``after`` seconds."""
        url = f"{self.params.endpoints.http_url}/v2/models/{ENSEMBLE_MODEL}/generate"
        try:
            response = httpx.post(
                url, json=generate_body(request), timeout=httpx.Timeout(after, connect=10.0)
            )
        except httpx.ReadTimeout:
            return Outcome(c.ABANDONED, "", f"connection dropped after {after:.2f} s (on purpose)")
        if response.status_code == 200:
            return Outcome(c.OK)
        return rejected(error_message(response.content, response.status_code))
