"""`make eval`'s harness: the sandboxed runner, the cases and cuts, and a whole run (three
problems) through the OpenAI API in front of the test session's tiny model, compared with
transformers on the same checkpoint. The tiny model scores about 0; what is checked is the
harness: every section is there and the two backends were compared problem by problem."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ApiServer

from evaluation.__main__ import main
from evaluation.problems import (
    LINE_STOPS,
    line_cases,
    line_scores,
    load_problems,
    program,
    select,
    trim,
)
from evaluation.run import Budget, Settings, infill
from evaluation.sandbox import run_program
from evaluation.served import Answer, FimUnsupportedError, Request, refuses_suffix
from openai_api import Settings as ApiSettings

PROBLEMS = load_problems()


def test_the_runner_passes_a_canonical_solution():
    problem = PROBLEMS[0]
    outcome = run_program(program(problem, problem["canonical_solution"]), timeout=20)
    assert outcome.passed, outcome


def test_the_runner_fails_a_wrong_solution_saying_why():
    outcome = run_program(program(PROBLEMS[0], "    return False\n"), timeout=20)
    assert outcome.status == "failed" and "AssertionError" in outcome.detail


def test_the_runner_stops_an_endless_loop():
    outcome = run_program("while True:\n    pass\n", timeout=1)
    assert outcome.status == "timed out"


def test_the_runner_is_isolated_from_the_environment(tmp_path, monkeypatch):
    """python -I in a temporary directory: no PYTHON* variables, not this folder's modules."""
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert run_program(f"import os\nassert os.getcwd() != {str(tmp_path)!r}\n", 20).passed


def test_stops_cut_at_the_earliest():
    assert trim("    return 1\n# end\ndef g():", ("\ndef", "\n#")) == "    return 1"
    assert trim("x = 1", LINE_STOPS) == "x = 1"


def test_quick_takes_every_eighth_and_limit_the_first():
    assert [p["task_id"] for p in select(PROBLEMS, True, 2)] == ["HumanEval/0", "HumanEval/8"]
    assert len(select(PROBLEMS, True, None)) == 21
    assert len(select(PROBLEMS, False, 3)) == 3


def test_line_cases_skip_blank_lines_and_refill_to_the_canonical_program():
    problem = PROBLEMS[0]  # its solution has a blank line before `return False`
    cases = line_cases(problem)
    lines = problem["canonical_solution"].splitlines()
    assert [c.line for c in cases] == [i for i, line in enumerate(lines) if line.strip()]
    for case in cases:
        assert case.prefix.startswith(problem["prompt"]) and case.suffix.startswith("\n")
        assert case.filled(problem, case.target).startswith(
            program(problem, problem["canonical_solution"])[: len(case.prefix)]
        )
    assert run_program(cases[2].filled(problem, cases[2].target), 20).passed


def test_line_scores():
    scores = line_scores([("  x = 1 ", "x = 1"), ("abcd", "abce")])
    assert scores["exact"] == 1 and scores["exact_match"] == 0.5
    assert scores["edit_similarity"] == pytest.approx((1 + 0.75) / 2)


def test_a_refused_suffix_skips_infilling_saying_why():
    assert refuses_suffix(400, "`suffix` asks for fill-in-the-middle, but this model's ...")
    assert not refuses_suffix(400, "max_tokens must be positive")

    class NoFim:
        def complete(self, request: Request) -> Answer:
            raise FimUnsupportedError("this model's tokenizer has no fill-in-the-middle tokens")

    section = infill(PROBLEMS[:1], line_cases(PROBLEMS[0]), [], NoFim(), Budget(None), Settings())
    assert section["status"] == "skipped" and "fill-in-the-middle" in section["reason"]


@pytest.fixture(scope="module")
def api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    """The API in front of the test server, as `make api` runs it."""
    settings = ApiSettings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)
    with ApiServer(settings) as running:
        yield running


