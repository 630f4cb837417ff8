"""What the soak sends: the kinds of client in its mix, the invalid and hostile cases (raw
tensors, so the client's own validation never refuses them first), and how each end is
classified and judged, on the error text alone (tests/test_soak.py uses real Triton texts)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, MAX_TOKENS_PER_WORD, MAX_WORDS_PER_LIST
from contract.tensors import INPUT_SPECS

Tensors = dict[str, np.ndarray]

OK, REJECTED, ABANDONED, UNANSWERED = "ok", "rejected", "abandoned", "unanswered"
CANCELLED, QUEUE_FULL, TIMEOUT = "cancelled", "queue_full", "timeout"
UNAVAILABLE, VALIDATION, UNCLEAR = "unavailable", "validation", "unclear"
CATEGORIES = (VALIDATION, QUEUE_FULL, TIMEOUT, CANCELLED, UNAVAILABLE, UNCLEAR)

# Names a validation message may name, longest first ("runtime_top_p" before "top_p").
OPTION_NAMES = tuple(
    sorted(
        {*INPUT_SPECS, "request_output_len", "input_lengths", "max_tokens", "prompt"},
        key=len,
        reverse=True,
    )
)

# Tried in this order, most specific first: a dead stub is never taken for a bad option.
_PATTERNS = {
    category: re.compile(pattern, re.IGNORECASE)
    for category, pattern in (
        (
            UNAVAILABLE,
            r"stub process|not healthy|unavailable|connection refused|failed to connect|"
            r"socket closed|connection reset|broken pipe|is not ready|unknown model|"
            r"no available version|server is (shutting down|stopping)|remotedisconnected|"
            r"connection ?closed|connection aborted|eof occurred|stub.*(died|exited|unhealthy)",
        ),
        (CANCELLED, r"cancel"),
        (QUEUE_FULL, r"exceeds maximum queue size|queue (is )?full"),
        (TIMEOUT, r"timeout expired|deadline exceeded|timed out|time ?out"),
        (
            VALIDATION,
            r"must be|over the limit|not valid utf-8|exceeds the model's context|"
            r"is not supported|empty prompt|prompt is empty|is required|invalid token|"
            r"outside the vocabulary|not one csv row|unexpected (shape|datatype)|"
            r"expected .* (shape|datatype)",
        ),
    )
}


def classify_error(message: str) -> str:
    """The category of a rejection's error text (one of :data:`CATEGORIES`)."""
    found = next((k for k, pattern in _PATTERNS.items() if pattern.search(message)), None)
    return found or (VALIDATION if named_option(message) else UNCLEAR)


def named_option(message: str) -> str | None:
    """The first option or input name the message mentions."""
    return next(
        (
            name
            for name in OPTION_NAMES
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message)
        ),
        None,
    )


UNARY_GRPC, UNARY_HTTP, STREAM = "unary_grpc", "unary_http", "stream"
VANISH_STREAM, VANISH_UNARY = "vanish_stream", "vanish_unary"
INVALID, HOSTILE = "invalid", "hostile"
KINDS = (UNARY_GRPC, UNARY_HTTP, STREAM, VANISH_STREAM, VANISH_UNARY, INVALID, HOSTILE)
VALID_KINDS = (UNARY_GRPC, UNARY_HTTP, STREAM)
VANISH_KINDS = (VANISH_STREAM, VANISH_UNARY)
EDITOR = "editor"  # not in the mix: the editor phase's typists (loadtest.soak.users)
ALL_KINDS = (*KINDS, EDITOR)
DEFAULT_MIX = dict(zip(KINDS, (25, 20, 15, 10, 10, 12, 8), strict=True))


def parse_mix(text: str) -> dict[str, int]:
    """``kind=weight,...`` (kinds left out get weight 0); ValueError names the bad part."""
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


def schedule(mix: dict[str, int]) -> Iterator[str]:
    """The kinds in smooth weighted round robin: any stretch of requests has the mix's
    proportions and every kind with a weight comes up within one cycle, even in a short run."""
    weights = {k: w for k, w in mix.items() if w > 0}
    total, current, cycle = sum(weights.values()), dict.fromkeys(weights, 0), []
    for _ in range(total):  # the round robin is back where it began after `total` picks
        for kind, weight in weights.items():
            current[kind] += weight
        cycle.append(max(current, key=current.__getitem__))
        current[cycle[-1]] -= total
    return itertools.cycle(cycle)


