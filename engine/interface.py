"""What every generation backend offers the Triton stage: requests, results, listeners, handles.

The engine model (backend/engine_stage.py) talks to its backend only through
:class:`GenerationBackend`: the torch engine (engine/torch_engine.py) and OpenVINO GenAI's
continuous-batching pipeline (engine/openvino_backend.py) both implement it, so the callers
(``gptj``, ``ensemble_stream``), the cancel channel, validation and the metrics see no
difference between them. Plain data, protocols and the one blocking helper every backend's
``generate`` is: no torch, no OpenVINO.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from contract.healing import TokenExtensions
from contract.options import (
    NO_BEAMS,
    NO_EDITOR_STOPS,
    BeamParams,
    EditorStops,
    InvalidRequestError,
    SamplingParams,
)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None  # None, or outside the vocabulary: the model's own end token
    stop_words: Sequence[Sequence[int]] = ()
    bad_words: Sequence[Sequence[int]] = ()
    beam: BeamParams = NO_BEAMS  # width > 1: beam search (top-k, top-p and seed unused)
    # whether the caller reads the result's log probs (is_return_log_probs); the torch engine
    # computes them always, a backend that cannot give the contract's refuses only when asked
    return_log_probs: bool = True
    editor: EditorStops = NO_EDITOR_STOPS  # where an editor wants the answer to end
    # token healing: the prompt's last token, held back out of prompt_ids by the tokenizer
    # stage; the first generated token must start with its text (contract/healing.py)
    held_back: int | None = None

    @property
    def rows(self) -> int:
        """Rows of the running batch the request takes."""
        return self.beam.width

    def end_token(self, vocab_size: int, model_end_id: int) -> int:
        """The token that ends this request: its ``end_id``, or the model's own when it sent
        none or one outside the vocabulary."""
        end_id = self.end_id
        if end_id is None or not 0 <= end_id < vocab_size:
            return model_end_id
        return end_id

    def stops_by_last_token(self) -> dict[int, list[tuple[int, ...]]]:
        """The stop words keyed by their last token, so that after each token only the words
        it can complete are compared."""
        stops: dict[int, list[tuple[int, ...]]] = {}
        for word in self.stop_words:
            stops.setdefault(word[-1], []).append(tuple(word))
        return stops


@dataclass(frozen=True)
class ModelLimits:
    """What a request must fit whatever backend runs it: the model's vocabulary and context,
    and the server's widest beam search. Every backend checks these first, and so do the
    models that call the engine, before a request can wait in a queue behind valid work."""

    vocab_size: int
    context: int
    max_beam_width: int

    def check(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError, naming the option, for a request that cannot run."""
        vocab, context = self.vocab_size, self.context
        if not request.prompt_ids:
            raise InvalidRequestError("the prompt is empty: send at least one character of text")
        if request.max_new_tokens < 1:
            raise InvalidRequestError(
                f"request_output_len must be >= 1, got {request.max_new_tokens}"
            )
        total = len(request.prompt_ids) + request.max_new_tokens
        if total > context:
            raise InvalidRequestError(
                f"prompt ({len(request.prompt_ids)} tokens) + request_output_len "
                f"({request.max_new_tokens}) = {total} exceeds the model's context of {context} "
                "tokens; shorten the prompt or ask for fewer tokens"
            )
        width = request.beam.width
        if width > 1 and request.editor.active:
            raise InvalidRequestError(
                "single_line, n_indent and t_max_predict_ms end one answer where an editor "
                "wants it; a beam search has several: send beam_width 1 with them"
            )
        if width > self.max_beam_width:
            raise InvalidRequestError(
                f"beam_width={width} is over this server's limit of {self.max_beam_width} "
                "(max_beam_width in engine/config.pbtxt); ask for fewer beams"
            )
        if request.held_back is not None and not 0 <= request.held_back < vocab:
            raise InvalidRequestError(
                f"held_back_id {request.held_back} is outside the vocabulary (-1: none)"
            )
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary")
        for kind, words in (("stop", request.stop_words), ("bad", request.bad_words)):
            for word in words:
                if not word or any(not 0 <= t < vocab for t in word):
                    raise InvalidRequestError(f"{kind} word {list(word)} has invalid token ids")


def check_editor_texts(request: GenerationRequest, texts: Sequence[str] | None) -> None:
    """Refuse editor stop rules on a backend that was given no token texts to read them by
    (the engine model always gives them; a bare backend may not)."""
    if request.editor.active and texts is None:
        raise InvalidRequestError(
            "single_line, n_indent and t_max_predict_ms need the text of each token, and this "
            "engine was started without its tokenizer's: start it with token_texts"
        )


def check_healing(request: GenerationRequest, extensions: TokenExtensions | None) -> None:
    """Refuse a held-back token on a backend that was given no vocabulary index to heal it
    with (the engine model always gives one; a bare backend may not)."""
    if request.held_back is not None and extensions is None:
        raise InvalidRequestError(
            "token healing (held_back_id) needs the text of each token, and this engine was "
            "started without its tokenizer's: start it with extensions, or send the prompt "
            "whole (held_back_id -1)"
        )
    if request.held_back is None:
        return
    allowed = extensions.allowed(request.held_back)
    if not allowed:
        raise InvalidRequestError(
            f"held_back_id {request.held_back} is a special token or part of a character: "
            "it cannot be healed; send the prompt whole (held_back_id -1)"
        )
    if len(allowed) < request.beam.width:
        raise InvalidRequestError(
            f"beam_width={request.beam.width} with token healing needs as many tokens that start "
            f"with the prompt's last token {extensions.texts[request.held_back]!r}, and "
            f"{len(allowed)} do: send token_healing false, or fewer beams"
        )


