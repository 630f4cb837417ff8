"""Training text that every machine has: the Python standard library's own source."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's own modules, in a stable order.

    Its test suites are left out: they are a third of the text and nearly all
    ``self.assertEqual(...)``, which a small model then repeats whatever the prompt.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]) and not p.name.startswith("test_")
    )


def is_held_out(path: Path, root: Path, fraction: float) -> bool:
    """A file's split depends only on its relative path, so it is stable across runs."""
    digest = hashlib.sha256(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2**32


def read_texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield text


def split(root: Path | None = None, held_out: float = 0.03) -> tuple[list[Path], list[Path]]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    train = [p for p in files if not is_held_out(p, root, held_out)]
    valid = [p for p in files if is_held_out(p, root, held_out)]
    return train, valid
