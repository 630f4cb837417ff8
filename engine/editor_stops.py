"""The editor stop rules (contract.options.EditorStops), decided on each generated token.

Both backends call :meth:`LineStops.verdict` where they take a token, before telling the
listener, so an answer ends at its stop inside the step loop and its row is freed at once:
nothing is generated past it, and nothing is trimmed afterwards. The rules read the text of
each token (``texts``, one string per token id, made from the checkpoint's tokenizer by the
engine model), character by character:

- a newline ends a ``single_line`` answer; its token is the last one;
- after the answer's first newline, a line whose first character that is not a space or tab
  comes at a column under ``n_indent`` ends the answer before the token that carries that
  character (a blank line counts, as in llama.cpp's server);
- once ``t_max_predict_ms`` have passed since the first token and the answer holds a
  newline, it ends at the token in hand (llama.cpp's rule: the first line is always whole).

With token healing the first token starts with the user's held-back text (a newline, say):
that text is the prompt's, not the answer's, and the rules read the first token without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from contract.options import EditorStops

BLANKS = " \t"


def now() -> float:
    """The rules' clock (a test replaces it, to make time pass by construction)."""
    return time.monotonic()


class LineStops:
    """One request's rules and what it has written so far."""

    def __init__(
        self,
        rules: EditorStops,
        texts: Sequence[str],
        held_back: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``held_back``: the prompt's token that healing held back (its text is skipped at the
        start of the first generated token)."""
        self.rules, self.texts, self.clock = rules, texts, clock or now
        self._skip = len(texts[held_back]) if held_back is not None else 0
        self._first: float | None = None
        self._newlines = 0
        self._indent = 0
        self._line_start = False  # no text yet on the line after the last newline

    def verdict(self, token: int) -> tuple[bool, str | None]:
        """Whether ``token`` belongs to the answer, and the rule that ends the answer at it
        (None: it goes on)."""
        now = self.clock()
        if self._first is None:
            self._first = now
        text = self.texts[token] if 0 <= token < len(self.texts) else ""
        text, self._skip = text[self._skip :], 0  # the held-back text is the user's
        n_indent = self.rules.n_indent
        for char in text:
            under = self._newlines and self._line_start and self._indent < n_indent
            if char == "\n":
                if under:  # a blank line under the indentation
                    return False, "n_indent"
                self._newlines += 1
                self._line_start, self._indent = True, 0
                if self.rules.single_line:
                    return True, "single_line"
            elif self._line_start and char in BLANKS:
                self._indent += 1
            else:
                if under:
                    return False, "n_indent"
                self._line_start = False
        budget = self.rules.t_max_predict_ms
        if budget and self._newlines and (now - self._first) * 1000.0 >= budget:
            return True, "time_budget"
        return True, None
