"""Does the cursor's token boundary matter for fill-in-the-middle? ``python -m
evaluation.fim_boundary --checkpoint DIR``.

The measurement that decided that the server heals the prefix's end of a fill-in-the-middle
prompt, as it heals the end of a plain one (docs/generation.md#token-healing), with
transformers alone on a checkpoint that has FIM tokens, on `make eval`'s single-line infilling
cases (every non-blank line of every HumanEval solution cut out; with ``--cut mid`` the cursor
in the middle of the line, the rest of it to write): each middle written twice, greedy, from the
layout the server builds (preprocessing's tokenizer, FIM layout and order),

- whole: the prefix as sent with ``token_healing: false``;
- healed: the prefix's last token held back by the same rule as for plain prompts
  (contract/healing.py) and the middle's first token required to start with its text,

and both judged by the problem's tests, exact match and edit similarity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation.local import LocalModel
from evaluation.problems import LINE_STOPS, LineCase, line_scores, load_problems, select, trim
from evaluation.run import Budget, all_cases, execute
from preprocessing.tokenize import Preprocessor


def middles(local: LocalModel, pre: Preprocessor, prefix: str, suffix: str, tokens: int):
    """(whole, healed, held back?) middles of one case, cut at the first newline."""
    assert pre.fim is not None
    head = list(pre.head)
    before, after = pre.encode_all([prefix, suffix])
    ends = [stop[0] for stop in pre.end_stops] + ([pre.fim_stop[0]] if pre.fim_stop else [])
    whole = local.generate(head + pre.fim.prompt(before, after), tokens, LINE_STOPS, ends)
    held = before[-1] if len(before) > 1 else None
    allowed = pre.extensions.allowed(held) if held is not None else ()
    if len(allowed) < 2:  # nothing held back: the same request
        return trim(whole, LINE_STOPS), trim(whole, LINE_STOPS), False
    kept = before[:-1]
    text = local.text_after(kept, before[-1])
    ids = head + pre.fim.prompt(kept, after)
    healed = local.generate(ids, tokens, LINE_STOPS, ends, allowed, text)
    return trim(whole, LINE_STOPS), trim(healed, LINE_STOPS), True


def mid_line(case: LineCase) -> LineCase:
    """The cursor in the middle of the cut line, after its indentation and half its text (an
    editor's cursor is often inside a word): the rest of the line is the middle to write."""
    indent = len(case.target) - len(case.target.lstrip())
    at = indent + (len(case.target) - indent) // 2
    return replace(case, prefix=case.prefix + case.target[:at], target=case.target[at:])


def measure(
    checkpoint: Path, quick: bool, limit: int | None, tokens: int, cut: str = "line"
) -> dict[str, Any]:
    problems = select(load_problems(), quick, limit)
    by_id = {p["task_id"]: p for p in problems}
    cases = all_cases(problems)
    if cut == "mid":
        cases = [mid_line(case) for case in cases]
    pre, local = Preprocessor(checkpoint), LocalModel(checkpoint)
    if pre.fim is None:
        raise SystemExit(f"{checkpoint} has no fill-in-the-middle tokens: nothing to measure")
    if pre.bare is not None:
        raise SystemExit("a CodeLlama-style bare suffix is not measured here")
    budget, rows = Budget(checkpoint), []
    for case in tqdm(cases, desc="whole and healed middles", unit="case", dynamic_ncols=True):
        room = budget.room(tokens, case.prefix, case.suffix)
        if room < 1:  # over the context: no middle either way (counted as failures)
            whole, healed, held = "", "", False
        else:
            whole, healed, held = middles(local, pre, case.prefix, case.suffix, room)
        rows.append(
            {
                "case": case.key,
                "target": case.target,
                "whole": whole,
                "healed": healed,
                "held_back": held,
            }
        )
    programs = [
        c.filled(by_id[c.task_id], r[k])
        for k in ("whole", "healed")
        for c, r in zip(cases, rows, strict=True)
    ]
    outcomes = execute(programs, 10.0, "running infilled programs")
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "fim": f"{pre.fim.style} {pre.fim.order}",
        "cases": len(cases),
        "max_tokens": tokens,
        "held_back": sum(r["held_back"] for r in rows),
    }
    for k, part in (("whole", outcomes[: len(cases)]), ("healed", outcomes[len(cases) :])):
        pairs = [(r[k], r["target"]) for r in rows]
        passed = sum(o.passed for o in part)
        result[k] = {"passed": passed, "total": len(part), **line_scores(pairs)}
    result["differ"] = sum(r["whole"] != r["healed"] for r in rows)
    result["rows"] = rows
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--cut",
        choices=("line", "mid"),
        default="line",
        help="the cursor at the cut line's start (make eval's cases) or in its middle",
    )
    parser.add_argument("--out", type=Path, default=Path("eval/results"))
    args = parser.parse_args(argv)
    begin = time.monotonic()
    result = measure(args.checkpoint, args.quick, args.limit, args.max_tokens, args.cut)
    result["cut"] = args.cut
    result["duration_s"] = round(time.monotonic() - begin, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fim-boundary-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(
        f"{result['cases']} cases ({result['fim']}, cursor at the line's {args.cut}), the "
        f"prefix's last token held back in {result['held_back']}, middles differing in "
        f"{result['differ']}:"
    )
    for k in ("whole", "healed"):
        r = result[k]
        print(
            f"  {k:6}: infill pass@1 {r['passed']}/{r['total']}, exact {r['exact']} "
            f"({r['exact_match']:.1%}), edit similarity {r['edit_similarity']:.3f}"
        )
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
