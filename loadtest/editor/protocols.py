"""How a typist's request travels (:class:`Exchange`, read until a deadline, abandoned at a
keystroke) on :mod:`client.transport`: ``openai`` (SSE; abandoning closes the connection),
``grpc`` (a stream from the ``engine`` model; abandoning cancels it) or ``llama`` (llama-server,
``cache_prompt`` as llama.vim sends), each with the editor's stop rules where the server has
them; and a typist's request at a pause (:func:`type_pause`) as a Locust event."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from client.request import CompletionRequest
from client.results import CodegenError, resolve_target
from client.transport import ResponseStream, Transport
from contract.tensors import ENSEMBLE_MODEL
from loadtest.editor.typist import Visit
from loadtest.editor.window import Clipper, Window

SUFFIX = "suffix"  # the OpenAI field and the streamed model's input
SAMPLING: dict[str, Any] = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}  # as the sweep's


@dataclass
class Exchange:
    """One request from the moment it was sent, read from its :class:`ResponseStream`."""

    stream: ResponseStream | None = None  # None: it failed before anything was sent
    sent: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None  # sent -> first piece of text
    latency_s: float | None = None  # sent -> the end of the answer (answered only)
    pieces: int = 0  # pieces of text read
    tokens_read: int = 0  # tokens those pieces carried, where the wire says (else = pieces)
    completion_tokens: int | None = None  # the server's count, for an answered request (SSE)
    finished: bool = False
    error: str = ""

    @property
    def over(self) -> bool:
        return self.finished or bool(self.error)

    @property
    def outcome(self) -> str:
        """``ok`` (answered), ``error``, or ``abandoned`` (the client left first)."""
        return "error" if self.error else "ok" if self.finished else "abandoned"

    def wait(self, deadline: float) -> bool:
        """Read until the answer ends or fails (True), or ``deadline`` (monotonic) passes."""
        while not self.over and self.stream is not None:
            try:
                piece = self.stream.read(deadline - time.monotonic())
            except CodegenError as exc:
                self.error = str(exc)[:300] or "unknown error"
                break
            if piece is None:
                return False
            if piece.text:
                self.first_token_s = self.first_token_s or time.monotonic() - self.sent
                self.pieces, self.tokens_read = self.pieces + 1, self.tokens_read + piece.tokens
            if piece.usage:
                self.completion_tokens = piece.usage.get("completion_tokens")
            if piece.final:
                self.finished, self.latency_s = True, time.monotonic() - self.sent
        if self.stream is not None:
            self.stream.close()
        return True

    def abandon(self) -> None:
        """The next keystroke: stop reading and drop the request."""
        if self.stream is not None:
            self.stream.abandon()


@dataclass(frozen=True)
class Sender:
    """Opens every typist's exchanges on one transport, with the editor stop rules (0: off)."""

    protocol: str  # openai, grpc or llama
    address: str  # host:port of the API or llama-server, or Triton's gRPC host:port
    max_tokens: int
    one_line: bool = False  # end at the answer's first newline
    t_max_predict_ms: int = 0  # stop once this much time has passed and a newline was written
    chat: bool = False  # the prefix as one user message to /v1/chat/completions (openai only)
    transport: Transport = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wire = "grpc" if self.protocol == "grpc" else "http"
        object.__setattr__(self, "transport", Transport(resolve_target(self.address, wire)))

    def stops(self, n_indent: int) -> dict[str, Any]:
        """The stop rules under this server's names (``n_indent``: the cursor line's indent)."""
        rules: dict[str, Any] = {"n_indent": n_indent, "t_max_predict_ms": self.t_max_predict_ms}
        if self.one_line:
            rules |= {"stop": ["\n"]} if self.protocol == "llama" else {"single_line": True}
        return {k: v for k, v in rules.items() if v}

    def open(
        self, prefix: str, suffix: str, seed: int, n_indent: int = 0, extra: Sequence[dict] = ()
    ) -> Exchange:
        """``extra``: other files' chunks (``input_extra``, ``{"filename", "text"}``), which
        only the OpenAI API takes with a completion."""
        sent, rules = time.monotonic(), self.stops(n_indent)
        if (extra or self.chat) and self.protocol != "openai":
            raise ValueError(
                f"input_extra and chat go through the openai protocol, not {self.protocol}"
            )
        try:
            if self.protocol == "grpc":
                request = CompletionRequest(
                    prefix, self.max_tokens, seed=seed, suffix=suffix or None, **SAMPLING, **rules
                )
                stream = self.transport.stream(request)
            elif self.chat:
                body = {
                    "model": ENSEMBLE_MODEL,
                    "max_tokens": self.max_tokens,
                    "seed": seed,
                    "messages": [{"role": "user", "content": prefix}],
                    **SAMPLING,
                    "stream_options": {"include_usage": True},
                    **rules,
                }
                stream = self.transport.openai_stream(body, "chat/completions")
            else:
                body = {
                    "model": ENSEMBLE_MODEL,
                    "prompt": prefix,
                    "max_tokens": self.max_tokens,
                    "stream_options": {"include_usage": True},
                    "seed": seed,
                    **SAMPLING,
                    **rules,
                    **({SUFFIX: suffix} if suffix else {}),
                    **({"cache_prompt": True} if self.protocol == "llama" else {}),
                    **({"input_extra": list(extra)} if extra else {}),
                }
                stream = self.transport.openai_stream(body)
        except CodegenError as exc:
            return Exchange(sent=sent, error=f"cannot send to {self.address}: {exc}"[:300])
        return Exchange(stream, sent)


