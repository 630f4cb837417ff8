"""A client for the code-completion server: unary and batch completion, token streaming, health.

Speaks gRPC or HTTP to Triton through ``tritonclient`` (streaming over HTTP reads Triton's
``generate_stream`` server-sent events with ``requests``). Every request is built by
:class:`client.request.CompletionRequest`, so a bad option is refused before anything is sent,
with the same words the server would use.

    from client import CodegenClient

    with CodegenClient("localhost:8001") as codegen:
        print(codegen.complete("def fib(n):", max_tokens=32).completion)
        for piece in codegen.stream("def fib(n):", max_tokens=32):
            print(piece, end="", flush=True)

Token counts: the ensemble returns ``sequence_length`` (prompt + generated tokens) but not the
prompt's own length, and pads ``output_log_probs`` to the longest row of a batch, so a unary
answer gives :attr:`Completion.total_tokens` only. A stream knows how many tokens each piece
carries, so a streamed :class:`Completion` also has ``prompt_tokens`` and ``completion_tokens``.

One :class:`CodegenClient` is meant for one thread at a time; give each thread its own.
"""

from __future__ import annotations

import contextlib
import json
import queue
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypedDict
from urllib.parse import urlsplit

from client.request import CompletionRequest, generate_body, requested_outputs
from contract.options import InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL, STREAM_MODEL

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
    middle, ``text`` the prompt and the middle).
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
    server: the gRPC stream is cancelled, the HTTP connection is closed.
    """

    def __init__(
        self, prompt: str, pieces: Iterator[_Piece], return_log_probs: bool, started: float
    ) -> None:
        self.prompt = prompt
        self._pieces = pieces
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


class CodegenClient:
    """A connection to the code-completion server over gRPC (default) or HTTP.

    ``url`` is ``host[:port]`` or a URL with a scheme (see :func:`resolve_target`); it
    defaults to ``localhost:8001`` (gRPC) or ``localhost:8000`` (HTTP). ``timeout`` bounds how
    long one request (or the wait for the next streamed piece) may take, in seconds. Nothing is
    contacted until the first call, so constructing a client never fails for a missing server.
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: str | None = None,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.target = resolve_target(url, protocol)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._client: Any = None

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def protocol(self) -> Protocol:
        return self.target.protocol

    def __repr__(self) -> str:
        return f"CodegenClient({self.url!r})"

    # -- connection ---------------------------------------------------------------------------

    def _module(self) -> ModuleType:
        return _protocol_module(self.protocol)

    def _new_client(self) -> Any:
        module = self._module()
        if self.protocol == "grpc":
            return module.InferenceServerClient(self.target.address, ssl=self.target.ssl)
        return module.InferenceServerClient(
            self.target.address,
            ssl=self.target.ssl,
            connection_timeout=self.connect_timeout,
            network_timeout=self.timeout,
        )

    @property
    def _triton(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def __enter__(self) -> CodegenClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _error(self, exc: BaseException) -> CodegenError:
        """A tritonclient / requests / socket exception as a CodegenError a person can act on."""
        from tritonclient.utils import InferenceServerException

        if isinstance(exc, CodegenError):
            return exc
        if isinstance(exc, InferenceServerException):
            message = exc.message() or str(exc)
            if exc.status() == "StatusCode.UNAVAILABLE":
                return ServerUnavailableError(self.url, message)
            return CodegenError(message)
        import requests

        timed_out = isinstance(exc, requests.ConnectionError) and "timed out" in str(exc)
        if timed_out or isinstance(exc, TimeoutError | requests.Timeout):
            return CodegenError(f"no answer from {self.url} within {self.timeout:g} s")
        if isinstance(exc, OSError | requests.ConnectionError):
            return ServerUnavailableError(self.url, str(exc) or type(exc).__name__)
        return CodegenError(f"{type(exc).__name__}: {exc}")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._triton, method)(*args, **kwargs)
        except Exception as exc:
            raise self._error(exc) from exc

    # -- health -------------------------------------------------------------------------------

    def is_live(self) -> bool:
        """Whether the server process answers (raises ServerUnavailableError if nothing does)."""
        return bool(self._call("is_server_live"))

    def is_ready(self, model: str | None = None) -> bool:
        """Whether the server (or one model, e.g. ``"ensemble"``) is ready for requests."""
        if model is None:
            return bool(self._call("is_server_ready"))
        return bool(self._call("is_model_ready", model))

    def health(self) -> Health:
        """Liveness, readiness, server version and every model of the repository with its
        state. Raises ServerUnavailableError when nothing answers."""
        grpc = {"as_json": True} if self.protocol == "grpc" else {}
        live = self.is_live()
        ready = self.is_ready()
        metadata = self._call("get_server_metadata", **grpc)
        index = self._call("get_model_repository_index", **grpc)
        rows = index.get("models", []) if isinstance(index, dict) else index
        models = tuple(
            ModelStatus(m["name"], str(m.get("version", "")), m.get("state", "UNKNOWN"))
            for m in rows
        )
        return Health(self.url, live, ready, str(metadata.get("version", "")), models)

    def model_metadata(self, model: str = ENSEMBLE_MODEL) -> dict[str, Any]:
        """The model's inputs and outputs as the server describes them (KServe v2 JSON)."""
        grpc = {"as_json": True} if self.protocol == "grpc" else {}
        return dict(self._call("get_model_metadata", model, **grpc))

    # -- completion ---------------------------------------------------------------------------

    def complete(
        self, prompt: str, max_tokens: int = 64, **options: Unpack[SamplingOptions]
    ) -> Completion:
        """Complete one prompt with up to ``max_tokens`` new tokens (options: see
        :class:`SamplingOptions`).

        Raises InvalidRequestError before sending for a bad option, CodegenError with the
        server's message if it refuses, ServerUnavailableError if no server answers.
        """
        return self.send(CompletionRequest((prompt,), max_tokens, **options))[0]

    def complete_batch(
        self, prompts: Sequence[str], max_tokens: int = 64, **options: Unpack[SamplingOptions]
    ) -> list[Completion]:
        """Complete several prompts in one request (one batch on the server), same options."""
        return self.send(CompletionRequest(tuple(prompts), max_tokens, **options))

    def send(self, request: CompletionRequest) -> list[Completion]:
        """Send a prepared request to the unary ensemble: one Completion per prompt."""
        module = self._module()
        kwargs = {"client_timeout": self.timeout} if self.protocol == "grpc" else {}
        started = time.perf_counter()
        result = self._call(
            "infer",
            ENSEMBLE_MODEL,
            request.infer_inputs(module),
            outputs=requested_outputs(module),
            **kwargs,
        )
        latency = time.perf_counter() - started
        n, k = len(request.prompts), request.beam_width
        texts = result.as_numpy("OUTPUT_0").reshape(n, k)  # flat [prompt * beam] on the wire
        lengths = result.as_numpy("sequence_length").reshape(n, k)
        cum = result.as_numpy("cum_log_probs").reshape(n, k)
        log_probs = result.as_numpy("output_log_probs").reshape(n, k, -1)
        want_log_probs = request.return_log_probs
        completions = []
        for i, prompt in enumerate(request.prompts):
            beams = []
            for beam in range(k):
                text = texts[i, beam].decode("utf-8", errors="replace")
                beams.append(
                    BeamText(
                        text=text,
                        completion=split_completion(prompt, text),
                        total_tokens=int(lengths[i, beam]),
                        cum_log_prob=float(cum[i, beam]),
                        log_probs=(
                            tuple(float(x) for x in log_probs[i, beam]) if want_log_probs else None
                        ),
                    )
                )
            best = beams[0]
            completions.append(
                Completion(
                    prompt=prompt,
                    completion=best.completion,
                    text=best.text,
                    total_tokens=best.total_tokens,
                    cum_log_prob=best.cum_log_prob if want_log_probs or k > 1 else None,
                    log_probs=best.log_probs,
                    latency_s=latency,
                    beams=tuple(beams) if k > 1 else None,
                )
            )
        return completions

    # -- streaming ----------------------------------------------------------------------------

    def stream(
        self, prompt: str, max_tokens: int = 64, **options: Unpack[SamplingOptions]
    ) -> CompletionStream:
        """Complete one prompt, yielding text pieces as tokens are generated.

        The pieces concatenate to the completion (for greedy search, exactly the text
        :meth:`complete` returns). The request is validated here, before anything is sent;
        server errors are raised while iterating.
        """
        return self.open_stream(CompletionRequest((prompt,), max_tokens, **options))

    def open_stream(self, request: CompletionRequest) -> CompletionStream:
        """Stream a prepared one-prompt request from the streaming ensemble."""
        if len(request.prompts) != 1:
            raise InvalidRequestError(
                f"streaming takes one prompt per request, got {len(request.prompts)}"
            )
        if request.beam_width > 1:
            raise InvalidRequestError(
                f"beam_width={request.beam_width} cannot stream: beams are ranked only once "
                "they finish; use complete() instead"
            )
        started = time.perf_counter()
        pieces = (
            self._grpc_pieces(request) if self.protocol == "grpc" else self._http_pieces(request)
        )
        return CompletionStream(request.prompts[0], pieces, request.return_log_probs, started)

    def _grpc_pieces(self, request: CompletionRequest) -> Iterator[_Piece]:
        """Pieces from gRPC bidirectional streaming; leaving early cancels the request."""
        module = self._module()
        try:
            # one client per stream: a gRPC client carries at most one stream at a time
            client = module.InferenceServerClient(self.target.address, ssl=self.target.ssl)
        except Exception as exc:
            raise self._error(exc) from exc
        answers: queue.Queue = queue.Queue()
        finished = False
        try:
            try:
                client.start_stream(callback=lambda result, error: answers.put((result, error)))
                client.async_stream_infer(
                    STREAM_MODEL,
                    request.infer_inputs(module),
                    outputs=requested_outputs(module),
                    enable_empty_final_response=True,
                )
            except Exception as exc:
                # a stream that failed (e.g. nothing listens) reports why through the callback
                reported = None
                with contextlib.suppress(queue.Empty):
                    reported = answers.get_nowait()[1]
                raise self._error(reported or exc) from exc
            while True:
                try:
                    result, error = answers.get(timeout=self.timeout)
                except queue.Empty:
                    raise CodegenError(
                        f"no answer from {self.url} within {self.timeout:g} s"
                    ) from None
                if error is not None:
                    raise self._error(error)
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
            with contextlib.suppress(Exception):
                client.stop_stream(cancel_requests=not finished)
            with contextlib.suppress(Exception):
                client.close()

    def _http_pieces(self, request: CompletionRequest) -> Iterator[_Piece]:
        """Pieces from Triton's HTTP ``generate_stream`` (server-sent events); leaving early
        closes the connection, which cancels the request."""
        import requests
        import sseclient

        scheme = "https" if self.target.ssl else "http"
        endpoint = f"{scheme}://{self.target.address}/v2/models/{STREAM_MODEL}/generate_stream"
        try:
            response = requests.post(
                endpoint,
                json=generate_body(request),
                stream=True,
                timeout=(self.connect_timeout, self.timeout),
            )
        except Exception as exc:
            raise self._error(exc) from exc
        try:
            if response.status_code != 200:
                raise CodegenError(_http_error_message(response))
            events = sseclient.SSEClient(response.iter_content(chunk_size=None))
            for event in events.events():
                try:
                    data = json.loads(event.data)
                except json.JSONDecodeError as exc:
                    raise CodegenError(
                        f"unexpected answer from the server: {event.data!r}"
                    ) from exc
                if "error" in data:
                    raise CodegenError(str(data["error"]))
                yield _Piece(
                    text=str(_flat(data.get("OUTPUT_0", ""))[0]),
                    sequence_length=int(_flat(data.get("sequence_length", 0))[0]),
                    cum_log_prob=float(_flat(data.get("cum_log_probs", 0.0))[0]),
                    log_probs=[float(x) for x in _flat(data.get("output_log_probs", []))],
                )
        except CodegenError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc
        finally:
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
