"""The OpenVINO IR of a checkpoint, which the engine's ``openvino`` backend serves.

The export lives in ``<checkpoint>/openvino/`` (so it travels with the checkpoint, and the
checkpoint's .gitignore rule covers it), with ``source.json``: a fingerprint of the checkpoint
files it came from. An export whose fingerprint differs from the checkpoint's is stale.

The export itself needs optimum-intel, which lives in ``.venv-export`` (see
scripts/setup-export-venv.sh for why), so :func:`ensure_export` runs this module there:

    .venv-export/bin/python -m modelbuild.openvino_export CHECKPOINT [--force]

Only the standard library is imported at the top: the server's environment imports this module
to check an export, the export environment to make one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from engine.openvino_model import (
    STAMP,
    ExportError,
    export_dir,
    export_problem,
    fingerprint,
    require_export,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPORT_PYTHON = REPO_ROOT / ".venv-export" / "bin" / "python"
EXPORT_DIR = export_dir(Path()).name


def ensure_export(checkpoint: Path, force: bool = False) -> Path:
    """Export ``checkpoint`` in .venv-export unless a current export is there already."""
    if not force and export_problem(checkpoint) is None:
        return export_dir(checkpoint)
    if not EXPORT_PYTHON.is_file():
        raise ExportError(
            f"{EXPORT_PYTHON} is missing: run `make setup` (scripts/setup-export-venv.sh)"
        )
    command = [str(EXPORT_PYTHON), "-m", "modelbuild.openvino_export", str(checkpoint)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([*command, *(["--force"] if force else [])], cwd=REPO_ROOT, env=env)
    if done.returncode != 0:
        raise ExportError(f"the OpenVINO export of {checkpoint} failed (exit {done.returncode})")
    return require_export(checkpoint)


def export(checkpoint: Path) -> Path:
    """Convert a Hugging Face GPT-J folder to OpenVINO IR with optimum-intel (float32 weights,
    no weight compression: precision is chosen when the engine compiles it)."""
    from optimum.intel import OVModelForCausalLM  # only in .venv-export

    checkpoint = Path(checkpoint)
    out = export_dir(checkpoint)
    partial = out.with_name(EXPORT_DIR + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    _progress(f"exporting {checkpoint} to OpenVINO IR (optimum-intel) ...")
    model = OVModelForCausalLM.from_pretrained(
        checkpoint, export=True, compile=False, load_in_8bit=False
    )
    model.save_pretrained(partial)
    (partial / STAMP).write_text(
        json.dumps({"fingerprint": fingerprint(checkpoint), "source": str(checkpoint)}, indent=1)
    )
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    _progress(f"OpenVINO export -> {out} ({time.perf_counter() - started:.1f} s)")
    return out


def _progress(message: str) -> None:
    print(f"[make model] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelbuild.openvino_export", description=__doc__
    )
    parser.add_argument("checkpoint", type=Path, help="a Hugging Face GPT-J folder")
    parser.add_argument("--force", action="store_true", help="export even if one is current")
    parser.add_argument(
        "--check", action="store_true", help="only say whether the export is current"
    )
    args = parser.parse_args(argv)
    why = export_problem(args.checkpoint)
    if args.check:
        print(why or f"{export_dir(args.checkpoint)} is current")
        return 1 if why else 0
    if why is None and not args.force:
        _progress(f"OpenVINO export {export_dir(args.checkpoint)} is current")
        return 0
    if not (args.checkpoint / "config.json").is_file():
        print(f"error: no checkpoint at {args.checkpoint}", file=sys.stderr)
        return 2
    try:
        import optimum.intel  # noqa: F401
    except ImportError:  # running in .venv rather than .venv-export: hand over
        try:
            ensure_export(args.checkpoint, force=args.force)
        except ExportError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    export(args.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