class Case(NamedTuple):
    """A valid request's tensors with ``tensor`` set to ``value``. ``expect`` empty: legal, it
    must be answered (or refused naming one of ``may_refuse``: the OpenVINO backend refuses a
    bad-words list rather than ignore it); otherwise rejected naming one of ``expect``."""

    name: str
    tensor: str
    value: object
    expect: tuple[str, ...]
    may_refuse: tuple[str, ...] = ()


OVER_CONTEXT = "a prompt of about twice the model's context in tokens, far below the byte cap"
_LINE, _FILLER = b"value = compute(value, index) + offset\n", b"x = 1  # filler\n"
_nan, _inf = float("nan"), float("inf")


INVALID_CASES = tuple(
    Case(*row)
    for row in (
        ("top_p_1.5", "runtime_top_p", 1.5, ("runtime_top_p",)),
        ("empty_prompt", "INPUT_0", b"", ("INPUT_0",)),
        ("prompt_over_context", "INPUT_0", OVER_CONTEXT, ("context",)),
        ("invalid_utf8", "INPUT_0", b"def f(\xff\xfe):\n", ("INPUT_0",)),
        (
            "too_many_stop_words",
            "INPUT_3",
            ",".join(f"w{i}" for i in range(MAX_WORDS_PER_LIST + 1)).encode(),
            ("INPUT_3",),
        ),
        (
            "stop_word_too_long",
            "INPUT_3",  # one word of twice the tokens a word may have
            " ".join(f"tok{i}" for i in range(MAX_TOKENS_PER_WORD * 2)).encode(),
            ("INPUT_3",),
        ),
        ("max_tokens_0", "INPUT_1", 0, ("request_output_len", "INPUT_1")),
        ("temperature_-1", "temperature", -1.0, ("temperature",)),
        ("repetition_penalty_0", "repetition_penalty", 0.0, ("repetition_penalty",)),
        ("beam_width_64", "beam_width", 64, ("beam_width",)),
    )
)
HOSTILE_CASES = tuple(
    Case(*row)
    for row in (
        (
            "prompt_at_byte_cap",
            "INPUT_0",
            (_FILLER * (MAX_PROMPT_BYTES // len(_FILLER) + 1))[:MAX_PROMPT_BYTES],
            ("context",),
        ),
        ("prompt_over_byte_cap", "INPUT_0", b"y" * (MAX_PROMPT_BYTES + 1), ("INPUT_0",)),
        ("huge_max_tokens", "INPUT_1", 2**32 - 1, ("request_output_len", "INPUT_1", "context")),
        (
            "many_bad_words",
            "INPUT_2",
            ",".join(f"zq{i}" for i in range(MAX_WORDS_PER_LIST)).encode(),
            (),
            ("bad_words",),
        ),
        ("tiny_temperature", "temperature", 1e-30, ("temperature",)),  # overflows the logits
        ("temperature_nan", "temperature", _nan, ("temperature",)),
        ("temperature_inf", "temperature", _inf, ("temperature",)),
        ("top_p_nan", "runtime_top_p", _nan, ("runtime_top_p",)),
        ("repetition_penalty_inf", "repetition_penalty", _inf, ("repetition_penalty",)),
    )
)
CASES = {case.name: case for case in (*INVALID_CASES, *HOSTILE_CASES)}
TRANSPORTS = {INVALID: ("grpc", "http", "stream"), HOSTILE: ("grpc", "http")}


def raw_tensors(case: Case, base: CompletionRequest, context: int) -> Tensors:
    """``base``'s (valid) tensors with the case's change; nothing is validated."""
    tensors = base.tensors()
    value = _LINE * (context // 2 + 8) if case.value is OVER_CONTEXT else case.value
    return {**tensors, case.tensor: np.array([[value]], dtype=tensors[case.tensor].dtype)}


def rotation(kind: str) -> Iterator[tuple[str, str]]:
    """(case, transport) a raw kind sends next: every case over every transport in turn."""
    cases = INVALID_CASES if kind == INVALID else HOSTILE_CASES
    return ((case.name, wire) for wire in itertools.cycle(TRANSPORTS[kind]) for case in cases)


def judge(kind: str, case: str, status: str, category: str, message: str) -> bool:
    """Whether a request ended as it must: valid ones answered or turned away for overload;
    vanishing clients and editors answered or gone; a case rejected by a validation error
    naming the option, or answered when legal. Nothing may go unanswered."""
    if status == UNANSWERED:
        return False
    if kind == EDITOR:
        return status in (OK, ABANDONED)
    if case:
        spec, text = CASES[case], message.lower()
        named = status == REJECTED and category == VALIDATION
        if spec.expect:
            return named and any(k.lower() in text for k in spec.expect)
        return status == OK or (named and any(k.lower() in text for k in spec.may_refuse))
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
