"""Why a generation ended: the engine's finish reasons, defined once.

The engine reports one per row (per beam in a beam search) in its result, the model stages
pass it on in their ``finish_reason`` output, and the OpenAI-compatible API maps it onto
OpenAI's ``finish_reason`` (:func:`openai_reason`), so an editor's stop (single line,
``n_indent``, time budget) is reported as what it was, never guessed from token counts.
"""

from __future__ import annotations

END_ID = "end_id"  # the end token (it is not part of the text)
STOP_WORD = "stop_word"  # one of the request's stop words (it stays in the text)
SINGLE_LINE = "single_line"  # the editor's single-line rule
N_INDENT = "n_indent"  # the editor's indentation rule
TIME_BUDGET = "time_budget"  # the editor's time budget (t_max_predict_ms)
LENGTH = "length"  # max tokens (request_output_len) generated, or the context is full
CANCELLED = "cancelled"  # its client went away, or a stop request named it

EDITOR_STOPS = (SINGLE_LINE, N_INDENT, TIME_BUDGET)
STOPS = (END_ID, STOP_WORD, *EDITOR_STOPS)  # the reasons OpenAI calls "stop"
FINISH_REASONS = (*STOPS, LENGTH, CANCELLED)


def openai_reason(reason: str) -> str:
    """OpenAI's ``finish_reason`` for an engine's: "stop", "length" or "cancelled"."""
    if reason in STOPS:
        return "stop"
    if reason in (LENGTH, CANCELLED):
        return reason
    raise ValueError(f"unknown finish reason {reason!r}; the engine's are {FINISH_REASONS}")
