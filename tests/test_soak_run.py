"""The soak's run (``python -m loadtest.soak``), in processes of their own: its modules
import Locust, which patches the process with gevent. One very short real soak against the
session's server (found running, so never drilled), and an editor phase that cannot start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from loadtest.soak import cases as c
from loadtest.soak import checks
from loadtest.soak.plan import DRAIN, SOAK
from loadtest.soak.plan import EDITOR as EDITOR_STAGE


def test_an_editor_phase_that_cannot_start_is_a_failed_check_not_a_crash(tmp_path):
    """Without the checkpoint's tokenizer the phase reports why (in a process of its own: the
    phase's module imports Locust, which patches the process with gevent)."""
    code = (
        "import json, sys; from loadtest.soak.run import parse_args; "
        "from loadtest.soak.users import editor_phase; "
        "print(json.dumps(editor_phase(parse_args(sys.argv[1:]), None)))"
    )
    argv = ["--model-repository", str(tmp_path), "--out", str(tmp_path / "out")]
    run = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    phase = json.loads(run.stdout.splitlines()[-1])
    assert not phase["done"] and "no tokenizer" in phase["error"]
    assert checks.editor_check(phase).status == checks.FAIL


def test_a_short_real_soak_accounts_for_everything(server, model_repository, tmp_path: Path):
    """Four clients for a few seconds, weighted towards the invalid and hostile cases so that
    every one of them is sent; the server was found running, so there is no drill. The soak
    runs Locust, which patches its process with gevent: it runs in a process of its own."""
    out = tmp_path / "soak"
    mix = "unary_grpc=2,unary_http=2,stream=2,vanish_stream=1,vanish_unary=2,invalid=10,hostile=9"
    command = [
        sys.executable,
        "-m",
        "loadtest.soak",
        "--host",
        server.http_url,
        "--grpc-url",
        server.grpc_url,
        "--metrics-url",
        server.metrics_url,
        "--model-repository",
        str(model_repository),
        "--saturation",
        "2",
        "--duration",
        "20",
        "--mix",
        mix,
        "--max-tokens",
        "8",
        "--long-tokens",
        "96",
        "--prompt-chars",
        "150",
        "--rss-every",
        "1",
        "--editor-duration",
        "8",
        "--editor-typists",
        "2",
        # the bound real runs use is 5 s; a test may not depend on the machine's speed, so
        # it checks that the stall is measured, with a bound no healthy run comes near
        "--max-stall",
        "120",
        "--out",
        str(out),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    total = summary["total"]
    assert total["unanswered"] == 0
    assert total["sent"] == total["ok"] + total["rejected"] + total["abandoned"] > 0
    invalid = [row for row in summary["cases"] if row["kind"] == c.INVALID]
    assert {row["case"] for row in invalid} == {case.name for case in c.INVALID_CASES}
    for case in invalid:
        assert case["as expected"] == case["sent"], case  # rejected, naming the option
    found = {row["name"]: row["status"] for row in summary["checks"]}
    assert found["stub-kill drill"] == "SKIP"  # a server the soak did not start
    assert found["engine idle after the drain"] == checks.PASS
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert set(c.ALL_KINDS) | {"all"} >= {k["kind"] for k in summary["kinds"]}
    editor = {k["kind"]: k for k in summary["kinds"]}[c.EDITOR]
    assert editor["sent"] >= 2 and editor["unexpected"] == 0, editor  # answered or abandoned
    assert found["editor requests answered or abandoned"] == checks.PASS
    assert found["no stall over max(120 s, 8 lone requests)"] == checks.PASS
    assert [s["phase"] for s in summary["stalls"]] == ["soak", "editor"]
    assert [p[0] for p in summary["phases"]] == [SOAK, EDITOR_STAGE, DRAIN]
    events = pd.read_csv(out / "events.csv")
    assert len(events) == sum(k["sent"] for k in summary["kinds"][:-1])
    assert "## Editor phase" in (out / "report.md").read_text()
    assert "soak passed" in run.stdout
