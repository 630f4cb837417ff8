"""What the client library returns and raises, and where it connects: the plain data of
:mod:`client.client` and :mod:`client.transport` (a streamed :class:`Piece`, a refusal's
message), importable without ``tritonclient``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Self, TypedDict
from urllib.parse import urlsplit

import numpy as np

from contract.options import InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL, RESULT_OUTPUT_NAMES, STREAM_MODEL

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
    where an editor wants the answer to end (contract.options.EditorStops); token_healing:
    false sends the prompt's last token as it is (None: the server's default, on for plain
    completion; contract/healing.py).
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
    token_healing: bool | None


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
    alone. ``total_tokens`` counts prompt + generated tokens; ``prompt_tokens`` (the prompt the
    engine ran), ``completion_tokens`` and ``finish_reason`` (contract/finish.py) are the
    engine's account (None from a server that does not give it). ``log_probs`` (one per
    generated token; in a batch, zero-padded to the longest
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
    finish_reason: str | None = None
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


class Closing:
    """A context manager that closes what it holds on the way out."""

    def close(self) -> None:
        """Release what is held (subclasses)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def account(read: Callable[[str], Any]) -> dict[str, Any]:
    """The engine's account of a streamed answer, from its last response (``read(name)``: the
    output as an array, or None; none of them before the last response)."""
    reason, prompt, completion = (read(name) for name in RESULT_OUTPUT_NAMES)
    if reason is None:
        return {}
    first = reason.reshape(-1)[0]
    return {
        "finish_reason": first.decode() if isinstance(first, bytes) else str(first),
        "prompt_tokens": None if prompt is None else int(prompt.reshape(-1)[0]),
        "completion_tokens": None if completion is None else int(completion.reshape(-1)[0]),
    }


def unary_account(read: Callable[[str], Any], n: int, beams: int) -> list[dict[str, Any]]:
    """The engine's account of each of ``n`` prompts of a unary answer (the best beam's), or
    empty dicts from a server that does not give it."""
    reason, prompt, completion = (read(name) for name in RESULT_OUTPUT_NAMES)
    if reason is None or prompt is None or completion is None:
        return [{} for _ in range(n)]
    reasons, completions = reason.reshape(n, beams), completion.reshape(n, beams)
    return [
        {
            "finish_reason": reasons[i, 0].decode(),
            "prompt_tokens": int(prompt.reshape(n, -1)[i, 0]),
            "completion_tokens": int(completions[i, 0]),
        }
        for i in range(n)
    ]


def _flat(value: Any) -> list:
    """A JSON value of a streamed tensor as a list (Triton writes one element as a scalar)."""
    return value if isinstance(value, list) else [value]


@dataclass
class Piece:
    """One streamed answer: its text, the tokens it carries and, on the last, ``final``."""

    text: str = ""
    log_probs: list[float] = field(default_factory=list)
    sequence_length: int | None = None  # prompt + generated so far (Triton's streams)
    cum_log_prob: float | None = None
    final: bool = False
    usage: dict[str, int] | None = None  # the OpenAI API's token counts
    # the engine's account, on a Triton stream's last piece (contract/finish.py)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    arrived: float = field(default_factory=time.perf_counter)  # when it came off the wire

    @property
    def tokens(self) -> int:
        return len(self.log_probs) or (1 if self.text else 0)

    @classmethod
    def from_result(cls, result: Any) -> Piece:
        """From a gRPC stream's InferResult."""
        final = result.get_response().parameters.get("triton_final_response")
        text = result.as_numpy("OUTPUT_0")
        if text is None:
            return cls(final=bool(final is not None and final.bool_param))
        log_probs = result.as_numpy("output_log_probs")
        return cls(
            text=text.reshape(-1)[0].decode("utf-8", errors="replace"),
            log_probs=[] if log_probs is None else [float(x) for x in log_probs.ravel()],
            sequence_length=int(result.as_numpy("sequence_length").reshape(-1)[0]),
            cum_log_prob=float(result.as_numpy("cum_log_probs").reshape(-1)[0]),
            final=bool(final is not None and final.bool_param),
            **account(result.as_numpy),
        )

    @classmethod
    def from_generate(cls, data: dict[str, Any]) -> Piece:
        """From one event of Triton's ``generate_stream`` (it sends no final flag: the end
        of the body is the end)."""
        return cls(
            text=str(_flat(data.get("OUTPUT_0", ""))[0]),
            log_probs=[float(x) for x in _flat(data.get("output_log_probs", []))],
            sequence_length=int(_flat(data.get("sequence_length", 0))[0]),
            cum_log_prob=float(_flat(data.get("cum_log_probs", 0.0))[0]),
            **account(lambda name: None if name not in data else np.array(_flat(data[name]))),
        )

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Piece:
        """From one chunk of the OpenAI API's ``/v1/completions`` stream, or of its
        ``/v1/chat/completions`` stream (the text in ``delta.content``)."""
        choices = data.get("choices", [])
        text = "".join(
            c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices
        )
        return cls(text=text, usage=data.get("usage"))


def error_message(body: bytes, status: int) -> str:
    """The server's message from a refused HTTP request (Triton's JSON or one event, or the
    OpenAI API's error object with its ``param``)."""
    text = body.decode(errors="replace").strip()
    for candidate in (text, text.removeprefix("data:").strip()):
        with contextlib.suppress(ValueError):
            error = json.loads(candidate)["error"]
            if isinstance(error, dict):
                param = f" [param: {error['param']}]" if error.get("param") else ""
                return f"HTTP {status}: {error.get('message')}{param}"
            return str(error)
    return f"HTTP {status}: {text[:200]}"
