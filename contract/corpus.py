"""Which standard-library files the default model trains on and which it never sees.

``make model`` (:mod:`modelbuild.corpus`) trains on the standard library's own modules and holds
out a stable 3 % of them to measure its loss; the load test's editor profile
(:mod:`loadtest.editor`) types through the held-out ones, so that its completions are of code
the model never trained on. Both take the rule from here, the one module they may both import.
The split depends only on each file's path relative to the library's root, so it is the same
on every run and every machine with the same Python.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELD_OUT_FRACTION = 0.03
SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's own modules, in a stable order.

    Its test suites are left out: they are a third of the text and nearly all
    ``self.assertEqual(...)``, which a small model then repeats whatever the prompt.
    """
    root = Path(root or stdlib_root())
    return sorted(
        p
        for p in root.rglob("*.py")
        if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]) and not p.name.startswith("test_")
    )


def is_held_out(path: Path, root: Path, fraction: float = HELD_OUT_FRACTION) -> bool:
    """A file's split depends only on its relative path, so it is stable across runs."""
    digest = hashlib.sha256(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2**32


def held_out_files(root: Path | None = None, fraction: float = HELD_OUT_FRACTION) -> list[Path]:
    """The files ``make model`` never trains on (with its default ``fraction``)."""
    root = Path(root or stdlib_root())
    return [p for p in stdlib_files(root) if is_held_out(p, root, fraction)]
