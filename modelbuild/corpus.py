"""Training text that every machine has: the Python standard library's own source."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from pathlib import Path


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the standard library (site-packages excluded), in a stable order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
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