class NotHonouredError(InvalidRequestError):
    """A valid request that this backend cannot honour exactly (an option its engine lacks),
    which another backend can: the caller may run it there instead of refusing it. ``reason``
    names the option, short (the fallback metric's label)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_cache_budget(request: GenerationRequest, needed: int, budget: int) -> None:
    """Refuse a request whose KV cache (``needed`` positions, as the backend allocates them)
    could never fit the server's budget."""
    if needed > budget:
        beams = f" x {request.beam.width} beams" if request.beam.width > 1 else ""
        raise InvalidRequestError(
            f"prompt + request_output_len{beams} needs {needed} positions of KV cache, over "
            f"this server's budget of {budget} (kv_cache_tokens in engine/config.pbtxt); ask "
            "for fewer tokens"
        )


@dataclass
class Beam:
    """One finished beam of a beam search, as ranked (``score``)."""

    output_ids: list[int]  # generated tokens; the end token is not included
    log_probs: list[float]
    cum_log_prob: float  # of every token the beam chose, its end token included
    score: float  # cum_log_prob / length ** len_penalty
    finish_reason: str


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens only; the end token is not included
    log_probs: list[float]
    # "length" | "end_id" | "stop_word" | "cancelled" | "error", or an editor stop rule's
    # (contract.options.EDITOR_STOP_REASONS)
    finish_reason: str
    error: str | None = None
    queue_seconds: float = 0.0
    total_seconds: float = 0.0
    beams: list[Beam] | None = None  # beam search: the beams, best first (output_ids: the best)
    reused_prompt_tokens: int = 0  # prompt tokens a prefix cache served without recomputing
    tokens_past_stop: int = 0  # generated after the token a stop rule ended the answer at


class Listener(Protocol):
    # beam search: called once per step with the best running beam's newest token, which
    # another beam may still overtake (the result's beams are final)
    def on_token(self, token_id: int, log_prob: float) -> None: ...
    def on_finish(self, result: GenerationResult) -> None: ...


class NullListener:
    """A listener that ignores everything; subclass it and override what you need."""

    def on_token(self, token_id: int, log_prob: float) -> None:
        pass

    def on_finish(self, result: GenerationResult) -> None:
        pass


class StepObserver(Protocol):
    """Told about every forward pass and every finished request (the engine's metrics)."""

    def on_step(self, rows: int, new_tokens: int, prompt_tokens: int, seconds: float) -> None: ...
    def on_finish(self, result: GenerationResult) -> None: ...


class Handle:
    """What ``submit`` returns: lets the caller cancel (e.g. a client went away)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def generate(
    submit: Callable[[GenerationRequest, Listener], Handle], request: GenerationRequest
) -> GenerationResult:
    """Submit through ``submit`` and wait for the result (every backend's ``generate``)."""
    done = threading.Event()
    box: list[GenerationResult] = []

    class _Wait(NullListener):
        def on_finish(self, result: GenerationResult) -> None:
            box.append(result)
            done.set()

    submit(request, _Wait())
    done.wait()
    return box[0]


class Target(Protocol):
    """Where :meth:`GenerationBackend.route` sends a checked request: a backend, or a fallback
    that counts the request when it is submitted."""

    def submit(
        self, request: GenerationRequest, listener: Listener, checked: bool = False
    ) -> Handle: ...


@runtime_checkable
class GenerationBackend(Protocol):
    """One continuous batch on one copy of the weights, fed from any thread.

    ``submit`` returns at once; the backend's own thread calls the listener's ``on_token`` per
    generated token and ``on_finish`` exactly once, also for a cancelled or failed request.
    """

    def validate(self, request: GenerationRequest) -> None:
        """Raise contract.options.InvalidRequestError, naming the option, for a request this
        backend cannot run (or cannot honour exactly)."""
        ...

    def route(self, request: GenerationRequest) -> Target:
        """Check ``request`` once, as ``validate`` does, and return where it runs (this
        backend, or a fallback's second engine), to ``submit`` it to with ``checked=True``."""
        ...

    def submit(
        self, request: GenerationRequest, listener: Listener, checked: bool = False
    ) -> Handle:
        """Queue a request; the handle cancels it within one step. ``checked``: ``route``
        returned this backend for it, so it is trusted; else it is checked first."""
        ...

    def wait_for_room(self, rows: int) -> None:
        """Block until ``rows`` more rows fit in the running batch (backpressure into
        Triton's queue); return at once when stopping."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and wait for the result."""
        ...

    def start(self) -> GenerationBackend: ...

    def stop(self) -> None:
        """End the worker; requests still queued or running finish as cancelled."""
        ...

    @property
    def running(self) -> int:
        """Rows generating now."""
        ...

    @property
    def cache_bytes(self) -> int:
        """Memory the KV cache holds now."""
        ...

    @property
    def max_cache_tokens(self) -> int:
        """The KV-cache budget in positions (rows x positions)."""
        ...

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (false before start and after stop or a crash)."""
        ...

    @property
    def stopping(self) -> bool: ...
