"""``make model``: build (or import) the checkpoint the model repository serves.

python -m modelbuild build [--steps N] [--force] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from serving.paths import DEFAULT_CHECKPOINT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelbuild", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="train the default model on the stdlib")
    build.add_argument("--out", type=Path, default=DEFAULT_CHECKPOINT)
    build.add_argument("--steps", type=int, default=None, help="training steps (default 200)")
    build.add_argument("--force", action="store_true", help="rebuild even if a model exists")
    args = parser.parse_args(argv)

    if args.command == "build":
        if (args.out / "config.json").exists() and not args.force:
            print(f"[make model] model already present at {args.out} (FORCE=1 rebuilds it)")
            return 0
        from modelbuild.train import BuildConfig
        from modelbuild.train import build as run_build

        config = BuildConfig()
        if args.steps is not None:
            config = dataclasses.replace(config, steps=args.steps)
        run_build(args.out, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
