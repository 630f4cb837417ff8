"""What training on fill-in-the-middle costs the default model in left-to-right loss.

python -m modelbuild.fim_cost [--checkpoint DIR] [--baseline DIR]

Builds the twin of a checkpoint made by ``make model`` with the FIM rate at 0 and everything
else equal (same corpus, tokenizer, seed and steps: the same training windows), unless the
twin is already there, prints both held-out losses (left to right, and of a middle given its
prefix and suffix) and adds them to the checkpoint's model card.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from modelbuild.train import BuildConfig, build
from serving.paths import DEFAULT_CHECKPOINT, REPO_ROOT

SECTION = "## What fill-in-the-middle costs"


def _facts(path: Path) -> dict:
    return json.loads((path / "build.json").read_text())


def twin(checkpoint: Path, baseline: Path) -> tuple[dict, dict]:
    """(the checkpoint's facts, those of its twin trained without FIM), building the twin."""
    facts = _facts(checkpoint)
    config = replace(BuildConfig(**facts["build"]), fim_rate=0.0)
    if (baseline / "build.json").exists() and _facts(baseline)["build"] == {
        **facts["build"],
        "fim_rate": 0.0,
    }:
        return facts, _facts(baseline)
    return facts, build(baseline, config)


def section(facts: dict, plain: dict) -> str:
    rate = facts["build"]["fim_rate"]
    cost = facts["held_out_loss"] - plain["held_out_loss"]
    rows = [
        SECTION,
        "",
        f"Measured by `python -m modelbuild.fim_cost`: this build and its twin trained with no "
        f"FIM examples, the same {facts['build']['steps']} steps on the same windows "
        "(nats/token on the held-out files).",
        "",
        "| FIM rate | left-to-right loss | middle given prefix and suffix |",
        "|---:|---:|---:|",
        f"| 0 | {plain['held_out_loss']:.3f} | {plain['held_out_middle_loss']:.3f} |",
        f"| {rate} | {facts['held_out_loss']:.3f} | {facts['held_out_middle_loss']:.3f} |",
        "",
        f"Left to right, FIM costs {cost:+.3f} nats/token at this size and budget.",
        "",
    ]
    curves = [dict(f.get("held_out_curve", [])) for f in (plain, facts)]
    steps = [step for step in curves[0] if step in curves[1]]
    if steps:
        rows += ["| step | left-to-right loss, rate 0 | rate " + f"{rate} | difference |"]
        rows += ["|---:|---:|---:|---:|"]
        for step in steps:
            a, b = curves[0][step], curves[1][step]
            rows.append(f"| {step} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
        rows.append("")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelbuild.fim_cost", description=__doc__)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--baseline", type=Path, default=REPO_ROOT / "build" / "fim-baseline")
    args = parser.parse_args(argv)
    facts, plain = twin(args.checkpoint, args.baseline)
    text = section(facts, plain)
    print(text)
    card = args.checkpoint / "MODEL_CARD.md"
    kept = card.read_text().split(SECTION)[0].rstrip("\n")
    card.write_text(kept + "\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
