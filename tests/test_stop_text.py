"""Stop words matched on a stream's text (postprocessing/stop_text.py) and cut from its last
piece by a client that wants the text before them (contract.words.without_stop_word)."""

from __future__ import annotations

import itertools

import pytest

from contract.words import without_stop_word
from postprocessing.stop_text import StopText


def run(words: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    """The pieces a stream sends, and whether a stop word ended it."""
    matcher, sent = StopText(words), []
    for piece in pieces:
        text, stopped = matcher.push(piece)
        sent.append(text)
        if stopped:
            return sent, True
    sent.append(matcher.flush())
    return sent, False


def splits(text: str):
    """Every way to cut ``text`` into pieces (some of them empty, as a token of a split
    character gives)."""
    for cuts in itertools.product([False, True], repeat=len(text) - 1):
        pieces, start = [], 0
        for i, cut in enumerate(cuts, 1):
            if cut:
                pieces.append(text[start:i])
                start = i
        yield [*pieces, text[start:], ""]


@pytest.mark.parametrize(
    ("words", "text", "expected"),
    [
        (["\n\n"], "a = 1\n\n\nb", "a = 1\n\n"),  # inside one "\n\n\n" token
        (["abcd", "bc"], "xabcdy", "xabc"),  # the first to complete ends it
        (["ab", "b"], "xaby", "xab"),  # two end together: the text ends with both
        (["bba"], "xbbbcbba", "xbbbcbba"),  # held-back starts that did not begin it are sent
        (["zz"], "abc", None),  # none: all of the text, at the end
    ],
)
def test_the_first_stop_word_to_complete_ends_the_text_wherever_the_pieces_split(
    words, text, expected
):
    for pieces in splits(text):
        sent, stopped = run(words, pieces)
        assert stopped == (expected is not None), pieces
        assert "".join(sent) == (text if expected is None else expected), pieces
        if stopped:  # no piece before the last holds any of the stop word
            assert without_stop_word(expected, words).startswith("".join(sent[:-1])), pieces


def test_without_stop_word_cuts_the_longest_it_ends_with_and_nothing_else():
    assert without_stop_word("x = 1\n\n", ["\n", "\n\n"]) == "x = 1"
    assert without_stop_word("x = 1", ["\n"]) == "x = 1"
    assert without_stop_word("xab", ["ab", "b"]) == "x"
    assert without_stop_word("", ["a"]) == ""
