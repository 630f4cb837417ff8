"""Repository context: other files' text put before the file's prefix, and the rule that keeps
it within a token budget.

Editors send chunks of other files with each completion (llama.vim's ``input_extra`` ring
buffer, Continue's snippets). They go first, in the order sent, then the file's prefix: what
changes least comes first, so the engine's prefix cache keeps hitting while the cursor moves
(every keystroke changes only the prompt's end). A client should send its stable chunks first.

The rule when they do not all fit (docs/api.md, "Repository context"): chunks are kept whole,
from the first, while the prompt as the server tokenizes it (chunks, prefix, and the suffix
with its fill-in-the-middle tokens) stays within the budget minus ``max_tokens``; the rest are
dropped and counted in the answer's ``usage``. Dropping from the end keeps the beginning, and
so the cache. The prefix and suffix themselves are never cut: a prefix longer than the model's
context is refused by the engine, as without context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openai_api.errors import bad_option

FIELD = "input_extra"
# Counts each prompt's tokens as the server does, with the given suffix (fill-in-the-middle)
TokenCounter = Callable[[Sequence[str], str], list[int]]


@dataclass(frozen=True)
class ContextChunk:
    """One chunk of another file: its name (may be empty) and text."""

    filename: str
    text: str

    @property
    def prompt_text(self) -> str:
        """The text as it goes into the prompt: ending with a newline, so that the next chunk
        or the prefix starts on a line of its own."""
        text = self.text
        return text if not text or text.endswith("\n") else text + "\n"


@dataclass(frozen=True)
class FittedContext:
    """The prompt to send (kept chunks, then the prefix) and what was kept."""

    prompt: str
    chunks_sent: int
    chunks_used: int
    prompt_tokens: int | None  # as the server counts the prompt sent; None: not counted

    def usage(self) -> dict[str, int]:
        """The answer's ``usage`` fields for the context (none when no chunk was sent)."""
        if not self.chunks_sent:
            return {}
        return {
            "input_extra_chunks": self.chunks_sent,
            "input_extra_chunks_used": self.chunks_used,
        }


def parse_chunks(body: dict[str, Any]) -> tuple[ContextChunk, ...]:
    """``input_extra``: a list of ``{"filename", "text"}`` objects (llama.cpp's shape)."""
    chunks = body.get(FIELD) or []
    if not isinstance(chunks, list):
        raise bad_option(FIELD, f"{FIELD} must be a list of {{filename, text}} objects")
    parsed = []
    for i, chunk in enumerate(chunks):
        if (
            not isinstance(chunk, dict)
            or set(chunk) - {"filename", "text"}
            or not isinstance(chunk.get("text"), str)
            or not isinstance(chunk.get("filename", ""), str)
        ):
            raise bad_option(
                FIELD,
                f"{FIELD}[{i}] must be an object with a string `text` and an optional string "
                f"`filename` (nothing else), got {chunk!r}",
            )
        parsed.append(ContextChunk(chunk.get("filename", ""), chunk["text"]))
    return tuple(parsed)


def with_chunks(chunks: Sequence[ContextChunk], prefix: str) -> str:
    return "".join(c.prompt_text for c in chunks) + prefix


def fit_context(
    chunks: Sequence[ContextChunk],
    prefix: str,
    suffix: str,
    budget: int,
    count: TokenCounter,
) -> FittedContext:
    """The most leading chunks whose prompt fits ``budget`` tokens (see the module's rule).

    One count when everything fits (the usual case once a client budgets itself); else one
    batched count of the parts, then exact counts of the assembled prompt around the estimate.
    """
    if not chunks:
        return FittedContext(prefix, 0, 0, None)
    everything = with_chunks(chunks, prefix)
    (total,) = count([everything], suffix)
    if total <= budget:
        return FittedContext(everything, len(chunks), len(chunks), total)
    *parts, alone = count([*(c.prompt_text or " " for c in chunks), prefix or " "], "")
    if suffix:
        (alone,) = count([prefix], suffix)
    used, running = 0, alone
    for part in parts:  # each part's count includes a BOS where the model has one: an estimate
        if running + part > budget:
            break
        used, running = used + 1, running + part
    exact = {len(chunks): total}

    def tokens(k: int) -> int:
        if k not in exact:
            (exact[k],) = count([with_chunks(chunks[:k], prefix)], suffix)
        return exact[k]

    while used > 0 and tokens(used) > budget:
        used -= 1
    while used + 1 < len(chunks) and tokens(used + 1) <= budget:
        used += 1
    return FittedContext(with_chunks(chunks[:used], prefix), len(chunks), used, exact.get(used))
