"""Stop words matched on a stream's text, where the engine's match on tokens cannot see them.

The engine stops a row when its newest tokens are a stop word's tokens, but the model may write
the same text in other tokens: a stop word ``"\\n\\n"`` inside one ``"\\n\\n\\n"`` token, or a
stop word that ends inside a token. A stream's text is matched here too, in the process that
decodes it, so every entry point ends at the first stop word in the text and its client never
has to look for it again.

Text that could begin a stop word is held back until it is known not to, so no piece sent
before the end holds any part of the stop word that ends the stream; the last piece ends with
the whole stop word (it stays in the text, as the unary model stage keeps it).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Finds the first stop word in a stream's text, piece by piece."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = tuple(word for word in words if word)
        self.held = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """(the text to send now, whether it ends with the first stop word: then the stream
        ends with it and nothing after it is sent)."""
        if not self.words:
            return piece, False
        text = self.held + piece
        starts = [(text.find(word), word) for word in self.words]
        ends = [(start + len(word), start) for start, word in starts if start >= 0]
        if ends:
            # the stop word completed first; of those ending together, the one starting first
            end, _ = min(ends)
            self.held = ""
            return text[:end], True
        hold = max((self._begun(text, word) for word in self.words), default=0)
        self.held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    @staticmethod
    def _begun(text: str, word: str) -> int:
        """The length of the longest end of ``text`` that ``word`` begins with."""
        for size in range(min(len(word) - 1, len(text)), 0, -1):
            if text.endswith(word[:size]):
                return size
        return 0

    def flush(self) -> str:
        """What is held back, at the stream's end (no stop word came)."""
        held, self.held = self.held, ""
        return held
