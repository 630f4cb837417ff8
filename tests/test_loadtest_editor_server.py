"""The editor profile against the real test server, over both protocols: a short run whose
books must balance, and a run whose pauses are too short for any answer, so that every request
is abandoned by construction (whatever the machine's speed) and the server must still answer
normally afterwards; and the cache-on/off comparison, whose two halves run on servers it
starts itself from the openvino repository."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from serving.paths import REPO_ROOT

OUTCOMES = ("answered", "abandoned", "error")


def _run(server, tmp_path, protocol: str, *extra: str) -> dict:
    out = tmp_path / protocol
    command = [
        sys.executable,
        "-m",
        "loadtest.editor",
        "--protocol",
        protocol,
        "--typists",
        "2",
        "--duration",
        "8",
        "--host",
        server.http_url,
        "--grpc-url",
        server.grpc_url,
        "--metrics-url",
        server.metrics_url,
        "--model-repository",
        str(server.model_repository),
        "--out",
        str(out),
        "--no-compare",
        "--drill",
        "2",
        *extra,
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    print(done.stdout[-5000:], done.stderr[-5000:], sep="\n")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    summary["stdout"] = done.stdout
    summary["report"] = (out / "report.md").read_text()
    return summary


SINGLE = "as configured"


@pytest.mark.parametrize("protocol", ["grpc", "openai"])
def test_a_short_run_balances_its_books(server, tmp_path, protocol):
    summary = _run(server, tmp_path, protocol, "--no-one-line")
    f = summary["figures"][SINGLE]
    # every typist pauses within its first burst (12 keystrokes of at most 0.25 s)
    assert f["requests"] >= 2
    assert f["errors"] == 0, summary["report"]
    assert f["answered"] + f["abandoned"] == f["requests"]
    # the engine finished or dropped every request that reached it, and generated at least
    # what the typists read (the counters were read after the server drained)
    assert f["answered"] <= f["sequences"] <= f["requests"]
    assert f["tokens generated"] >= f["tokens delivered"] > 0 or not f["answered"]
    assert summary["afters"][SINGLE].startswith("answered")
    # every request is a row of the one event table, stamped with its system and window
    events = pd.read_csv(tmp_path / protocol / "events.csv")
    typed, resent = events[events["name"] != "resent"], events[events["name"] == "resent"]
    assert len(typed) == f["requests"] and set(events["system"]) == {SINGLE}
    assert set(typed["window"]) == {"0", "1"} and set(events["profile"]) == {"editor"}
    # the resend probe: 8 warm requests after the typing, each read to its end
    assert len(resent) == 8 and set(resent["outcome"]) == {"ok"}, resent
    assert f["resent +3 chars: first token p50 ms"] > 0
    # the drill: two long completions left at their first piece, after the typing
    drill = summary["drills"][SINGLE]
    assert drill["requests"] == 2 and drill["errors"] == 0, drill
    assert drill["abandoned"] + drill["answered"] == 2
    assert drill["generated"] >= drill["tokens_read"] > 0
    assert "Abandonment drill" in summary["report"]
    assert f"editor {SINGLE} window" in summary["stdout"] and "first token p50" in summary["stdout"]
    # a server without fill-in-the-middle refuses the suffix: then the run says so loudly
    suffix = summary["suffix"]
    if suffix["refused"]:
        assert "PREFIX-ONLY" in summary["stdout"] and "**SUFFIX REFUSED" in summary["report"]
    else:
        assert suffix["send"] and events["suffix_tokens"].sum() > 0


@pytest.mark.parametrize("protocol", ["grpc", "openai"])
def test_requests_abandoned_at_once_leave_the_server_answering(server, tmp_path, protocol):
    # 400 tokens cannot stream back within 10 ms: every request is abandoned
    summary = _run(
        server, tmp_path, protocol, "--pause", "0.005,0.01", "--max-tokens", "400", "--no-one-line"
    )
    f = summary["figures"][SINGLE]
    assert f["requests"] >= 2 and f["abandoned"] == f["requests"], f
    assert f["errors"] == 0 and f["answered"] == 0
    assert f["first token p50 ms"] is None and f["latency p95 ms"] is None
    assert summary["afters"][SINGLE].startswith("answered"), summary["afters"]
    assert summary["problems"] == []


def test_the_comparison_types_on_two_servers_it_starts_with_the_cache_on_and_off(
    openvino_model_repository, tmp_path
):
    out = tmp_path / "compare"
    command = [
        sys.executable,
        "-m",
        "loadtest.editor",
        "--protocol",
        "grpc",
        "--typists",
        "2",
        "--duration",
        "4",
        "--windows",
        "1",
        "--model-repository",
        str(openvino_model_repository),
        "--out",
        str(out),
        "--drill",
        "2",
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    print(done.stdout[-5000:], done.stderr[-5000:], sep="\n")
    # 0: every target met; 3: a target missed (on a tiny model the cache may not pay): both
    # are a run that completed; 1 or anything else is a broken run
    assert done.returncode in (0, 3), done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((out / "summary.json").read_text())
    verdicts = {t["name"]: t["verdict"] for t in data["targets"]}
    assert "first token, cache on / off" in verdicts and "past a stop" in verdicts
    assert verdicts["errors"] == "PASS" and verdicts["after the run"] == "PASS", data["targets"]
    assert all(v == "PASS" for v in verdicts.values()) == (done.returncode == 0)
    assert data["settings"]["order"] == ["cache-on", "cache-off"]
    for half, caching in (("cache-on", True), ("cache-off", False)):
        log = (out / half / "tritonserver.log").read_text()
        assert f"prefix cache {'on' if caching else 'off'}" in log
        assert data["figures"][half]["requests"] >= 2  # each typist pauses within a burst
        assert data["drills"][half]["requests"] == 2 and data["drills"][half]["errors"] == 0
        config = (out / half / "engine_config.pbtxt").read_text()
        assert f'"prefix_caching" value: {{ string_value: "{str(caching).lower()}" }}' in config
        # the one-line stop ended answers in the engine, and nothing was generated past it
        assert data["figures"][half]["tokens generated past a stop"] == 0
    # the repository copies were temporary: nothing of them is left in the run folder
    assert not list(out.rglob("model.py"))
    # with the cache off the engine keeps no index of blocks: nothing can be reused
    assert data["figures"]["cache-off"]["prompt-cache reuse share (at most)"] == 0
    assert data["figures"]["cache-on"]["prompt-cache reuse share (at most)"] is not None
    report = (out / "report.md").read_text()
    assert "cache-on / cache-off" in report and "load average" in report
    assert f"of {len(verdicts)} PASS" in report
