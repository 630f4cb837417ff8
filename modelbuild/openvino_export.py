"""The OpenVINO IR of a checkpoint, which the engine's ``openvino`` backend serves.

The export lives in ``<checkpoint>/openvino/`` (so it travels with the checkpoint, and the
checkpoint's .gitignore rule covers it), with ``source.json``: a fingerprint of the checkpoint
files it came from. An export whose fingerprint differs from the checkpoint's is stale.

The export itself needs optimum-intel, which lives in ``.venv-export`` (see
scripts/setup-export-venv.sh for why), so :func:`ensure_export` runs this module there:

    .venv-export/bin/python -m modelbuild.openvino_export CHECKPOINT [--force]

The libraries' own output (torch.jit's TracerWarnings, transformers' and optimum's warnings and
logs, progress bars, C++ messages) goes to ``build/logs/openvino-export-<time>.log``; the
terminal gets one line per step, with its time, and on a failure the error and the log's path.

Only the standard library is imported at the top: the server's environment imports this module
to check an export, the export environment to make one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from engine.openvino_model import (
    STAMP,
    WEIGHT_FORMATS,
    ExportError,
    export_dir,
    export_problem,
    fingerprint,
    require_export,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPORT_PYTHON = REPO_ROOT / ".venv-export" / "bin" / "python"
EXPORT_DIR = export_dir(Path()).name
LOG_DIR = REPO_ROOT / "build" / "logs"  # git-ignored

T = TypeVar("T")


class ExportStepError(Exception):
    """A step of the export failed; its traceback is in the log."""

    def __init__(self, label: str, log: Path, cause: BaseException) -> None:
        super().__init__(f"{label}: {type(cause).__name__}: {cause}")
        self.log = log


class QuietSteps:
    """Runs the export's steps with everything the libraries print sent to one log file,
    and one progress line per step on the terminal: the export's TracerWarnings and library
    warnings fill screens and hide what matters (how far it got, what failed)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def run(self, label: str, step: Callable[[], T]) -> T:
        """``step()``, its output in the log; prints "label ... 3.2 s" (or "failed")."""
        print(f"[make model] export: {label} ...", end="", flush=True)
        started = time.perf_counter()
        with self.log.open("a", buffering=1) as log:
            log.write(f"\n=== {label} ({time.strftime('%H:%M:%S')})\n")
            try:
                with _output_to(log):
                    result = step()
            except Exception as exc:
                traceback.print_exc(file=log)
                print(f" failed after {time.perf_counter() - started:.1f} s", flush=True)
                raise ExportStepError(label, self.log, exc) from exc
        print(f" {time.perf_counter() - started:.1f} s", flush=True)
        return result


