"""Varied, real code prompts for load, cut from the local Python standard library.

The one module every load generator takes its prompts from: the sweep's Locust users, the soak,
the stress test and the benchmark's traffic. Plain standard library, so it sits with the
contract, next to :mod:`contract.corpus` (which files the model trains on).

One fixed prompt would make every request the same length and let caches flatter the server; a
completion service sees the start of a function or class with a few lines of its body. So each
prompt is a ``def``/``class`` head (with decorators) and its first few body lines, taken from the
stdlib sources of the interpreter running the test: real code, no download, and the same list
for the same seed on the same Python.
"""

from __future__ import annotations

import ast
import random
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

from contract.corpus import stdlib_root

# Test suites and generated/vendored trees: unrepresentative or huge.
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted: the order must not depend on the disk."""
    base = Path(root or stdlib_root())
    return sorted(
        path
        for path in base.rglob("*.py")
        if not _SKIP_PARTS.intersection(path.relative_to(base).parts)
    )


def _heads(source: str) -> Iterator[tuple[int, int, int]]:
    """(first line, line of the first body statement, last line) of every def/class, 1-based."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield first, node.body[0].lineno, node.end_lineno or node.body[-1].lineno


def _cut(lines: list[str], head: tuple[int, int, int], body_lines: int, max_chars: int) -> str:
    """The head and up to ``body_lines`` body lines, dedented, cut at a line within max_chars."""
    first, body, last = head
    end = min(last, body - 1 + body_lines)
    text = textwrap.dedent("".join(lines[first - 1 : end]))
    if len(text) > max_chars:
        text = text[: text.rfind("\n", 0, max_chars) + 1]
    return text


def code_prompts(
    count: int = 300,
    seed: int = 0,
    max_chars: int = 600,
    sources: Iterable[Path] | None = None,
) -> list[str]:
    """``count`` distinct prompts (a few per file, files in a seeded random order).

    Each ends with a newline so that the model continues with the next line of code; the length
    varies (1 to 6 body lines) so that prefill work varies as in real traffic.
    """
    rng = random.Random(seed)
    files = list(sources if sources is not None else stdlib_sources())
    rng.shuffle(files)
    prompts: list[str] = []
    seen: set[str] = set()
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = source.splitlines(keepends=True)
        heads = list(_heads(source))
        rng.shuffle(heads)
        for head in heads[:3]:
            text = _cut(lines, head, rng.randint(1, 6), max_chars)
            if len(text.strip()) < 16 or text in seen:
                continue
            if not text.endswith("\n"):
                text += "\n"
            seen.add(text)
            prompts.append(text)
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise RuntimeError("no code prompts found in the given sources")
    return prompts


if __name__ == "__main__":
    sample = code_prompts(5)
    for prompt in sample:
        print(prompt, "-" * 40, sep="")
