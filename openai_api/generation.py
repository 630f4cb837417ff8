"""Generation behind the API: one choice at a time, blocking, in a worker thread.

Two ways to the ensemble, both through :class:`client.CodegenClient`:

- **Streamed** (``stream: true``, or stop sequences): the decoupled ``engine`` model; a
  client that leaves cancels the gRPC stream and the engine drops the sequence.
- **Unary** (``stream: false`` and no stop sequences): the ``ensemble`` pipeline, exactly what
  gRPC and HTTP clients use, so the load test measures only this layer's overhead. Each goes
  with a request id of its own; a client that leaves gets it stopped by a stop request with
  that id (``stop`` true: docs/api.md).

Both report the engine's own account: the prompt tokens it ran, the tokens it generated and
why it ended (contract/finish.py), which becomes ``usage`` and ``finish_reason``.

OpenAI stop sequences go to the engine as stop words. A stream ends at the first one in its
text, matched where the text is decoded, even where the model spells it with other tokens than
the stop word's (postprocessing/stop_text.py), and its last piece ends with it; OpenAI leaves
it out, so it is cut from that piece here (``contract.words.without_stop_word``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from client import (
    CodegenClient,
    CodegenError,
    Completion,
    CompletionRequest,
    CompletionStream,
    Health,
    resolve_target,
)
from contract.finish import STOP_WORD, openai_reason
from contract.words import without_stop_word
from openai_api.capabilities import count_tokens
from openai_api.prompt_counter import PROBE_PROMPT, PromptCounter
from openai_api.repo_context import ContextChunk, FittedContext, fit_context
from openai_api.settings import DEFAULT_CONTEXT_TOKENS

log = logging.getLogger("openai_api")

# /health completes one token through both paths, at most every PROBE_EVERY_S seconds: a
# model can say READY and still serve nothing (a wedged stub), and readiness must see that.
PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice: its text (the completion only, stop sequence cut), exact counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # OpenAI's: "stop", "length" (contract.finish.openai_reason)
    log_probs: tuple[float, ...] | None = None


def engine_account(done: Completion) -> tuple[int, int, str]:
    """(prompt tokens, completion tokens, the engine's finish reason) of a finished choice."""
    if done.prompt_tokens is None or done.completion_tokens is None or not done.finish_reason:
        raise CodegenError("the server's answer carries no token counts or finish reason")
    return done.prompt_tokens, done.completion_tokens, done.finish_reason


class ChoiceStream(Iterator[str]):
    """One choice streamed from the ``engine`` model: text pieces with stop sequences applied.

    Once exhausted, :attr:`result` holds the counts. :meth:`close` cancels the request on the
    server when it is still generating.
    """

    def __init__(self, stream: CompletionStream, stops: Sequence[str]) -> None:
        self._stream = stream
        self.stops = tuple(stops)  # the stop words it was sent with
        self._done = False
        self._primed: list[str] = []
        self.result: ChoiceResult | None = None
        self.text = ""

    def prime(self) -> None:
        """Wait for the first text (or the end): a refused request raises here, before any
        response is sent, so it can still get its own status code."""
        with contextlib.suppress(StopIteration):
            self._primed.append(self._advance())

    def take_primed(self) -> str:
        """The first text :meth:`prime` waited for ("" if none), which iterating no longer
        gives: the response can send it before the thread that reads the rest is started."""
        return self._primed.pop() if self._primed else ""

    def __next__(self) -> str:
        if self._primed:
            return self._primed.pop()
        return self._advance()

    def _advance(self) -> str:
        while not self._done:
            try:
                piece = next(self._stream)
            except StopIteration:
                self._done = True
                self._finish()
                break
            if self._stream.finish_reason == STOP_WORD:  # the last piece, ending with it
                piece = without_stop_word(piece, self.stops)
            if piece:
                self.text += piece
                return piece
        raise StopIteration

    def _finish(self) -> None:
        done = self._stream.completion
        if done is None:
            raise CodegenError("the stream ended without its token counts")
        prompt, generated, reason = engine_account(done)
        self.result = ChoiceResult(
            text=self.text,
            prompt_tokens=prompt,
            completion_tokens=generated,
            finish_reason=openai_reason(reason),
            log_probs=done.log_probs,
        )

    def close(self) -> None:
        """Stop reading; a request still generating is cancelled on the server."""
        self._stream.close()

    def cancel(self) -> None:
        """Cancel the request on the server from any thread; a reader blocked waiting for the
        next piece wakes at once (with :class:`client.StreamCancelledError`)."""
        self._stream.cancel()

    def run(self) -> ChoiceResult:
        """The whole choice (a :class:`PendingChoice`)."""
        return self.drain()

    def drain(self) -> ChoiceResult:
        try:
            for _ in self:
                pass
        finally:
            self.close()
        assert self.result is not None
        return self.result


class PendingChoice(Protocol):
    """One non-streamed choice not yet run: ``run`` blocks until it is done (in a worker
    thread); ``cancel``, from another thread, stops its generation on the server."""

    def run(self) -> ChoiceResult: ...

    def cancel(self) -> None: ...


class UnaryChoice:
    """A choice through the unary ``ensemble``, sent with a request id of its own so that
    ``cancel`` can stop it with a stop request (Triton 2.51 does not pass a unary ensemble
    request's cancellation on to the step already generating)."""

    def __init__(self, backend: Backend, request: CompletionRequest) -> None:
        self.backend = backend
        self.request = request
        self.request_id = f"openai-api-{uuid.uuid4().hex}"

    def run(self) -> ChoiceResult:
        client = self.backend.client()
        (done,) = client.send(self.request, request_id=self.request_id)
        prompt_tokens, generated, reason = engine_account(done)
        log_probs = done.log_probs[:generated] if done.log_probs is not None else None
        return ChoiceResult(
            text=done.completion,
            prompt_tokens=prompt_tokens,
            completion_tokens=generated,
            finish_reason=openai_reason(reason),
            log_probs=log_probs,
        )

    def cancel(self) -> None:
        """Send the stop request (blocking: call it from a worker thread)."""
        self.backend.client().stop(self.request_id)


def model_context(checkpoint: Path | None) -> int | None:
    """The served checkpoint's context in tokens, when its config is at hand."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())  # type: ignore[operator]
    except (OSError, TypeError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("n_positions")
    return value if isinstance(value, int) else None


class Backend:
    """The blocking calls the API makes, one :class:`CodegenClient` per worker thread."""

    def __init__(
        self,
        triton_url: str,
        checkpoint: Path | None,
        timeout_s: float,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    ) -> None:
        self.triton_url = triton_url
        self.timeout_s = timeout_s
        self.counter = PromptCounter(checkpoint)  # chat's template and counts
        # the prompt budget for repository context: the setting, within the model's context
        self.context_tokens = min(context_tokens, model_context(checkpoint) or context_tokens)
        self._local = threading.local()
        self._probe_lock = threading.Lock()
        self._probed_at = -PROBE_EVERY_S
        self._probe_problem: str | None = None

    def client(self) -> CodegenClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = CodegenClient(self.triton_url, "grpc", timeout=self.timeout_s)
            self._local.client = client
        return client

    def health(self) -> Health:
        return self.client().health()

    def fit_context(
        self, chunks: Sequence[ContextChunk], prefix: str, suffix: str, max_tokens: int
    ) -> FittedContext:
        """The prompt with as much repository context as the budget takes (counted by the
        server's tokenizer: :mod:`openai_api.repo_context`)."""
        counter = getattr(self._local, "preprocessing", None)
        if counter is None:
            import tritonclient.grpc as grpcclient

            target = resolve_target(self.triton_url, "grpc")
            counter = grpcclient.InferenceServerClient(target.address, ssl=target.ssl)
            self._local.preprocessing = counter
        budget = self.context_tokens - max_tokens
        return fit_context(
            chunks, prefix, suffix, budget, lambda rows, sfx: count_tokens(counter, rows, sfx)
        )

    def serves(self) -> str | None:
        """None when one greedy token came back through the unary ensemble and the stream
        within PROBE_TIMEOUT_S (probed at most every PROBE_EVERY_S; concurrent callers share
        the answer), else why not."""
        with self._probe_lock:
            now = time.monotonic()
            if now - self._probed_at < PROBE_EVERY_S:
                return self._probe_problem
            request = CompletionRequest((PROBE_PROMPT,), max_tokens=1, temperature=0.0)
            problem = None
            try:
                with CodegenClient(self.triton_url, "grpc", timeout=PROBE_TIMEOUT_S) as client:
                    client.send(request)
                    with client.open_stream(request) as stream:
                        for _ in stream:
                            pass
            except CodegenError as exc:
                problem = f"a one-token completion failed: {exc}"
            self._probed_at, self._probe_problem = time.monotonic(), problem
            return problem

    def open_stream(self, request: CompletionRequest) -> ChoiceStream:
        return ChoiceStream(self.client().open_stream(request), request.stop_words)

    def choice(self, request: CompletionRequest, stops: Sequence[str]) -> PendingChoice:
        """One non-streamed choice, to run: unary when no stop sequence is asked for; else
        streamed, which stops at a stop sequence found in the text even where the engine's
        token match misses it. Either can be cancelled while it runs (a client that leaves)."""
        if stops:
            return self.open_stream(request)
        return UnaryChoice(self, request)

    def complete(self, request: CompletionRequest, stops: Sequence[str]) -> ChoiceResult:
        """One choice, whole (see :meth:`choice`)."""
        return self.choice(request, stops).run()