def indent_at(text: str, cursor: int) -> int:
    """The cursor line's indentation in columns (llama.vim's ``n_indent``)."""
    line = text[text.rfind("\n", 0, cursor) + 1 : cursor]
    return len(line) - len(line.lstrip(" \t"))


def type_pause(
    sender: Sender,
    clipper: Clipper,
    with_suffix: bool,
    visit: Visit,
    seed: int,
    extra: Sequence[dict] = (),
) -> tuple[Exchange, Window]:
    """One pause's request: sent, read until answered or the next keystroke, then abandoned;
    ``extra``: other files' chunks sent with it (``input_extra``)."""
    pause, exchange = visit.pause, Exchange()
    window = clipper.clip(visit.text, pause.cursor, with_suffix, pause.suffix_at)
    try:
        indent = indent_at(visit.text, pause.cursor)
        exchange = sender.open(window.prefix, window.suffix, seed, indent, extra)
        if not exchange.wait(exchange.sent + pause.pause_s):
            exchange.abandon()  # the next keystroke
    except Exception as exc:
        if not exchange.over:
            exchange.abandon()
        exchange.error = exchange.error or f"{type(exc).__name__}: {exc}"
    return exchange, window


def request_event(
    exchange: Exchange,
    window: Window,
    pause_s: float,
    typist: int,
    protocol: str,
    one_line: bool,
    wall: float,
) -> dict:
    """Locust's ``request`` event, the editor's columns in ``context``; ``ok``: answered."""
    outcome = exchange.outcome
    first, latency = exchange.first_token_s, exchange.latency_s if outcome == "ok" else None
    # answered: the server's count of the whole answer; abandoned: the pieces read before leaving
    delivered = (outcome == "ok" and exchange.completion_tokens) or exchange.tokens_read
    return dict(
        request_type=protocol,
        name="one-line" if one_line else "completion",
        response_time=pause_s * 1000 if latency is None else round(latency * 1000, 1),
        response_length=exchange.tokens_read,
        start_time=wall,
        exception=RuntimeError(exchange.error) if outcome == "error" else None,
        context={
            "outcome": outcome,
            "tokens": delivered,
            "typist": typist,
            "one_line": one_line,
            "first_token_ms": None if first is None else round(first * 1000, 1),
            "pause_s": round(pause_s, 3),
            "prefix_tokens": window.prefix_tokens,
            "suffix_tokens": window.suffix_tokens,
            "pieces": exchange.pieces,
            "tokens_read": exchange.tokens_read,
        },
    )
