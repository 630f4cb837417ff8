"""What the soak sends: the kinds of client in its mix, the invalid and hostile cases, and how
each answer (or error text) is classified.

Invalid and hostile requests are built as raw tensors (a valid :class:`CompletionRequest`'s
tensors with one entry replaced), so they bypass the client's own validation and reach the
server exactly as a careless or malicious client would send them. The classification works on
the error text alone, so it is tested on real Triton strings without a server
(``tests/test_soak.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, MAX_TOKENS_PER_WORD, MAX_WORDS_PER_LIST
from contract.tensors import INPUT_SPECS

Tensors = dict[str, np.ndarray]

# --- outcomes ------------------------------------------------------------------------------

OK, REJECTED, ABANDONED, UNANSWERED = "ok", "rejected", "abandoned", "unanswered"
# Error categories; classify_error tries them in _PATTERNS' order, most specific first.
CANCELLED, QUEUE_FULL, TIMEOUT = "cancelled", "queue_full", "timeout"
UNAVAILABLE, VALIDATION, UNCLEAR = "unavailable", "validation", "unclear"
CATEGORIES = (VALIDATION, QUEUE_FULL, TIMEOUT, CANCELLED, UNAVAILABLE, UNCLEAR)

# Option and input names a validation message may name (longest first: "runtime_top_p" before
# "top_p"); the model-stage names appear in the engine's own messages.
OPTION_NAMES = tuple(sorted({*INPUT_SPECS, "request_output_len", "input_lengths", "max_tokens",
                             "prompt"}, key=len, reverse=True))  # fmt: skip

_PATTERNS = {category: re.compile(pattern, re.IGNORECASE) for category, pattern in (
    # A python-backend stub that died, a model or server that is gone: the drill's answers.
    (UNAVAILABLE, r"stub process|not healthy|unavailable|connection refused|failed to connect|"
     r"socket closed|connection reset|broken pipe|is not ready|unknown model|"
     r"no available version|server is (shutting down|stopping)|remotedisconnected|"
     r"connection ?closed|connection aborted|eof occurred|stub.*(died|exited|unhealthy)"),
    (CANCELLED, r"cancel"),
    (QUEUE_FULL, r"exceeds maximum queue size|queue (is )?full"),
    (TIMEOUT, r"timeout expired|deadline exceeded|timed out|time ?out"),
    (VALIDATION, r"must be|over the limit|not valid utf-8|exceeds the model's context|"
     r"is not supported|empty prompt|prompt is empty|is required|invalid token|"
     r"outside the vocabulary|not one csv row|unexpected (shape|datatype)|"
     r"expected .* (shape|datatype)"),
)}  # fmt: skip


def classify_error(message: str) -> str:
    """The category of a rejection's error text (one of :data:`CATEGORIES`).

    Validation wins only when nothing says the server or the request's lifetime was the cause,
    so that "Stub process 'gptj_0_0' is not healthy" is never mistaken for a bad option.
    """
    for category, pattern in _PATTERNS.items():
        if pattern.search(message):
            return category
    return VALIDATION if named_option(message) else UNCLEAR


def named_option(message: str) -> str | None:
    """The first option or input name the message mentions (None when it names none)."""
    return next((name for name in OPTION_NAMES
                 if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message)),
                None)  # fmt: skip


def names_any(message: str, keywords: tuple[str, ...]) -> bool:
    """Whether a rejection names one of what the case expects (case-insensitive)."""
    return any(k.lower() in message.lower() for k in keywords)


# --- the mix -------------------------------------------------------------------------------

UNARY_GRPC, UNARY_HTTP, STREAM = "unary_grpc", "unary_http", "stream"
VANISH_STREAM, VANISH_UNARY = "vanish_stream", "vanish_unary"
INVALID, HOSTILE = "invalid", "hostile"
KINDS = (UNARY_GRPC, UNARY_HTTP, STREAM, VANISH_STREAM, VANISH_UNARY, INVALID, HOSTILE)
VALID_KINDS = (UNARY_GRPC, UNARY_HTTP, STREAM)
VANISH_KINDS = (VANISH_STREAM, VANISH_UNARY)
# Not in the mix: the editor phase's typists (loadtest.soak.users), which stream through the
# OpenAI API and abandon each request at their next keystroke.
EDITOR = "editor"
ALL_KINDS = (*KINDS, EDITOR)
DEFAULT_MIX = dict(zip(KINDS, (25, 20, 15, 10, 10, 12, 8), strict=True))


def parse_mix(text: str) -> dict[str, int]:
    """``kind=weight,...`` (kinds left out get weight 0); raises ValueError naming the bad
    part."""
    mix = dict.fromkeys(KINDS, 0)
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, _, weight = part.partition("=")
        if kind not in mix:
            raise ValueError(f"unknown kind {kind!r} in --mix; kinds: {', '.join(KINDS)}")
        if not weight.strip().isdigit():
            raise ValueError(f"--mix weight for {kind} must be an integer >= 0, got {weight!r}")
        mix[kind] = int(weight)
    if not any(mix.values()):
        raise ValueError("--mix gives every kind weight 0: nothing to send")
    return mix


class Schedule:
    """The order kinds are sent in: smooth weighted round robin, so any stretch of requests
    has the mix's proportions and every kind with a weight comes up within one cycle, even in
    a run of a few seconds. Not thread-safe: Locust's greenlets call it, which never preempt
    one another inside it."""

    def __init__(self, mix: dict[str, int]) -> None:
        self.weights = {k: w for k, w in mix.items() if w > 0}
        self.total = sum(self.weights.values())
        self.current = dict.fromkeys(self.weights, 0)

    def next(self) -> str:
        for kind, weight in self.weights.items():
            self.current[kind] += weight
        chosen = max(self.current, key=lambda k: self.current[k])
        self.current[chosen] -= self.total
        return chosen


# --- invalid and hostile cases -------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One raw request: how it changes a valid request's tensors, and what must come back.

    ``expect`` empty: it is legal and must be answered; otherwise it must be rejected with a
    message that names one of these (the option at fault)."""

    name: str
    build: Callable[[Tensors, int], Tensors]  # (valid tensors, model context) -> raw tensors
    expect: tuple[str, ...]
    description: str
    # a legal case an engine backend may refuse instead, with a message naming one of these
    # (the OpenVINO backend has no bad-words list: it refuses them rather than ignore them)
    may_refuse: tuple[str, ...] = ()

    @property
    def must_reject(self) -> bool:
        return bool(self.expect)


