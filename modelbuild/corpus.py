"""Training text that every machine has: the Python standard library's own source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

# The split itself is the contract's, so that the load test can type through the held-out files
# (loadtest.editor) without importing the model build.
from contract.corpus import HELD_OUT_FRACTION, is_held_out, stdlib_files, stdlib_root

__all__ = ["HELD_OUT_FRACTION", "is_held_out", "read_texts", "split", "stdlib_files"]


def read_texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield text


def split(
    root: Path | None = None, held_out: float = HELD_OUT_FRACTION
) -> tuple[list[Path], list[Path]]:
    root = Path(root or stdlib_root())
    files = stdlib_files(root)
    train = [p for p in files if not is_held_out(p, root, held_out)]
    valid = [p for p in files if is_held_out(p, root, held_out)]
    return train, valid
