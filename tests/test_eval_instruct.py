"""Instruct HumanEval (evaluation/instruct.py): the code block taken from an answer, the program
it makes, and a run through the API's /v1/chat/completions against transformers with the same
template (the tiny model with tests/chat_checkpoint.py's template): on the torch engine at
float32 the served answers are transformers' own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ApiServer
from chat_checkpoint import with_chat_template

from evaluation.__main__ import main
from evaluation.instruct import code_block, program, question
from evaluation.problems import load_problems
from evaluation.sandbox import run_all
from openai_api import Settings as ApiSettings

PROBLEMS = load_problems()[:3]


def test_the_code_block_is_taken_from_the_answer():
    answer = "Sure! Here it is:\n```python\ndef f(x):\n    return x\n```\nIt returns x."
    assert code_block(answer) == "def f(x):\n    return x"
    assert code_block("```\nprint(1)\n```") == "print(1)"
    assert code_block("```Python\nunclosed = 1\n").strip() == "unclosed = 1"
    assert code_block("no fence at all") == "no fence at all"
    assert question(PROBLEMS[0]).startswith("Please provide a self-contained Python script")
    assert PROBLEMS[0]["prompt"].strip() in question(PROBLEMS[0])


def test_a_whole_solution_and_a_bare_body_both_run_against_the_tests():
    problem = PROBLEMS[0]  # has_close_elements, with `from typing import List` in its prompt
    body = problem["canonical_solution"]
    whole = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n" + body
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    outcomes = run_all([program(problem, c) for c in (whole, body, wrong)], 10.0)
    assert [o.passed for o in outcomes] == [True, True, False]


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    return with_chat_template(tiny_checkpoint, tmp_path_factory.mktemp("chat") / "checkpoint")


@pytest.fixture(scope="module")
def api(server, chat_checkpoint) -> Iterator[ApiServer]:
    with ApiServer(ApiSettings(triton_url=server.grpc_url, checkpoint=chat_checkpoint)) as api:
        yield api


@pytest.mark.timeout(480)
def test_an_instruct_run_scores_beside_plain_completion_and_matches_transformers(
    api, chat_checkpoint, tmp_path
):
    out = tmp_path / "results"
    argv = ["--url", f"{api.url}/v1", "--checkpoint", str(chat_checkpoint), "--limit", "3"]
    argv += ["--out", str(out), "--no-lines", "--instruct-max-tokens", "48", "--max-tokens", "16"]
    argv += ["--instruct-compare", "2"]  # transformers answers the first 2 of the 3
    assert main(argv) == 0
    (folder,) = out.iterdir()
    data = json.loads((folder / "report.json").read_text())
    markdown = (folder / "report.md").read_text()
    assert "## Instruct HumanEval pass@1" in markdown and "plain completion pass@1" in markdown
    assert "## Next-line accuracy" not in markdown and data["next_line"] is None
    section = data["humaneval_instruct"]
    assert section["status"] == "ok", section
    assert section["served"]["total"] == 3 and section["transformers"]["total"] == 2
    assert section["compared"] == 2 and not section["errors"]
    assert section["served_compared"]["total"] == 2 and "served, the first 2" in markdown
    for row in section["problems"]:
        assert row["served"]["answer"] and row["served"]["result"]
    # greedy float32 on the torch engine, the same template: the served answers are
    # transformers' own
    assert section["mismatches"] == [], markdown
