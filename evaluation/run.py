"""The evaluation's sections: HumanEval pass@1 served and alone, next-line accuracy, infilling.

Each section returns plain data (the JSON report's sections); :mod:`evaluation.report` writes
them. Generation runs first (the served requests, then transformers), the programs after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation.problems import (
    HUMANEVAL_STOPS,
    LINE_STOPS,
    LineCase,
    Problem,
    line_cases,
    line_scores,
    program,
    trim,
)
from evaluation.sandbox import Outcome, run_all
from evaluation.served import Answer, CompletionsClient, FimUnsupportedError, Request

TRANSFORMERS_MODES = ("all", "humaneval", "none")
FIM_TOKENS = 4  # sentinels (and CodeGen2's end token) a fill-in-the-middle prompt adds


@dataclass(frozen=True)
class Settings:
    """What one run measures and how (the report's ``settings``)."""

    max_tokens: int = 256
    instruct_max_tokens: int = 512  # an instruct answer: prose around a code block
    line_max_tokens: int = 48
    timeout: float = 10.0
    concurrency: int = 4
    transformers: str = "all"  # both generation sections, HumanEval only, or none
    lines: bool = True  # the next-line and infilling sections
    token_healing: bool = True  # off: every completion sends token_healing false
    instruct_compare: int | None = None  # transformers answers the first N instruct problems


class Budget:
    """How many tokens a request may ask for: its max_tokens, capped by what the context
    leaves after the prompt (counted with the checkpoint's tokenizer; uncapped without one)."""

    def __init__(self, checkpoint: Path | None) -> None:
        self.tokenizer = None
        self.context: int | None = None
        if checkpoint is not None and (Path(checkpoint) / "config.json").is_file():
            from transformers import PreTrainedTokenizerFast

            from engine import ModelShape

            self.context = ModelShape.read(Path(checkpoint)).context
            self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(checkpoint))

    def tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else 0

    def room(self, wanted: int, prompt: str, suffix: str | None = None) -> int:
        if self.context is None:
            return wanted
        used = self.tokens(prompt) + (self.tokens(suffix) + FIM_TOKENS if suffix else 0)
        return min(wanted, self.context - used)


OVER_CONTEXT = "the prompt leaves no room in the model's context"


def _bar(total: int, desc: str) -> tuple[tqdm, Callable[[], None]]:
    bar = tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True)
    return bar, lambda: bar.update(1)


def serve_all(
    client: CompletionsClient, requests: Sequence[Request | None], desc: str, concurrency: int
) -> list[Answer]:
    """Answers to the requests; None (no room in the context) is answered with that error."""
    sendable = [r for r in requests if r is not None]
    bar, tick = _bar(len(sendable), desc)
    try:
        answers = iter(client.complete_all(sendable, concurrency, tick))
    finally:
        bar.close()
    return [Answer(error=OVER_CONTEXT) if r is None else next(answers) for r in requests]


def generate_locally(local: Any, requests: Sequence[Request | None], desc: str) -> list[str]:
    """Transformers' completions of the same requests ("" where there was no room)."""
    sendable = [(r.prompt, r.max_tokens, r.stops) for r in requests if r is not None]
    bar, tick = _bar(len(sendable), desc)
    try:
        texts = iter(local.complete_all(sendable, tick))
    finally:
        bar.close()
    return ["" if r is None else next(texts) for r in requests]


def execute(programs: Sequence[str], timeout: float, desc: str) -> list[Outcome]:
    bar = tqdm(total=len(programs), desc=desc, unit="program", dynamic_ncols=True)
    try:
        return run_all(programs, timeout, progress=lambda: bar.update(1))
    finally:
        bar.close()


def _text(answer: Answer, stops: Sequence[str]) -> str:
    return trim(answer.text, stops)