def _set(name: str, value: object, dtype: type) -> Callable[[Tensors, int], Tensors]:
    def build(tensors: Tensors, context: int) -> Tensors:
        return {**tensors, name: np.array([[value]], dtype=dtype)}

    return build


def _prompt(data: bytes) -> Callable[[Tensors, int], Tensors]:
    return _set("INPUT_0", data, np.object_)


def _words(name: str, words: list[str]) -> Callable[[Tensors, int], Tensors]:
    return _set(name, ",".join(words).encode(), np.object_)


def _over_context(tensors: Tensors, context: int) -> Tensors:
    """A prompt of about twice the context in tokens, far below the byte cap."""
    line = "value = compute(value, index) + offset\n"
    return {**tensors, "INPUT_0": np.array([[(line * (context // 2 + 8)).encode()]], np.object_)}


def _at_byte_cap(tensors: Tensors, context: int) -> Tensors:
    """A prompt of exactly the byte cap: legal bytes, far over any context."""
    line = b"x = 1  # filler\n"
    data = (line * (MAX_PROMPT_BYTES // len(line) + 1))[:MAX_PROMPT_BYTES]
    return {**tensors, "INPUT_0": np.array([[data]], np.object_)}


def _over_byte_cap(tensors: Tensors, context: int) -> Tensors:
    return {**tensors, "INPUT_0": np.array([[b"y" * (MAX_PROMPT_BYTES + 1)]], np.object_)}


_F32, _U32 = np.float32, np.uint32
_TOO_MANY = [f"w{i}" for i in range(MAX_WORDS_PER_LIST + 1)]
_LONG_WORD = " ".join(f"tok{i}" for i in range(MAX_TOKENS_PER_WORD * 2))  # > 32 tokens
_LEGAL_BAD = [f"zq{i}" for i in range(MAX_WORDS_PER_LIST)]

INVALID_CASES: tuple[Case, ...] = (
    Case("top_p_1.5", _set("runtime_top_p", 1.5, _F32), ("runtime_top_p",), "runtime_top_p 1.5"),
    Case("empty_prompt", _prompt(b""), ("INPUT_0",), "INPUT_0 empty"),
    Case("prompt_over_context", _over_context, ("context",), "prompt of ~2x the context"),
    Case("invalid_utf8", _prompt(b"def f(\xff\xfe):\n"), ("INPUT_0",), "INPUT_0 not UTF-8"),
    Case("too_many_stop_words", _words("INPUT_3", _TOO_MANY), ("INPUT_3",),
         f"{len(_TOO_MANY)} stop words (limit {MAX_WORDS_PER_LIST})"),
    Case("stop_word_too_long", _words("INPUT_3", [_LONG_WORD]), ("INPUT_3",),
         f"a stop word over {MAX_TOKENS_PER_WORD} tokens"),
    Case("max_tokens_0", _set("INPUT_1", 0, _U32), ("request_output_len", "INPUT_1"), "INPUT_1 0"),
    Case("temperature_-1", _set("temperature", -1.0, _F32), ("temperature",), "temperature -1"),
    Case("repetition_penalty_0", _set("repetition_penalty", 0.0, _F32), ("repetition_penalty",),
         "repetition_penalty 0"),
    Case("beam_width_64", _set("beam_width", 64, _U32), ("beam_width",), "beam_width 64"),
)  # fmt: skip

HOSTILE_CASES: tuple[Case, ...] = (
    Case("prompt_at_byte_cap", _at_byte_cap, ("context",), f"{MAX_PROMPT_BYTES:,}-byte prompt"),
    Case("prompt_over_byte_cap", _over_byte_cap, ("INPUT_0",), "byte cap + 1 prompt"),
    Case("huge_max_tokens", _set("INPUT_1", 2**32 - 1, _U32),
         ("request_output_len", "INPUT_1", "context"), "INPUT_1 2**32-1"),
    Case("many_bad_words", _words("INPUT_2", _LEGAL_BAD), (),
         f"{MAX_WORDS_PER_LIST} bad words (the limit: legal)", may_refuse=("bad_words",)),
    Case("tiny_temperature", _set("temperature", 1e-30, _F32), ("temperature",),
         "temperature 1e-30 (overflows the logits: refused)"),
    Case("temperature_nan", _set("temperature", np.nan, _F32), ("temperature",), "raw NaN"),
    Case("temperature_inf", _set("temperature", np.inf, _F32), ("temperature",), "raw +inf"),
    Case("top_p_nan", _set("runtime_top_p", np.nan, _F32), ("runtime_top_p",), "raw NaN"),
    Case("repetition_penalty_inf", _set("repetition_penalty", np.inf, _F32),
         ("repetition_penalty",), "raw +inf"),
)  # fmt: skip

CASES = {case.name: case for case in (*INVALID_CASES, *HOSTILE_CASES)}

# Transports the raw cases rotate through: each case goes over each of them in turn.
INVALID_TRANSPORTS = ("grpc", "http", "stream")
HOSTILE_TRANSPORTS = ("grpc", "http")


def raw_tensors(case: Case, base: CompletionRequest, context: int) -> Tensors:
    """The case's tensors: ``base``'s (valid) with the case's change; nothing is validated."""
    return case.build(base.tensors(), context)


class Rotation:
    """Which case, over which transport, a raw kind sends next: every case over every
    transport in turn."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()

    def next(self, kind: str) -> tuple[str, str]:
        cases = INVALID_CASES if kind == INVALID else HOSTILE_CASES
        transports = INVALID_TRANSPORTS if kind == INVALID else HOSTILE_TRANSPORTS
        n, self.count[kind] = self.count[kind], self.count[kind] + 1
        return cases[n % len(cases)].name, transports[(n // len(cases)) % len(transports)]


def judge(kind: str, case: str, status: str, category: str, message: str) -> bool:
    """Whether a request ended as it must.

    Valid requests must be answered, or turned away for overload (queue full, queue timeout).
    Vanishing clients may finish or leave. An invalid case, and a hostile case that expects a
    rejection, must be rejected by a validation error naming the option; a legal hostile case
    must be answered. An editor's request is answered or abandoned at the next keystroke.
    Nothing may go unanswered.
    """
    if status == UNANSWERED:
        return False
    if kind == EDITOR:
        return status in (OK, ABANDONED)
    if case:
        spec = CASES[case]
        if spec.must_reject:
            return status == REJECTED and category == VALIDATION and names_any(message, spec.expect)
        refused_by_name = status == REJECTED and category == VALIDATION and spec.may_refuse
        return status == OK or bool(refused_by_name and names_any(message, spec.may_refuse))
    if kind in VANISH_KINDS:
        return status in (OK, ABANDONED) or category in (CANCELLED, TIMEOUT)
    return status == OK or category in (QUEUE_FULL, TIMEOUT)


def must_get(case: Case) -> str:
    """What a case must get back, in words."""
    if case.expect:
        return f"rejected naming {'|'.join(case.expect)}"
    if case.may_refuse:
        return f"answered, or refused naming {'|'.join(case.may_refuse)}"
    return "answered"
