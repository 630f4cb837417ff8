"""Command line for real checkpoints and the FasterTransformer export.

    python -m modelbuild.deploy_cli import SRC [--out DIR] [--force]
    python -m modelbuild.deploy_cli export-ft [--checkpoint DIR] [--out DIR] [--tp N] [--dtype T]

``SRC`` is a local Hugging Face folder or a hub id: GPT-J, CodeGen (converted to GPT-J), or the
Llama family (``model_type`` llama, qwen2, mistral, starcoder2: installed unchanged; see
docs/models.md). ``export-ft`` (GPT-J only) writes a Triton model repository (default
``build/ft_model_repository``) whose model stage runs on the FasterTransformer backend with the
checkpoint split for ``--tp`` GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from modelbuild import fastertransformer, importer
from serving.paths import BUILD_DIR, DEFAULT_CHECKPOINT, MODEL_REPOSITORY

DEFAULT_FT_REPOSITORY = BUILD_DIR / "ft_model_repository"
DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


def import_checkpoint(source: str, dest: Path, force: bool) -> Path:
    """Install ``source`` (folder or hub id, of a supported family) as a folder at ``dest``."""
    path = importer.import_checkpoint(source, Path(dest), force=force)
    print(f"[make model] imported {source} -> {path}")
    return path


def export_fastertransformer(
    checkpoint: Path,
    out_dir: Path,
    tensor_parallel: int,
    dtype: str,
    model_repository: Path = MODEL_REPOSITORY,
    container_repository: str = fastertransformer.DEFAULT_CONTAINER_REPOSITORY,
) -> Path:
    """Write a FasterTransformer model repository for ``checkpoint`` into ``out_dir``."""
    data_type = DTYPE_ALIASES.get(dtype.lower())
    if data_type is None:
        raise fastertransformer.ExportError(
            f"data type {dtype!r} is not one of {sorted(DTYPE_ALIASES)}"
        )
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise fastertransformer.ExportError(
            f"no checkpoint at {checkpoint}; run `make model` (or MODEL=<folder>) first"
        )
    kind = json.loads((checkpoint / "config.json").read_text()).get("model_type", "gptj")
    if kind != "gptj":
        raise fastertransformer.ExportError(
            f"{checkpoint} is a {kind!r} model; FasterTransformer's GPT-J backend runs gptj only"
        )
    out = fastertransformer.write_ft_model_repository(
        checkpoint,
        Path(model_repository),
        Path(out_dir),
        tp=tensor_parallel,
        data_type=data_type,
        container_repository=container_repository,
    )
    print(
        f"[make model] FasterTransformer repository ({data_type}, tensor parallel "
        f"{tensor_parallel}) -> {out}; serve it with docker/Dockerfile.fastertransformer"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelbuild.deploy_cli", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    imp = commands.add_parser("import", help="import a GPT-J, CodeGen or Llama-family checkpoint")
    imp.add_argument("source", help="local Hugging Face folder, or a hub id")
    imp.add_argument("--out", type=Path, default=DEFAULT_CHECKPOINT)
    imp.add_argument("--force", action="store_true", help="replace an installed checkpoint")

    exp = commands.add_parser("export-ft", help="write a FasterTransformer model repository")
    exp.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    exp.add_argument("--out", type=Path, default=DEFAULT_FT_REPOSITORY)
    exp.add_argument("--tp", type=int, default=1, choices=fastertransformer.SUPPORTED_TP)
    exp.add_argument("--dtype", default="fp16", help="fp16 (default), bf16 or fp32")
    exp.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    exp.add_argument(
        "--container-repository",
        default=fastertransformer.DEFAULT_CONTAINER_REPOSITORY,
        help="where the server mounts --out (model_checkpoint_path is written for it)",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "import":
            import_checkpoint(args.source, args.out, args.force)
        else:
            export_fastertransformer(
                args.checkpoint,
                args.out,
                args.tp,
                args.dtype,
                model_repository=args.model_repository,
                container_repository=args.container_repository,
            )
    except (importer.CheckpointImportError, fastertransformer.ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
