"""Generation behind the API: one choice at a time, blocking, in a worker thread.

Two ways to the ensemble, both through :class:`client.CodegenClient`, both with exact token
counts:

- **Streamed** (``stream: true``, and any request when no verified tokenizer is at hand): the
  decoupled ``ensemble_stream``. Every piece says how many tokens it carries, so the counts are
  the server's own; a stop sequence found in the text, or a client that leaves, cancels the
  gRPC stream and the engine drops the sequence.
- **Unary** (``stream: false`` and no stop sequences): the ``ensemble`` pipeline, exactly what
  gRPC and HTTP clients use, so the load test measures only this layer's overhead. Each goes
  with a request id of its own; a client that leaves gets it stopped by a stop request with
  that id (``stop`` true: docs/api.md). The
  ensemble returns ``sequence_length`` (prompt + generated tokens); the prompt's own length
  comes from the served checkpoint's tokenizer, loaded the way ``preprocessing`` loads it,
  and checked once against a streamed request (the server's own count) before it is trusted.

OpenAI stop sequences are matched on text here and cut from the output, and the stream is then
cancelled. They are also sent to the engine as stop words, which it matches on tokens; the text
match also finds a sequence that the model spells with other tokens or that spans two pieces.
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
from typing import Any, Protocol

from client import (
    CodegenClient,
    CodegenError,
    CompletionRequest,
    CompletionStream,
    Health,
    ServerUnavailableError,
    resolve_target,
)
from contract.model_tokens import prompt_head
from openai_api.capabilities import count_tokens
from openai_api.repo_context import ContextChunk, FittedContext, fit_context
from openai_api.settings import DEFAULT_CONTEXT_TOKENS

log = logging.getLogger("openai_api")

PROBE_PROMPT = 'def probe(x):\n    """Ünïcode ✓ and\ttabs."""\n    return x  # 1234\n'
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
    finish_reason: str  # "stop" or "length"
    log_probs: tuple[float, ...] | None = None


def finish_reason(stopped: bool, completion_tokens: int, max_tokens: int) -> str:
    """OpenAI's reason: "length" when max_tokens ran out (and no stop sequence ended it)."""
    return "length" if not stopped and completion_tokens >= max_tokens else "stop"


class StopMatcher:
    """Finds the first stop sequence in streamed text; holds back text that could begin one,
    so nothing after (or part of) a stop sequence is ever sent."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.held = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop sequence was found)."""
        text = self.held + piece
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return text[: min(hits)], True
        hold = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:size]):
                    hold = size
                    break
        self.held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