@contextlib.contextmanager
def _output_to(log: IO[str]) -> Iterator[None]:
    """File descriptors 1 and 2 (C++ code, and the streams logging handlers were given) go
    to ``log``, and so do Python warnings and ``sys.stdout``/``sys.stderr``, then all back.

    ``sys.stdout``/``sys.stderr`` become streams over the descriptors themselves, not over the
    log: a library imported in a step keeps the one it found (transformers' logging handler
    does), and it must stay usable after the step."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    streams = sys.stdout, sys.stderr
    fd_out, fd_err = (
        open(fd, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        for fd in (1, 2)
    )

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: IO[str] | None = None,
        line: str | None = None,
    ) -> None:
        fd_err.write(warnings.formatwarning(message, category, filename, lineno, line))

    log.flush()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show  # also where a caller records warnings (pytest)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.stdout, sys.stderr = fd_out, fd_err
            yield
    finally:
        for stream in (fd_out, fd_err):
            stream.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def new_log() -> Path:
    """A new log file under build/logs (the temp folder where the checkout is read-only)."""
    name = f"openvino-export-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        (LOG_DIR / name).touch()
        return LOG_DIR / name
    except OSError:
        return Path(tempfile.gettempdir()) / name


def ensure_export(checkpoint: Path, force: bool = False, weights: str | None = None) -> Path:
    """Export ``checkpoint`` in .venv-export unless a current export with ``weights`` is
    there already (None: in any format, so a tool never replaces the one `make model` chose;
    float32 when there is none)."""
    if not force and export_problem(checkpoint, weights) is None:
        return export_dir(checkpoint)
    weights = weights or "float32"
    if not EXPORT_PYTHON.is_file():
        raise ExportError(
            f"{EXPORT_PYTHON} is missing: run `make setup` (scripts/setup-export-venv.sh)"
        )
    command = [
        *(str(EXPORT_PYTHON), "-m", "modelbuild.openvino_export", str(checkpoint)),
        *("--weights", weights),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([*command, *(["--force"] if force else [])], cwd=REPO_ROOT, env=env)
    if done.returncode != 0:
        raise ExportError(f"the OpenVINO export of {checkpoint} failed (exit {done.returncode})")
    return require_export(checkpoint)


def export(checkpoint: Path, log: Path | None = None, weights: str = "float32") -> Path:
    """Convert a Hugging Face checkpoint folder to OpenVINO IR with optimum-intel. ``weights``
    float32 keeps them as they are (the math's precision is chosen when the engine compiles
    it); int8 and int4 compress them with NNCF (:func:`_compression`). The libraries' output
    goes to ``log`` (a new file under build/logs); ExportStepError names it."""
    checkpoint = Path(checkpoint)
    out = export_dir(checkpoint)
    partial = out.with_name(EXPORT_DIR + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    steps = QuietSteps(log or new_log())
    _progress(f"exporting {checkpoint} to OpenVINO IR (optimum-intel) ...")
    kind = json.loads((checkpoint / "config.json").read_text()).get("model_type")
    ov_model = steps.run("loading optimum-intel", lambda: _import_optimum(kind))
    model = steps.run(
        "loading the checkpoint and converting it to OpenVINO IR",
        lambda: ov_model.from_pretrained(
            checkpoint, export=True, compile=False, **_compression(weights)
        ),
    )

    def write() -> None:
        model.save_pretrained(partial)
        tokenizer: str | bool = False
        try:
            tokenizer = _write_tokenizer(checkpoint, partial)
        except Exception as exc:  # the model still serves; healed requests are refused there
            tokenizer = f"not converted: {exc!r}"
            _progress(
                f"export: no OpenVINO tokenizer ({exc!r}): the openvino backend will refuse "
                "token healing (send token_healing false, or serve with fallback torch)"
            )
        (partial / STAMP).write_text(
            json.dumps(
                {
                    "fingerprint": fingerprint(checkpoint),
                    "source": str(checkpoint),
                    "weights": weights,
                    "tokenizer": tokenizer,
                },
                indent=1,
            )
        )
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)

    steps.run(f"writing {out}", write)
    _progress(
        f"OpenVINO export -> {out} ({time.perf_counter() - started:.1f} s; "
        f"the libraries' output is in {steps.log})"
    )
    return out


def _write_tokenizer(checkpoint: Path, folder: Path) -> bool:
    """The checkpoint's tokenizer as OpenVINO models beside the export: the pipeline reads the
    token-healing grammar with it (engine/openvino_healing.py); it never tokenizes a prompt. A
    bare checkpoint (weights only, as some tests make) has none to convert."""
    if not (checkpoint / "tokenizer.json").is_file():
        return False
    import openvino as ov  # only in .venv-export, with openvino_tokenizers
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    tokenizer, detokenizer = convert_tokenizer(
        AutoTokenizer.from_pretrained(checkpoint), with_detokenizer=True
    )
    ov.save_model(tokenizer, folder / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, folder / "openvino_detokenizer.xml")
    return True


def _has_optimum_intel() -> bool:
    """Whether optimum-intel is installed here, without importing it (its import is a step of
    the export, with its warnings sent to the log)."""
    try:
        return importlib.util.find_spec("optimum.intel") is not None
    except ImportError:
        return False


def _compression(weights: str) -> dict[str, object]:
    """optimum-intel's keywords for a weight format: none for float32; NNCF's weight-only
    compression for int8 (asymmetric, per output channel) and int4 (symmetric, groups of 64,
    every layer; NNCF keeps the embeddings and the head in int8)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "float32":
        return {"load_in_8bit": False}
    from optimum.intel import OVWeightQuantizationConfig  # only in .venv-export

    if weights == "int8":
        return {"quantization_config": OVWeightQuantizationConfig(bits=8)}
    return {
        "quantization_config": OVWeightQuantizationConfig(
            bits=4, sym=True, group_size=64, ratio=1.0
        )
    }


# optimum-intel 2.2 registers gemma3_text but caps it at transformers 5.0 (the Gemma configs'
# MAX_TRANSFORMERS_VERSION), below .venv-export's 5.5; with the cap lifted its export gives
# transformers' greedy tokens, past the sliding window too (tests/test_gemma3.py checks it).
# model_type -> (optimum-intel's export config class, the transformers version allowed)
LIFTED_CAPS = {"gemma3_text": ("Gemma3TextOpenVINOConfig", "5.5.99")}


def _import_optimum(model_type: str | None = None) -> type:
    from optimum.intel import OVModelForCausalLM  # only in .venv-export

    if model_type in LIFTED_CAPS:
        from optimum.exporters.openvino import model_configs

        name, version = LIFTED_CAPS[model_type]
        getattr(model_configs, name).MAX_TRANSFORMERS_VERSION = version
    return OVModelForCausalLM


def _progress(message: str) -> None:
    print(f"[make model] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelbuild.openvino_export", description=__doc__
    )
    parser.add_argument("checkpoint", type=Path, help="a Hugging Face checkpoint folder")
    parser.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default="float32",
        help="how the export stores the weights (int8/int4: NNCF weight compression)",
    )
    parser.add_argument("--force", action="store_true", help="export even if one is current")
    parser.add_argument(
        "--check", action="store_true", help="only say whether the export is current"
    )
    args = parser.parse_args(argv)
    why = export_problem(args.checkpoint, args.weights)
    if args.check:
        print(why or f"{export_dir(args.checkpoint)} is current")
        return 1 if why else 0
    if why is None and not args.force:
        _progress(f"OpenVINO export {export_dir(args.checkpoint)} is current")
        return 0
    if not (args.checkpoint / "config.json").is_file():
        print(f"error: no checkpoint at {args.checkpoint}", file=sys.stderr)
        return 2
    if not _has_optimum_intel():  # running in .venv rather than .venv-export: hand over
        try:
            ensure_export(args.checkpoint, force=args.force, weights=args.weights)
        except ExportError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        export(args.checkpoint, weights=args.weights)
    except ExportStepError as failed:
        print(f"error: the OpenVINO export failed while {failed}", file=sys.stderr)
        print(
            f"error: the traceback and the libraries' output are in {failed.log}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
