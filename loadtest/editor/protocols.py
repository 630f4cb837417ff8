"""How a typist's request travels, each an :class:`Exchange` read until a deadline and
abandoned at a keystroke, over the client's transport (:mod:`client.transport`): ``openai``
(``/v1/completions`` SSE; abandoning closes the connection), ``grpc`` (a stream to
``ensemble_stream``; abandoning cancels it) or ``llama`` (llama-server's ``/v1/completions``
with ``cache_prompt``, as llama.vim sends). Each carries the editor's stop rules where the
server has them; the suffix goes as OpenAI's ``suffix`` field or ``ensemble_stream``'s input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from client.request import CompletionRequest
from client.results import CodegenError, resolve_target
from client.transport import ResponseStream, Transport
from contract.tensors import ENSEMBLE_MODEL

SUFFIX = "suffix"  # the OpenAI field and the ensemble_stream input
SAMPLING: dict[str, Any] = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}  # as the sweep's
PROTOCOLS = ("openai", "grpc", "llama")


@dataclass
class Exchange:
    """One request from the moment it was sent, read from its :class:`ResponseStream`."""

    stream: ResponseStream | None = None  # None: it failed before anything was sent
    sent: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None  # sent -> first piece of text
    latency_s: float | None = None  # sent -> the end of the answer (answered only)
    pieces: int = 0  # pieces of text read
    tokens_read: int = 0  # tokens those pieces carried, where the wire says (else = pieces)
    completion_tokens: int | None = None  # the server's count, for an answered request
    finished: bool = False
    error: str = ""
    counts_tokens: bool = False  # gRPC: the token counts come from the pieces themselves

    @property
    def over(self) -> bool:
        return self.finished or bool(self.error)

    def wait(self, deadline: float) -> bool:
        """Read until the answer ends, fails, or ``deadline`` (monotonic) passes; whether it
        is over."""
        while not self.over and self.stream is not None:
            try:
                piece = self.stream.read(deadline - time.monotonic())
            except CodegenError as exc:
                self.fail(str(exc))
                break
            if piece is None:
                return False
            if piece.text:
                self.piece(piece.tokens)
            if piece.usage:
                self.completion_tokens = piece.usage.get("completion_tokens")
            if piece.final:
                self.finished, self.latency_s = True, time.monotonic() - self.sent
                if self.counts_tokens:
                    self.completion_tokens = self.tokens_read
        if self.stream is not None:
            self.stream.close()
        return True

    def abandon(self) -> None:
        """The next keystroke: stop reading and drop the request."""
        if self.stream is not None:
            self.stream.abandon()

    def piece(self, tokens: int) -> None:
        self.first_token_s = self.first_token_s or time.monotonic() - self.sent
        self.pieces += 1
        self.tokens_read += tokens

    def fail(self, message: str) -> None:
        self.error = (message or "unknown error")[:300]


@dataclass(frozen=True)
class Sender:
    """Opens exchanges over one of :data:`PROTOCOLS`, every typist's through one transport,
    with the editor stop rules (False / 0: off)."""

    protocol: str
    address: str  # host:port of the API or llama-server, or Triton's gRPC host:port
    max_tokens: int
    one_line: bool = False  # end at the answer's first newline
    t_max_predict_ms: int = 0  # stop once this much time has passed and a newline was written
    transport: Transport = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}: {', '.join(PROTOCOLS)}")
        wire = "grpc" if self.protocol == "grpc" else "http"
        object.__setattr__(self, "transport", Transport(resolve_target(self.address, wire)))

    def stops(self, n_indent: int) -> dict[str, Any]:
        """The stop rules under this server's names (``n_indent``: the cursor line's indent)."""
        rules: dict[str, Any] = {"n_indent": n_indent, "t_max_predict_ms": self.t_max_predict_ms}
        if self.one_line:
            rules |= {"stop": ["\n"]} if self.protocol == "llama" else {"single_line": True}
        return {k: v for k, v in rules.items() if v}

    def open(self, prefix: str, suffix: str, seed: int, n_indent: int = 0) -> Exchange:
        sent, rules = time.monotonic(), self.stops(n_indent)
        try:
            if self.protocol == "grpc":
                request = CompletionRequest(prefix, self.max_tokens, seed=seed,
                                            suffix=suffix or None, **SAMPLING, **rules)  # fmt: skip
                stream = self.transport.stream(request)
            else:
                body = {"model": ENSEMBLE_MODEL, "prompt": prefix, "max_tokens": self.max_tokens,
                        "stream_options": {"include_usage": True}, "seed": seed, **SAMPLING,
                        **rules, **({SUFFIX: suffix} if suffix else {}),
                        **({"cache_prompt": True} if self.protocol == "llama" else {})}  # fmt: skip
                stream = self.transport.openai_stream(body)
        except CodegenError as exc:
            failed = Exchange(sent=sent)
            failed.fail(f"cannot send to {self.address}: {exc}")
            return failed
        return Exchange(stream, sent, counts_tokens=self.protocol == "grpc")