@pytest.mark.timeout(480)
def test_a_run_scores_every_section_and_compares_the_backends(api, tiny_checkpoint, tmp_path):
    out = tmp_path / "results"
    argv = ["--url", f"{api.url}/v1", "--checkpoint", str(tiny_checkpoint), "--limit", "3"]
    assert main([*argv, "--out", str(out), "--timeout", "5", "--server-settings", "x"]) == 0
    (folder,) = out.iterdir()
    data = json.loads((folder / "report.json").read_text())
    markdown = (folder / "report.md").read_text()
    for heading in (
        "## Setup",
        "## HumanEval pass@1",
        "## Next-line accuracy",
        "## Single-line infilling",
    ):
        assert heading in markdown
    assert data["model"]["model_type"] == "gptj" and data["model"]["parameters"] > 0
    assert data["machine"]["cores"] and data["server"]["url"] == f"{api.url}/v1"
    assert data["server"]["engine"]["backend"] == "torch"  # read from Triton, not told
    assert data["sandbox"] == {"passed": 3, "total": 3, "pass_at_1": 1.0, "failed": []}

    humaneval = data["humaneval"]
    assert humaneval["served"]["total"] == humaneval["transformers"]["total"] == 3
    assert humaneval["compared"] == 3 and not humaneval["errors"]
    assert [p["task_id"] for p in humaneval["problems"]] == [
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/2",
    ]
    for row in humaneval["problems"]:
        assert row["served"]["result"] and row["transformers"]["result"]
    # greedy float32 on the torch engine: the served completions are transformers' own
    assert humaneval["mismatches"] == [], markdown

    lines = data["next_line"]
    cases = sum(len(line_cases(p)) for p in PROBLEMS[:3])
    assert lines["served"]["lines"] == lines["transformers"]["lines"] == cases
    assert lines["compared"] == cases and not lines["errors"]
    assert lines["mismatches"] == [], markdown
    assert 0 <= lines["served"]["edit_similarity"] <= 1

    filled = data["infill"]
    assert filled["status"] == "ok", filled.get("reason")  # the project's model has FIM tokens
    assert filled["with_suffix"]["total"] == filled["prefix_only"]["total"] == cases
    assert not filled["errors"]
    assert Path(folder / "report.md").stat().st_size > 0


def test_the_fim_boundary_probe_heals_the_prefix_end_inside_the_layout(tiny_checkpoint):
    """`python -m evaluation.fim_boundary`: a prefix ending inside a longer token (``re``) is
    held back and its middle written after it; a prefix ending at a token nothing extends
    (the tiny vocabulary's newline) is the same request both ways."""
    from evaluation.fim_boundary import middles
    from evaluation.local import LocalModel
    from preprocessing.tokenize import Preprocessor

    pre, local = Preprocessor(tiny_checkpoint), LocalModel(tiny_checkpoint)
    assert pre.fim is not None
    assert pre.extensions.heals(pre.encode("def f(x):\n    re")[-1])
    whole, healed, held = middles(local, pre, "def f(x):\n    re", "\n", 6)
    assert held and "\n" not in whole and "\n" not in healed
    assert not pre.extensions.heals(pre.encode("x = 1\n")[-1])
    whole, healed, held = middles(local, pre, "x = 1\n", "\n", 6)
    assert not held and whole == healed


def test_a_mid_line_cursor_cuts_after_the_indentation_and_half_the_text():
    from evaluation.fim_boundary import mid_line
    from evaluation.problems import LineCase

    case = LineCase("HumanEval/0", 0, "def f(x):\n", "    return x", "\n")
    mid = mid_line(case)
    assert (mid.prefix, mid.target) == ("def f(x):\n    retu", "rn x")
    assert mid.prefix + mid.target + mid.suffix == case.prefix + case.target + case.suffix


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path):
    from evaluation.__main__ import new_folder

    first, second = new_folder(tmp_path), new_folder(tmp_path)
    assert first != second and first.is_dir() and second.is_dir()