def _score(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    passed = sum(o.passed for o in outcomes)
    return {
        "passed": passed,
        "total": len(outcomes),
        "pass_at_1": passed / len(outcomes) if outcomes else 0.0,
    }


def humaneval(
    problems: Sequence[Problem],
    client: CompletionsClient,
    local: Any | None,
    budget: Budget,
    settings: Settings,
) -> dict[str, Any]:
    """pass@1 (greedy) through the server and through transformers, and where they differ."""
    requests = []
    for problem in problems:
        room = budget.room(settings.max_tokens, problem["prompt"])
        requests.append(Request(problem["prompt"], room, HUMANEVAL_STOPS) if room > 0 else None)
    answers = serve_all(client, requests, "served HumanEval", settings.concurrency)
    served = [_text(a, HUMANEVAL_STOPS) for a in answers]
    alone = None
    if local is not None:
        texts = generate_locally(local, requests, "transformers HumanEval")
        alone = [trim(t, HUMANEVAL_STOPS) for t in texts]
    runs = [program(p, t) for p, t in zip(problems, served, strict=True)]
    runs += [program(p, t) for p, t in zip(problems, alone or [], strict=False)]
    outcomes = execute(runs, settings.timeout, "running HumanEval programs")
    served_out, alone_out = outcomes[: len(problems)], outcomes[len(problems) :]
    rows, mismatches = [], []
    for i, problem in enumerate(problems):
        row: dict[str, Any] = {
            "task_id": problem["task_id"],
            "served": {"completion": served[i], "result": str(served_out[i])},
        }
        if answers[i].error:
            row["served"]["error"] = answers[i].error
        if alone is not None:
            row["transformers"] = {"completion": alone[i], "result": str(alone_out[i])}
            if alone[i] != served[i] or (answers[i].error and requests[i] is not None):
                mismatches.append(problem["task_id"])
        rows.append(row)
    return {
        "served": _score(served_out),
        "transformers": _score(alone_out) if alone is not None else None,
        "compared": len(problems) if alone is not None else 0,
        "mismatches": mismatches,
        "errors": [r["task_id"] for r in rows if "error" in r["served"]],
        "problems": rows,
    }


def line_requests(
    cases: Sequence[LineCase], budget: Budget, settings: Settings, with_suffix: bool = False
) -> list[Request | None]:
    requests: list[Request | None] = []
    for case in cases:
        suffix = case.suffix if with_suffix else None
        room = budget.room(settings.line_max_tokens, case.prefix, suffix)
        requests.append(Request(case.prefix, room, LINE_STOPS, suffix) if room > 0 else None)
    return requests


def next_line(
    cases: Sequence[LineCase],
    client: CompletionsClient,
    local: Any | None,
    budget: Budget,
    settings: Settings,
) -> dict[str, Any]:
    """Exact match and edit similarity of the line after the prompt and the first k lines."""
    requests = line_requests(cases, budget, settings)
    answers = serve_all(client, requests, "served next lines", settings.concurrency)
    served = [_text(a, LINE_STOPS) for a in answers]
    alone = None
    if local is not None:
        texts = generate_locally(local, requests, "transformers next lines")
        alone = [trim(t, LINE_STOPS) for t in texts]
    targets = [c.target for c in cases]
    rows = []
    for i, case in enumerate(cases):
        row = {"case": case.key, "target": case.target, "served": served[i]}
        if answers[i].error:
            row["error"] = answers[i].error
        if alone is not None:
            row["transformers"] = alone[i]
        rows.append(row)
    compared = alone is not None
    return {
        "served": line_scores(list(zip(served, targets, strict=True))),
        "transformers": line_scores(list(zip(alone, targets, strict=True))) if compared else None,
        "compared": len(cases) if compared else 0,
        "mismatches": [r["case"] for r in rows if compared and r["transformers"] != r["served"]],
        "errors": [r["case"] for r in rows if "error" in r],
        "cases": rows,
    }


def infill(
    problems: Sequence[Problem],
    cases: Sequence[LineCase],
    prefix_only: Sequence[str],
    client: CompletionsClient,
    budget: Budget,
    settings: Settings,
) -> dict[str, Any]:
    """Single-line infilling judged by the problem's tests: the cut line written from prefix and
    suffix, against prefix only (the next-line answers: the same request)."""
    by_id = {p["task_id"]: p for p in problems}
    requests = line_requests(cases, budget, settings, with_suffix=True)
    first = next((r for r in requests if r is not None), None)
    try:
        if first is not None:
            client.complete(first)  # a model without FIM tokens is refused here, once
        answers = serve_all(client, requests, "served infills", settings.concurrency)
    except FimUnsupportedError as exc:
        return {"status": "skipped", "reason": f"the server refused `suffix`: {exc}"}
    middles = [_text(a, LINE_STOPS) for a in answers]
    with_suffix = [c.filled(by_id[c.task_id], m) for c, m in zip(cases, middles, strict=True)]
    without = [c.filled(by_id[c.task_id], m) for c, m in zip(cases, prefix_only, strict=True)]
    outcomes = execute(with_suffix + without, settings.timeout, "running infilled programs")
    with_out, without_out = outcomes[: len(cases)], outcomes[len(cases) :]
    rows = []
    for i, case in enumerate(cases):
        row = {
            "case": case.key,
            "target": case.target,
            "with_suffix": middles[i],
            "with_suffix_result": str(with_out[i]),
            "prefix_only": prefix_only[i],
            "prefix_only_result": str(without_out[i]),
        }
        if answers[i].error:
            row["error"] = answers[i].error
        rows.append(row)
    targets = [c.target for c in cases]
    written = list(zip(middles, targets, strict=True))
    prefix_written = list(zip(prefix_only, targets, strict=True))
    return {
        "status": "ok",
        "with_suffix": {**_score(with_out), **line_scores(written)},
        "prefix_only": {**_score(without_out), **line_scores(prefix_written)},
        "errors": [r["case"] for r in rows if "error" in r],
        "cases": rows,
    }


def sandbox_check(problems: Sequence[Problem], settings: Settings) -> dict[str, Any]:
    """The canonical solutions through the same runner: all should pass on a sound machine."""
    runs = [program(p, p["canonical_solution"]) for p in problems]
    outcomes = execute(runs, settings.timeout, "running canonical solutions")
    pairs = zip(problems, outcomes, strict=True)
    failed = [f"{p['task_id']}: {o}" for p, o in pairs if not o.passed]
    return {**_score(outcomes), "failed": failed}


def all_cases(problems: Sequence[Problem]) -> list[LineCase]:
    return [case for problem in problems for case in line_cases(problem)]
