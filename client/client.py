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

Token counts and why it ended: every final response carries the engine's account
(``finish_reason``, ``prompt_tokens``, ``completion_tokens``; contract/finish.py), which
:class:`Completion` holds, unary or streamed.

Giving up cancels the generation on the server: a stream that is left, closed, cancelled
(:meth:`CompletionStream.cancel`) or times out cancels its gRPC stream (or closes its HTTP
connection); a unary request that times out or is interrupted (Ctrl-C) sends a stop request
with its request id (:meth:`CodegenClient.stop`: Triton 2.51 does not pass a unary ensemble
request's cancellation on to the step already generating).

One :class:`CodegenClient` is meant for one thread at a time; give each thread its own.
The data it returns and raises is in :mod:`client.results`, streaming in :mod:`client.stream`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from client.request import CompletionRequest
from client.results import (
    BeamText,
    Closing,
    CodegenError,
    Completion,
    Health,
    ModelStatus,
    Protocol,
    SamplingOptions,
    Target,
    TimedOutError,
    resolve_target,
    split_completion,
    unary_account,
)
from client.stream import CompletionStream
from client.transport import Transport
from contract.options import InvalidRequestError
from contract.tensors import ENSEMBLE_MODEL

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CodegenClient", "SamplingOptions"]

STOP_TIMEOUT_S = 10.0  # how long a stop request sent on giving up may take


class CodegenClient(Closing):
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
        self.transport = Transport(resolve_target(url, protocol), timeout, connect_timeout)
        self.target: Target = self.transport.target
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def protocol(self) -> Protocol:
        return self.target.protocol

    def __repr__(self) -> str:
        return f"CodegenClient({self.url!r})"

    # -- connection ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        self.transport.close()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.transport.call(method, *args, **kwargs)

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

    def send(self, request: CompletionRequest, request_id: str | None = None) -> list[Completion]:
        """Send a prepared request to the unary ensemble: one Completion per prompt.

        It goes with ``request_id`` (a new random one by default): if it times out or is
        interrupted (Ctrl-C), a stop request with that id stops its generation on the server
        before the error is raised (see :meth:`stop`)."""
        request_id = request_id or f"codegen-client-{uuid.uuid4().hex}"
        started = time.perf_counter()
        try:
            result = self.transport.infer(request, request_id)
        except (KeyboardInterrupt, TimedOutError):
            self._stop_quietly(request_id)
            raise
        latency = time.perf_counter() - started
        n, k = len(request.prompts), request.beam_width
        texts = result.as_numpy("OUTPUT_0").reshape(n, k)  # flat [prompt * beam] on the wire
        lengths = result.as_numpy("sequence_length").reshape(n, k)
        cum = result.as_numpy("cum_log_probs").reshape(n, k)
        log_probs = result.as_numpy("output_log_probs").reshape(n, k, -1)
        account = unary_account(result.as_numpy, n, k)
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
                    **account[i],
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
        return CompletionStream(
            request.prompts[0],
            lambda: self.transport.stream(request),
            request.return_log_probs,
            started,
        )

    # -- stopping a unary request -------------------------------------------------------------

    def stop(self, request_id: str) -> bool:
        """Stop the unary request with ``request_id`` that is still generating (sent by any
        client): the stop request (``stop`` true, same id) ends it, and its client gets an
        error saying so. True when it was stopped, False when nothing with that id was
        generating (it had ended)."""
        return self.transport.stop(request_id)

    def _stop_quietly(self, request_id: str) -> None:
        """Stop a request given up on, on a connection of its own (the one in use may be
        mid-call); a failure to stop must not hide why it was given up."""
        stopper = CodegenClient(self.url, timeout=STOP_TIMEOUT_S)
        try:
            stopper.stop(request_id)
        except (CodegenError, KeyboardInterrupt):
            pass
        finally:
            stopper.close()
