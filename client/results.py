"""What the client library returns and raises, and where it connects: the plain data of
:mod:`client.client`, importable without ``tritonclient``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypedDict
from urllib.parse import urlsplit

from contract.options import InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL

Protocol = Literal["grpc", "http"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http")
DEFAULT_PORTS: dict[str, int] = {"http": 8000, "grpc": 8001}
_SCHEMES = {"grpc": "grpc", "http": "http", "https": "http"}


class CodegenError(Exception):
    """The server refused or failed a request; the message is the server's own."""


class ServerUnavailableError(CodegenError):
    """No server answers at the URL tried (not started, wrong port or protocol)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = "connection refused" if "connection refused" in reason.lower() else reason
        super().__init__(
            f"no Triton server answers at {url} ({self.reason}); start one with `make triton` "
            "(HTTP on port 8000, gRPC on 8001) or point the client at yours"
        )


ServerUnavailable = ServerUnavailableError  # the short name


class TimedOutError(CodegenError):
    """No answer came within the client's timeout (the generation is stopped on the server)."""


class SamplingOptions(TypedDict, total=False):
    """The request options of the contract besides the prompt and ``max_tokens``.

    top_k / top_p: 0 and 0.0 (the defaults) mean greedy search; temperature: 1.0 = unchanged
    logits; repetition_penalty: 1.0 = none; seed: same seed + same request = same output;
    stop_words / bad_words: strings that end generation / are never generated;
    return_log_probs: fill ``Completion.log_probs`` and ``cum_log_prob``; end_id / start_id:
    token ids (the model's own end token when absent); beam_width: > 1 is beam search, its
    beams in ``Completion.beams`` (best first; top_k, top_p and seed are then unused);
    len_penalty / beam_search_diversity_rate: how beams are ranked / kept apart (README);
    suffix: the text after the cursor, to fill in the middle (``completion`` is then the
    middle, ``text`` the prompt and the middle); single_line / n_indent / t_max_predict_ms:
    where an editor wants the answer to end (contract.options.EditorStops).
    """

    top_k: int
    top_p: float
    temperature: float
    repetition_penalty: float
    seed: int | None
    stop_words: Sequence[str]
    bad_words: Sequence[str]
    return_log_probs: bool
    end_id: int | None
    start_id: int | None
    beam_width: int
    len_penalty: float | None
    beam_search_diversity_rate: float | None
    suffix: str | None
    single_line: bool
    n_indent: int
    t_max_predict_ms: int


@dataclass(frozen=True)
class BeamText:
    """One beam of a beam search: the text (prompt + completion), the completion alone, its
    token count (prompt + generated), the log-probability of what it generated (the end token
    included) and, when asked for, each generated token's log-probability."""

    text: str
    completion: str
    total_tokens: int
    cum_log_prob: float
    log_probs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Target:
    """Where a client connects: the protocol and ``host:port`` as ``tritonclient`` wants it."""

    protocol: Protocol
    address: str
    ssl: bool = False

    @property
    def url(self) -> str:
        """The address with its scheme, as shown to people (e.g. ``grpc://localhost:8001``)."""
        scheme = "https" if self.ssl else self.protocol
        return f"{scheme}://{self.address}"


def resolve_target(url: str | None = None, protocol: str | None = None) -> Target:
    """Turn a user's URL and protocol into a :class:`Target`.

    ``url`` is ``host[:port]``, optionally with a scheme (``grpc://``, ``http://``,
    ``https://``) that implies the protocol; the port defaults to 8001 for gRPC and 8000 for
    HTTP, the protocol to gRPC. Raises :class:`InvalidRequestError` naming the bad part.
    """
    if protocol is not None and protocol not in PROTOCOLS:
        raise InvalidRequestError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
    rest = (url or "").strip()
    ssl = False
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        implied = _SCHEMES.get(scheme.lower())
        if implied is None:
            raise InvalidRequestError(
                f"url scheme must be grpc://, http:// or https://, got {url!r}"
            )
        if protocol is not None and protocol != implied:
            raise InvalidRequestError(f"url {url!r} is {implied} but protocol is {protocol!r}")
        protocol, ssl = implied, scheme.lower() == "https"
    chosen: Protocol = "http" if protocol == "http" else "grpc"
    rest = rest.rstrip("/") or "localhost"
    if "/" in rest:
        raise InvalidRequestError(f"url must be host[:port] without a path, got {url!r}")
    parts = urlsplit("//" + rest)
    try:
        port = parts.port or DEFAULT_PORTS[chosen]
    except ValueError:
        raise InvalidRequestError(f"url has an invalid port: {url!r}") from None
    host = parts.hostname
    if not host:
        raise InvalidRequestError(f"url has no host name: {url!r}")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Target(chosen, address, ssl)


@dataclass(frozen=True)
class Completion:
    """One prompt's answer.

    ``text`` is what the server returned (prompt + completion); ``completion`` is the new text
    alone. ``total_tokens`` counts prompt + generated tokens; ``prompt_tokens`` and
    ``completion_tokens`` are known for streamed answers only (None otherwise, see the module
    docstring). ``log_probs`` (one per generated token; in a batch, zero-padded to the longest
    row) and ``cum_log_prob`` are set when log probs were asked for. ``latency_s`` is the wall
    time of the request; ``first_piece_s`` the time to the first streamed piece. A beam search
    (``beam_width`` > 1) fills ``beams``, best first; the other fields are then the best beam's.
    """

    prompt: str
    completion: str
    text: str
    total_tokens: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cum_log_prob: float | None = None
    log_probs: tuple[float, ...] | None = None
    latency_s: float = 0.0
    first_piece_s: float | None = None
    beams: tuple[BeamText, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``codegen complete --json`` prints)."""
        data = asdict(self)
        if self.log_probs is not None:
            data["log_probs"] = list(self.log_probs)
        return data


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: str
    state: str


@dataclass(frozen=True)
class Health:
    """What ``codegen health`` reports: liveness, readiness and the models served."""

    url: str
    live: bool
    ready: bool
    server_version: str
    models: tuple[ModelStatus, ...]

    def model_ready(self, name: str) -> bool:
        return any(m.name == name and m.state == "READY" for m in self.models)

    @property
    def serving(self) -> bool:
        """Ready, with the completion ensemble loaded (the streaming one is optional)."""
        return self.ready and self.model_ready(ENSEMBLE_MODEL)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["serving"] = self.serving
        data["streaming"] = self.model_ready(STREAM_MODEL)
        return data


def split_completion(prompt: str, text: str) -> str:
    """The completion alone: ``text`` minus the prompt it starts with.

    The tokenizer round-trips a prompt exactly, so ``text`` starts with it; should it not (a
    server whose detokenizer normalises text), drop the longest common prefix instead.
    """
    if text.startswith(prompt):
        return text[len(prompt) :]
    common = 0
    for a, b in zip(prompt, text, strict=False):
        if a != b:
            break
        common += 1
    return text[common:]