class ChoiceStream(Iterator[str]):
    """One choice streamed from ``ensemble_stream``: text pieces with stop sequences applied.

    Once exhausted, :attr:`result` holds the counts. :meth:`close` cancels the request on the
    server when it is still generating.
    """

    def __init__(self, stream: CompletionStream, stops: Sequence[str], max_tokens: int) -> None:
        self._stream = stream
        self._matcher = StopMatcher(stops)
        self._max_tokens = max_tokens
        self._done = False
        self._primed: list[str] = []
        self.result: ChoiceResult | None = None
        self.text = ""

    def prime(self) -> None:
        """Wait for the first text (or the end): a refused request raises here, before any
        response is sent, so it can still get its own status code."""
        with contextlib.suppress(StopIteration):
            self._primed.append(self._advance())

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
                tail = self._matcher.flush()
                self._finish(stopped=False)
                if tail:
                    self.text += tail
                    return tail
                break
            text, stopped = self._matcher.push(piece)
            if stopped:
                self._done = True
                # cancel what is still generating; the closed stream then ends, and its
                # completion counts exactly the tokens of the pieces received
                self._stream.close()
                with contextlib.suppress(StopIteration):
                    next(self._stream)
                self._finish(stopped=True)
            if text:
                self.text += text
                return text
        raise StopIteration

    def _finish(self, stopped: bool) -> None:
        done = self._stream.completion
        if done is None or done.prompt_tokens is None or done.completion_tokens is None:
            raise CodegenError("the stream ended without its token counts")
        self.result = ChoiceResult(
            text=self.text,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
            finish_reason=finish_reason(stopped, done.completion_tokens, self._max_tokens),
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
        prompt_tokens = self.backend.counter.count(self.request.prompts[0])
        generated = done.total_tokens - prompt_tokens
        log_probs = done.log_probs[:generated] if done.log_probs is not None else None
        return ChoiceResult(
            text=done.completion,
            prompt_tokens=prompt_tokens,
            completion_tokens=generated,
            finish_reason=finish_reason(False, generated, self.request.max_tokens),
            log_probs=log_probs,
        )

    def cancel(self) -> None:
        """Send the stop request (blocking: call it from a worker thread)."""
        self.backend.client().stop(self.request_id)


class PromptCounter:
    """Counts prompt tokens with the served checkpoint's tokenizer, once it has been checked
    against the server's own count (a streamed probe request)."""

    def __init__(self, checkpoint: Path | None) -> None:
        self.checkpoint = checkpoint
        self._tokenizer: Any = None
        self._head = 0  # tokens the tokenizer puts before a prompt (contract.model_tokens)
        self._state = "unchecked"  # then "verified" or "unavailable"
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        return self._state

    def count(self, prompt: str) -> int:
        """As preprocessing counts: the text's tokens and what the tokenizer puts before any
        prompt (a BOS)."""
        return len(self._tokenizer.encode(prompt, add_special_tokens=False)) + self._head

    def usable(self, client: CodegenClient) -> bool:
        """Whether unary requests can be counted exactly (checked once, on first use)."""
        if self._state != "unchecked":
            return self._state == "verified"
        with self._lock:
            if self._state == "unchecked":
                self._state = self._check(client)
        return self._state == "verified"

    def _check(self, client: CodegenClient) -> str:
        if self.checkpoint is None or not (self.checkpoint / "config.json").exists():
            log.warning(
                "no checkpoint at %s: every request uses ensemble_stream for exact token "
                "counts (pass --checkpoint to use the unary ensemble)",
                self.checkpoint,
            )
            return "unavailable"
        try:
            from transformers import PreTrainedTokenizerFast

            self._tokenizer = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint))
            self._head = len(prompt_head(self._tokenizer, self.checkpoint))
        except Exception as exc:
            log.warning(
                "cannot load the tokenizer in %s (%s): streaming only", self.checkpoint, exc
            )
            return "unavailable"
        try:
            stream = client.open_stream(
                CompletionRequest((PROBE_PROMPT,), max_tokens=1, temperature=0.0)
            )
            with stream:
                for _ in stream:
                    pass
            served = stream.completion.prompt_tokens if stream.completion else None
        except ServerUnavailableError:
            raise  # nothing to check against yet: check again on the next request
        except CodegenError as exc:
            log.warning("cannot check the tokenizer against the server (%s): streaming only", exc)
            return "unavailable"
        local = self.count(PROBE_PROMPT)
        if served != local:
            log.warning(
                "the tokenizer in %s counts %s prompt tokens where the server counts %s: it is "
                "not the served one, so every request uses ensemble_stream",
                self.checkpoint,
                local,
                served,
            )
            return "unavailable"
        log.info("prompt tokens counted with %s (checked against the server)", self.checkpoint)
        return "verified"


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
        self.counter = PromptCounter(checkpoint)
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

    def open_stream(self, request: CompletionRequest, stops: Sequence[str]) -> ChoiceStream:
        return ChoiceStream(self.client().open_stream(request), stops, request.max_tokens)

    def choice(self, request: CompletionRequest, stops: Sequence[str]) -> PendingChoice:
        """One non-streamed choice, to run: unary when prompt tokens can be counted exactly
        and no stop sequence or suffix is asked for; else streamed, which stops at a stop
        sequence found in the text even where the engine's token match misses it. Either can
        be cancelled while it runs (a client that leaves)."""
        # a FIM prompt's tokens are the server's to count (its sentinels): streamed
        if stops or any(request.suffixes) or not self.counter.usable(self.client()):
            return self.open_stream(request, stops)
        return UnaryChoice(self, request)

    def complete(self, request: CompletionRequest, stops: Sequence[str]) -> ChoiceResult:
        """One choice, whole (see :meth:`choice`)."""
        return self.choice(request, stops).run()
