"""Simulated typists: a typist opens a held-out source file at a line in its second half and
writes the stretch that follows as if it were new, in bursts of keystrokes (a newline takes the
next line's indentation, as auto-indent does), each followed by a pause: one request, abandoned
at the next keystroke. Seeded: the same seed gives the same schedule."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_FILE_BYTES = 4096  # a file shorter than this cannot give a long prefix
NEWLINE = re.compile(r"\n[ \t]*")  # a newline keystroke: the next line's indentation comes too


@dataclass(frozen=True)
class TypingStyle:
    """Seconds and keystrokes, each drawn uniformly between (low, high)."""

    keystroke_s: tuple[float, float] = (0.06, 0.25)  # between keystrokes
    burst: tuple[int, int] = (2, 12)  # keystrokes between pauses
    pause_s: tuple[float, float] = (0.4, 2.5)  # a pause: a request's whole chance
    pauses_per_file: int = 40  # then the typist opens another file

    @property
    def longest_step_s(self) -> float:
        """The longest a typist takes between two requests (typing + pause)."""
        return self.burst[1] * self.keystroke_s[1] + self.pause_s[1]


@dataclass(frozen=True)
class Pause:
    """One pause in typing: the request an editor sends and abandons at the next keystroke."""

    cursor: int  # characters of the file before the cursor
    suffix_at: int  # where the text after the cursor starts: the end of the stretch typed
    typing_s: float  # the keystrokes before this pause took this long
    keystrokes: int
    pause_s: float  # the next keystroke comes this long after the request is sent


@dataclass(frozen=True)
class Visit:
    path: Path
    text: str
    pause: Pause


def keystroke(text: str, cursor: int) -> int:
    """The cursor after one keystroke: one character, or a newline and its indentation."""
    return newline.end() if (newline := NEWLINE.match(text, cursor)) else cursor + 1


def line_starts(text: str) -> list[int]:
    """Where a line after the first starts (never 0: a prefix is never empty), not at the end."""
    return [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def pauses(text: str, rng: random.Random, style: TypingStyle) -> list[Pause]:
    """One visit, from a random line start in the second half (a long prefix); every suffix
    starts at the last pause's cursor (the stretch typed is new code)."""
    starts, typed = line_starts(text), []
    cursor = rng.choice(starts[len(starts) // 2 :]) if starts else len(text)
    for _ in range(style.pauses_per_file if starts else 0):
        typing_s, keystrokes = 0.0, 0
        for _ in range(rng.randint(*style.burst)):
            if cursor >= len(text):
                break
            cursor = keystroke(text, cursor)
            typing_s += rng.uniform(*style.keystroke_s)
            keystrokes += 1
        if keystrokes == 0:
            break  # the end of the file: nothing typed, no new request
        typed.append((cursor, typing_s, keystrokes, rng.uniform(*style.pause_s)))
    return [Pause(c, typed[-1][0], t, k, p) for c, t, k, p in typed]


class Typist:
    """A seeded walk through ``files`` (:data:`MIN_FILE_BYTES` or more when any)."""

    def __init__(
        self, index: int, files: Sequence[Path], seed: int, style: TypingStyle = TypingStyle()
    ) -> None:
        self.style, self.rng = style, random.Random(seed * 1_000_003 + index)
        long = [p for p in files if p.is_file() and p.stat().st_size >= MIN_FILE_BYTES]
        self.files = long or list(files)
        self.rng.shuffle(self.files)

    def visits(self) -> Iterator[Visit]:
        """Pauses forever, file after file; raises when no file (or none at all) gives one."""
        while True:
            typed = False
            for path in self.files:
                text = read_text(path) or ""
                for pause in pauses(text, self.rng, self.style):
                    typed = True
                    yield Visit(path, text, pause)
            if not typed:
                raise RuntimeError(f"none of the {len(self.files)} source files can be typed")
