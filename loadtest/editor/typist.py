"""Simulated typists: where in a real file a typist pauses, after how much typing, for how long.

A typist opens a held-out source file at a random line and writes the stretch of code that
follows it, as if that stretch were new: bursts of keystrokes (one character each; a newline
takes the next line's indentation with it, as an editor's auto-indent does) at human intervals,
each burst followed by a pause. An editor sends a completion when the typing pauses and
abandons it at the next keystroke, so each :class:`Pause` is one request: sent at the pause's
start with the text before the cursor (the prefix) and the file's text after the stretch (the
suffix: what an editor has below the code being written, the same all visit long), and
abandoned ``pause_s`` later unless answered by then.

Everything here comes from a seeded ``random.Random``: the same seed gives the same schedule,
which the tests check without a server. What is sent of the text (clipped to the model's
context) is :mod:`loadtest.editor.window`'s concern.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TypingStyle:
    """How fast and in what rhythm a typist types (seconds, keystrokes)."""

    keystroke_s: tuple[float, float] = (0.06, 0.25)  # between keystrokes, uniform
    burst: tuple[int, int] = (2, 12)  # keystrokes between pauses, uniform
    pause_s: tuple[float, float] = (0.4, 2.5)  # a pause (a request's whole chance), uniform
    pauses_per_file: int = 40  # then the typist opens another file

    def __post_init__(self) -> None:
        for name in ("keystroke_s", "burst", "pause_s"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(
                    f"{name} must be (low, high) with 0 < low <= high, got {low, high}"
                )
        if self.pauses_per_file < 1:
            raise ValueError(f"pauses_per_file must be >= 1, got {self.pauses_per_file}")

    @property
    def longest_step_s(self) -> float:
        """The longest a typist can take between two requests it sends (typing + pause)."""
        return self.burst[1] * self.keystroke_s[1] + self.pause_s[1]


@dataclass(frozen=True)
class Pause:
    """One pause in typing: the request an editor sends and abandons at the next keystroke."""

    cursor: int  # characters of the file before the cursor
    suffix_at: int  # where the text after the cursor starts: the end of the stretch typed
    typing_s: float  # the keystrokes before this pause took this long
    keystrokes: int
    pause_s: float  # the next keystroke comes this long after the request is sent


def keystroke(text: str, cursor: int) -> int:
    """The cursor after one keystroke: one character, or a newline and the indentation of the
    line it opens (auto-indent)."""
    if text[cursor] != "\n":
        return cursor + 1
    cursor += 1
    while cursor < len(text) and text[cursor] in " \t":
        cursor += 1
    return cursor


def line_starts(text: str) -> list[int]:
    """Offsets where a line after the first starts (never 0: a prefix is never empty), and
    that are not the file's end."""
    return [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]


def pauses(text: str, rng: random.Random, style: TypingStyle) -> Iterator[Pause]:
    """The pauses of one visit to ``text``: from a random line start in the file's second half
    (so that the text before the cursor is long, as in a file being worked on), bursts and
    pauses until the file ends or ``style.pauses_per_file`` pauses; every pause's suffix starts
    where the last one's cursor is (the stretch typed is new code, not yet in the file)."""
    visit = list(_typed(text, rng, style))
    end = visit[-1][0] if visit else 0
    for cursor, typing_s, keystrokes, pause_s in visit:
        yield Pause(cursor, end, typing_s, keystrokes, pause_s)


def _typed(
    text: str, rng: random.Random, style: TypingStyle
) -> Iterator[tuple[int, float, int, float]]:
    """(cursor, typing seconds, keystrokes, pause seconds) of each pause of one visit."""
    starts = line_starts(text)
    if not starts:
        return
    cursor = rng.choice(starts[len(starts) // 2 :])
    for _ in range(style.pauses_per_file):
        typing_s, keystrokes = 0.0, 0
        for _ in range(rng.randint(*style.burst)):
            if cursor >= len(text):
                break
            cursor = keystroke(text, cursor)
            typing_s += rng.uniform(*style.keystroke_s)
            keystrokes += 1
        if keystrokes == 0:
            return  # the end of the file: nothing typed, no new request
        yield cursor, typing_s, keystrokes, rng.uniform(*style.pause_s)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class Visit:
    """One pause of one typist, with the file it is in."""

    path: Path
    text: str
    pause: Pause


MIN_FILE_BYTES = 4096  # a file shorter than this cannot give a long prefix


class Typist:
    """One typist's endless walk through ``files``: a seeded order (each typist its own),
    a random line in each, the pauses of :func:`pauses` there. Files of at least
    ``min_bytes`` are typed when there are any (long prefixes are what editors send)."""

    def __init__(
        self,
        index: int,
        files: Sequence[Path],
        seed: int,
        style: TypingStyle | None = None,
        min_bytes: int = MIN_FILE_BYTES,
    ) -> None:
        if not files:
            raise ValueError("a typist needs at least one source file")
        self.index = index
        self.style = style or TypingStyle()
        self.rng = random.Random(seed * 1_000_003 + index)
        self.files = [p for p in files if _size(p) >= min_bytes] or list(files)
        self.rng.shuffle(self.files)

    def visits(self) -> Iterator[Visit]:
        """Pauses forever, file after file; raises when no file gives a single pause."""
        while True:
            typed = False
            for path in self.files:
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                for pause in pauses(text, self.rng, self.style):
                    typed = True
                    yield Visit(path, text, pause)
            if not typed:
                raise RuntimeError(f"none of the {len(self.files)} source files can be typed")
