"""Instruct HumanEval: each problem asked through ``/v1/chat/completions``, as evalplus asks an
instruct model (its instruction, the problem in a code block), and the code block taken from
the answer and run against the problem's tests.

An instruct checkpoint is trained on its chat template, so this is how it is meant to be used;
plain completion (:func:`evaluation.run.humaneval`) feeds it raw code it was never trained to
continue. transformers answers the same messages through the same template
(:mod:`contract.chat`, rendered as the server renders it), so served and alone compare answer
by answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from contract.chat import ChatTemplate
from evaluation.problems import Problem
from evaluation.run import Budget, Settings, _bar, _score, execute
from evaluation.served import CompletionsClient

# evalplus's instruct prompt (evalplus/codegen.py, ``instruction_prefix``)
INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a "
    "markdown code block:"
)
IMPORTS = ("import ", "from ")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:\n```|$)", re.DOTALL | re.IGNORECASE)


def question(problem: Problem) -> str:
    """The user's message for one problem."""
    return f"{INSTRUCTION}\n```\n{problem['prompt'].strip()}\n```\n"


def messages(problem: Problem) -> list[dict[str, str]]:
    return [{"role": "user", "content": question(problem)}]


def code_block(answer: str) -> str:
    """The first fenced code block of an answer (an unclosed one runs to the end), else the
    whole answer."""
    found = FENCE.search(answer)
    return found.group(1) if found else answer


def program(problem: Problem, code: str) -> str:
    """The script the sandbox runs: the prompt's imports, the answer's code (after the prompt
    when it does not define the function itself), the tests and the call to ``check``."""
    entry = problem["entry_point"]
    imports = [line for line in problem["prompt"].splitlines() if line.startswith(IMPORTS)]
    defines = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE)
    body = code if defines else problem["prompt"] + code
    return "\n".join([*imports, body, problem["test"], f"check({entry})"])


class LocalChat:
    """The checkpoint alone (:class:`evaluation.local.LocalModel`) answering chat messages
    through its template, stopping at the end of a turn as the server does."""

    def __init__(self, local: Any) -> None:
        tokenizer = local.tokenizer
        # the BOS stays in the text here: the tokenizer encodes it, as preprocessing adds it
        self.chat = ChatTemplate.of(tokenizer, ())
        end = self.chat.end if self.chat else None
        self.ends = tuple(tokenizer.convert_tokens_to_ids([end])) if end else ()
        self.local = local

    def answer(self, prompt: str, max_tokens: int) -> str:
        return self.local.complete(prompt, max_tokens, (), self.ends, heal=False)


def humaneval_instruct(
    problems: Sequence[Problem],
    client: CompletionsClient,
    local: Any | None,
    budget: Budget,
    settings: Settings,
    chats: bool | None,
) -> dict[str, Any]:
    """pass@1 (greedy) of the answers' code blocks, served and alone; skipped for a model the
    server says does not chat (``chats``: /v1/models' ``chat``)."""
    if not chats:
        return {"status": "skipped", "reason": "the served model has no chat template"}
    alone_chat = LocalChat(local) if local is not None else None
    if alone_chat is not None and alone_chat.chat is None:
        alone_chat = None  # the checkpoint at hand has no template: served only
    rendered = [
        alone_chat.chat.prompt(messages(p)) if alone_chat and alone_chat.chat else None
        for p in problems
    ]
    rooms = [
        budget.room(settings.instruct_max_tokens, text) if text else settings.instruct_max_tokens
        for text in rendered
    ]
    answers = client.chat_all(
        [messages(p) for p in problems], rooms, settings.concurrency, "served instruct HumanEval"
    )
    served = [a.text for a in answers]
    alone: list[str] | None = None
    if alone_chat is not None:
        bar, tick = _bar(len(problems), "transformers instruct HumanEval")
        try:
            alone = []
            compare = (
                len(problems) if settings.instruct_compare is None else settings.instruct_compare
            )
            for text, room in list(zip(rendered, rooms, strict=True))[:compare]:
                alone.append(alone_chat.answer(text or "", room))
                tick()
        finally:
            bar.close()
    runs = [program(p, code_block(t)) for p, t in zip(problems, served, strict=True)]
    runs += [program(p, code_block(t)) for p, t in zip(problems, alone or [], strict=False)]
    outcomes = execute(runs, settings.timeout, "running instruct HumanEval programs")
    served_out, alone_out = outcomes[: len(problems)], outcomes[len(problems) :]
    rows = []
    for i, problem in enumerate(problems):
        row: dict[str, Any] = {
            "task_id": problem["task_id"],
            "served": {"answer": served[i], "result": str(served_out[i])},
        }
        if answers[i].error:
            row["served"]["error"] = answers[i].error
        if alone is not None and i < len(alone):
            row["transformers"] = {"answer": alone[i], "result": str(alone_out[i])}
        rows.append(row)
    compared = alone is not None
    return {
        "status": "ok",
        "max_tokens": settings.instruct_max_tokens,
        "served": _score(served_out),
        "served_compared": _score(served_out[: len(alone)]) if compared else None,
        "transformers": _score(alone_out) if compared else None,
        "compared": len(alone) if compared else 0,
        "mismatches": [
            r["task_id"]
            for r in rows
            if "transformers" in r and r["served"]["answer"] != r["transformers"]["answer"]
        ],
        "errors": [r["task_id"] for r in rows if "error" in r["served"]],
        "problems": rows,
    }
