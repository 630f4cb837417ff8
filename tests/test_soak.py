"""The soak (``make soak``): its pure parts without a server (error classification of real
Triton error texts, the accounting, the flatness check, the report), then one very short real
soak against the session's server (found running, so never drilled)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, MAX_WORDS_PER_LIST
from loadtest.soak import checks
from loadtest.soak.cases import (
    ABANDONED,
    ALL_KINDS,
    CANCELLED,
    CASES,
    EDITOR,
    HOSTILE,
    HOSTILE_CASES,
    HOSTILE_TRANSPORTS,
    INVALID,
    INVALID_CASES,
    INVALID_TRANSPORTS,
    OK,
    QUEUE_FULL,
    REJECTED,
    STREAM,
    TIMEOUT,
    UNANSWERED,
    UNARY_GRPC,
    UNAVAILABLE,
    UNCLEAR,
    VALIDATION,
    VANISH_UNARY,
    Rotation,
    Schedule,
    classify_error,
    judge,
    named_option,
    parse_mix,
    raw_tensors,
)
from loadtest.soak.checks import (
    FAIL,
    PASS,
    Check,
    Stall,
    longest_stall,
    rss_flatness,
    stall_bound,
    stall_check,
)
from loadtest.soak.editor_phase import editor_check
from loadtest.soak.plan import DRAIN, RAMP, SOAK, SoakPlan
from loadtest.soak.plan import EDITOR as EDITOR_STAGE
from loadtest.soak.report import write_run
from loadtest.soak.send import Outcome, Requests
from loadtest.soak.server import Sample, Sampler
from reporting.events import EventLog

# Error texts as this Triton (2.51, python backend) and tritonclient really produce them.
REAL_ERRORS = {
    "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5": (
        VALIDATION,
        "runtime_top_p",
    ),
    "in ensemble 'ensemble', INPUT_0 row 0 is an empty prompt: send text to complete": (
        VALIDATION,
        "INPUT_0",
    ),
    "in ensemble 'ensemble', prompt (163840 tokens) + request_output_len (32) = 163872 exceeds "
    "the model's context of 512 tokens; shorten the prompt or ask for fewer tokens": (
        VALIDATION,
        "request_output_len",
    ),
    "in ensemble 'ensemble', INPUT_3 (stop words) of row 0 has 65 words, over the limit of 64": (
        VALIDATION,
        "INPUT_3",
    ),
    "in ensemble 'ensemble', beam_width=64 is over this server's limit of 8 (max_beam_width in "
    "engine/config.pbtxt); ask for fewer beams": (VALIDATION, "beam_width"),
    "in ensemble 'ensemble', Stub process 'gptj_0_0' is not healthy.": (UNAVAILABLE, None),
    "Exceeds maximum queue size": (QUEUE_FULL, None),
    "Request timeout expired": (TIMEOUT, None),
    "Deadline Exceeded": (TIMEOUT, None),
    "cancelled: the client went away or its timeout passed": (CANCELLED, None),
    "Locally cancelled by application!": (CANCELLED, None),
    "no Triton server answers at grpc://127.0.0.1:1 (connection refused); start one with "
    "`make triton` (HTTP on port 8000, gRPC on 8001) or point the client at yours": (
        UNAVAILABLE,
        None,
    ),
    "Request for unknown model: 'gptj' is not found": (UNAVAILABLE, None),
    # a drill's probes while the launcher stops the server (tritonclient.http, a gRPC stream)
    "HTTPConnectionClosed: connection closed.": (UNAVAILABLE, None),
    "[request id: codegen-stream-9b03] Server is stopping, scheduler for model has stopped "
    "accepting new inference requests": (UNAVAILABLE, None),
    "the server said something new": (UNCLEAR, None),
}


@pytest.mark.parametrize("message", list(REAL_ERRORS))
def test_real_error_texts_are_classified(message):
    category, option = REAL_ERRORS[message]
    assert classify_error(message) == category
    if option:
        assert named_option(message) == option


def test_a_dead_stub_is_never_taken_for_a_bad_option():
    message = "in ensemble 'ensemble', Stub process 'gptj_0_0' is not healthy."
    assert classify_error(message) == UNAVAILABLE
    assert not judge(INVALID, "top_p_1.5", REJECTED, UNAVAILABLE, message)


def test_verdicts():
    named = "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5"
    assert judge(INVALID, "top_p_1.5", REJECTED, VALIDATION, named)
    assert not judge(INVALID, "top_p_1.5", OK, "", "")  # an invalid request answered
    assert not judge(INVALID, "top_p_1.5", REJECTED, VALIDATION, "temperature must be >= 0")
    assert judge(HOSTILE, "many_bad_words", OK, "", "")  # legal: must be answered
    # ... or refused by a backend that cannot honour it, naming the option; never otherwise
    no_bad_words = "bad_words_list is not supported by the openvino backend"
    assert judge(HOSTILE, "many_bad_words", REJECTED, VALIDATION, no_bad_words)
    assert not judge(HOSTILE, "many_bad_words", REJECTED, VALIDATION, "temperature must be > 0")
    assert not judge(HOSTILE, "many_bad_words", REJECTED, UNAVAILABLE, no_bad_words)
    too_small = "temperature 1e-30 is too small to sample with (it overflows the logits)"
    assert judge(HOSTILE, "tiny_temperature", REJECTED, VALIDATION, too_small)
    assert not judge(HOSTILE, "tiny_temperature", OK, "", "")
    assert judge(UNARY_GRPC, "", OK, "", "")
    assert judge(UNARY_GRPC, "", REJECTED, QUEUE_FULL, "Exceeds maximum queue size")
    assert not judge(UNARY_GRPC, "", REJECTED, VALIDATION, named)
    assert judge(VANISH_UNARY, "", ABANDONED, "", "")
    assert not judge(STREAM, "", UNANSWERED, "", "")


def test_every_raw_case_builds_tensors_that_skip_the_client_check():
    base = CompletionRequest("def f(x):\n", max_tokens=8)
    for case in CASES.values():
        tensors = raw_tensors(case, base, context=512)
        assert set(base.tensors()) <= set(tensors)
        for name, array in tensors.items():
            assert array.shape == (1, 1), (case.name, name)
            assert array.dtype == base.tensors()[name].dtype, (case.name, name)
    cap = raw_tensors(CASES["prompt_at_byte_cap"], base, 512)["INPUT_0"][0, 0]
    assert len(cap) == MAX_PROMPT_BYTES
    assert np.isnan(raw_tensors(CASES["temperature_nan"], base, 512)["temperature"][0, 0])
    too_many = raw_tensors(CASES["too_many_stop_words"], base, 512)["INPUT_3"][0, 0]
    assert len(too_many.split(b",")) == MAX_WORDS_PER_LIST + 1
    assert all(c.must_reject for c in INVALID_CASES)


def test_schedule_keeps_the_mix_and_rotation_covers_every_case_and_transport():
    mix = parse_mix("unary_grpc=5,invalid=3,hostile=2")
    schedule = Schedule(mix)
    picked = [schedule.next() for _ in range(100)]
    assert picked.count(UNARY_GRPC) == 50 and picked.count(INVALID) == 30
    assert set(picked[:10]) == {UNARY_GRPC, INVALID, HOSTILE}  # all within one cycle
    rotation = Rotation()
    sent = {rotation.next(INVALID) for _ in range(len(INVALID_CASES) * len(INVALID_TRANSPORTS))}
    assert len(sent) == len(INVALID_CASES) * len(INVALID_TRANSPORTS)
    sent = {rotation.next(HOSTILE) for _ in range(len(HOSTILE_CASES) * len(HOSTILE_TRANSPORTS))}
    assert len(sent) == len(HOSTILE_CASES) * len(HOSTILE_TRANSPORTS)
    with pytest.raises(ValueError, match="unknown kind"):
        parse_mix("bogus=1")
    with pytest.raises(ValueError, match="nothing to send"):
        parse_mix("invalid=0")


def events_of_a_run() -> tuple[EventLog, Requests]:
    """Requests ended through the soak's event hook into an event table, one left in flight."""
    log = EventLog(profile="soak")
    requests = Requests(SimpleNamespace(request=SimpleNamespace(fire=log.on_request)))
    requests.window = "soak"
    ends = [
        (UNARY_GRPC, "", OK, "", ""),
        (UNARY_GRPC, "", REJECTED, QUEUE_FULL, "Exceeds maximum queue size"),
        (STREAM, "", OK, "", ""),
        (VANISH_UNARY, "", ABANDONED, "", "client timeout passed (on purpose)"),
        (INVALID, "top_p_1.5", REJECTED, VALIDATION,
         "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5"),
        (INVALID, "empty_prompt", OK, "", ""),  # the server accepted an invalid request
    ]  # fmt: skip
    for kind, case, status, category, message in ends:
        requests.end(requests.begin(kind, case, "grpc"), Outcome(status, category, message))
    requests.begin(UNARY_GRPC, "", "http")  # never ends
    return log, requests


def test_every_request_is_accounted_for_and_leftovers_are_unanswered():
    log, requests = events_of_a_run()
    assert requests.close("still in flight") == 1
    frame = log.frame()
    assert len(frame) == requests.sent == 7 and not requests.in_flight
    assert set(frame["outcome"]) == {"ok", "shed", "abandoned", "error"}
    table = checks.kinds(frame)
    total = table.iloc[-1]
    assert (total["ok"], total["abandoned"], total["unanswered"]) == (3, 1, 1)
    assert total["rejected"] == "validation 1, queue_full 1"
    grpc = table[table["kind"] == UNARY_GRPC].iloc[0]
    assert (grpc["sent"], grpc["unanswered"], grpc["unexpected"]) == (3, 1, 1)
    found = {c.name: c.status for c in checks.accounting_checks(table, 7, len(frame))}
    assert found["every request accounted for"] == PASS
    assert found["nothing unanswered"] == FAIL
    assert found["every error classified"] == PASS
    lost = {c.name: c.status for c in checks.accounting_checks(table, 8, len(frame))}
    assert lost["every request accounted for"] == FAIL  # one sent and never reported
    cases = checks.cases(frame).set_index("case")
    assert cases.loc["top_p_1.5", "as expected"] == 1 and cases.loc["empty_prompt", "sent"] == 1
    assert cases.loc["empty_prompt", "as expected"] == 0
    assert checks.case_check(cases.reset_index(), INVALID).status == FAIL
    errors = checks.error_messages(frame)
    assert errors["count"].tolist() == [1, 1, 1]


def test_an_error_text_no_category_matches_is_a_warning_counted_per_request():
    log, requests = events_of_a_run()
    for _ in range(2):
        ticket = requests.begin(UNARY_GRPC, "", "grpc")
        requests.end(ticket, Outcome(REJECTED, UNCLEAR, "the server said something new"))
    requests.close("still in flight")
    table = checks.kinds(log.frame())
    found = {c.name: c for c in checks.accounting_checks(table, 9, 9)}
    assert found["every error classified"].status == "WARN"
    assert found["every error classified"].detail.startswith("2 error text(s)")


def _rows(*requests: tuple) -> pd.DataFrame:
    """(started_s, latency_s or None when unanswered, status, first token s) as table rows."""
    return pd.DataFrame(
        [
            {"started_s": t, "latency_ms": (lat or 0) * 1000, "status": st,
             "first_token_ms": None if ft is None else ft * 1000}
            for t, lat, st, ft in ((*r, None)[:4] if len(r) == 3 else r for r in requests)
        ]
    )  # fmt: skip


def test_the_longest_stall_counts_only_time_with_requests_in_flight():
    rows = _rows(
        (0.0, 1.0, OK),  # answered at 1
        (2.0, 3.0, ABANDONED),  # in flight 2..5, no text: no progress
        (4.0, 4.0, ABANDONED, 3.5),  # first text at 7.5: progress
        (20.0, 2.0, OK),  # answered at 22; nothing in flight from 8 to 20
    )
    stall = longest_stall("editor", rows, 0.0, 30.0)
    # in flight: 0..1, 2..8, 20..22; between progress events (edges 0, 1, 7.5, 22, 30) that
    # is 1, then 5.5 (2..7.5), then 2.5 (7.5..8 and 20..22), then 0
    assert stall.seconds == pytest.approx(5.5) and stall.at_s == 1.0
    assert stall.progress_events == 3
    assert longest_stall("soak", _rows(), 0.0, 10.0).seconds == 0
    # a request that never ended stalls until the phase's end
    frozen = longest_stall("soak", _rows((0.0, 1.0, OK), (2.0, None, UNANSWERED)), 0.0, 60.0)
    assert frozen.seconds == pytest.approx(58.0)


def test_the_stall_check_fails_over_its_bound():
    ok, frozen = Stall("soak", 1.2, 3.0, 50, bound_s=5.0), Stall("editor", 7.5, 40.0, 12)
    assert stall_check([ok], 5.0).status == PASS
    failed = stall_check([ok, frozen], 5.0)
    assert failed.status == FAIL and "editor: 7.5 s from t=40 s" in failed.detail


def test_the_stall_bound_scales_to_a_machine_too_slow_for_it():
    assert stall_bound(5.0, None) == 5.0 and stall_bound(5.0, 0.2) == 5.0
    assert stall_bound(5.0, 2.0) == 8 * 2.0  # one request alone takes 2 s here
    rows = _rows((0.0, 1.0, OK), (1.0, 12.0, OK), (13.0, 1.0, OK))  # a 12 s gap at 1..13
    slow = longest_stall("soak", rows, 0.0, 14.0, 5.0, reference_s=2.0)
    assert slow.seconds == pytest.approx(12.0) and slow.bound_s == 16.0
    assert stall_check([slow], 5.0).status == PASS
    assert "a request alone took 2.00 s" in stall_check([slow], 5.0).detail
    fast = longest_stall("soak", rows, 0.0, 14.0, 5.0, reference_s=0.5)
    assert fast.bound_s == 5.0 and stall_check([fast], 5.0).status == FAIL


def test_the_plan_ramps_until_throughput_stops_rising_then_soaks_at_twice_it():
    done = {"n": 0}
    plan = SoakPlan(30.0, completed=lambda t: done["n"], saturation=None, ramp_step_s=4.0,
                    ramp_gain=0.1, ramp_patience=2, max_clients=32)  # fmt: skip
    rates = {1: 4, 2: 8, 4: 8, 8: 8}  # requests per level's window: flat from 2 clients
    now, users = 0.0, []
    while (step := plan.tick(now)) and step[1] == RAMP:
        users.append(step[0])
        done["n"] = rates[step[0]] if plan.window else 0
        now += 1.0
    assert sorted(set(users)) == [1, 2, 4, 8] and plan.saturation == 2
    assert [s["clients"] for s in plan.steps] == [1, 2, 4, 8]
    assert "stopped rising at 2 clients" in plan.note
    assert step == (4, SOAK)
    assert plan.tick(now + 29.0) == (4, SOAK)
    assert plan.tick(now + 31.0) == (0, EDITOR_STAGE)  # the run drives it, with no users
    assert plan.tick(now + 500.0) == (0, EDITOR_STAGE)
    plan.finish(EDITOR_STAGE, now + 600.0)
    assert plan.tick(now + 601.0) == (0, DRAIN)
    plan.finish(DRAIN, now + 602.0)
    assert plan.tick(now + 603.0) is None and plan.stage is None
    assert [n for n, _, _ in plan.stages] == [RAMP, SOAK, EDITOR_STAGE, DRAIN]
    given = SoakPlan(10.0, completed=lambda t: 0, saturation=3)
    assert given.tick(0.0) == (6, SOAK) and given.summary()["note"] == "given (--saturation)"


def test_editor_requests_must_be_answered_or_abandoned():
    assert judge(EDITOR, "", OK, "", "") and judge(EDITOR, "", ABANDONED, "", "")
    assert not judge(EDITOR, "", REJECTED, QUEUE_FULL, "Exceeds maximum queue size")
    assert not judge(EDITOR, "", UNANSWERED, "", "")
    figures = {
        "requests": 10,
        "answered": 3,
        "abandoned": 6,
        "errors": 1,
        "first_token_ms": {"p50": 90.0, "p95": 200.0},
    }
    phase = {
        "done": True,
        "figures": figures,
        "typist_failures": [],
        "stuck_typists": 0,
        "suffix": {"send": False, "requested": True},
    }
    check = editor_check(phase)
    assert check.status == FAIL and "1 failed" in check.detail and "PREFIX-ONLY" in check.detail
    assert editor_check({**phase, "figures": {**figures, "errors": 0}}).status == PASS
    assert editor_check({"done": False, "error": "no answer"}).status == FAIL
    assert editor_check({"done": False, "note": "skipped"}).status == "SKIP"


def test_an_editor_phase_that_cannot_start_is_a_failed_check_not_a_crash(tmp_path):
    from loadtest.soak.editor_phase import run_editor_phase
    from loadtest.soak.settings import parse_args

    settings = parse_args(["--model-repository", str(tmp_path), "--out", str(tmp_path / "out")])
    _, _, phase = run_editor_phase(settings, Requests(None), SimpleNamespace(phase=""))
    assert not phase["done"] and "no tokenizer" in phase["error"]
    assert editor_check(phase).status == FAIL


def test_flatness_check():
    mib = 2**20
    flat = rss_flatness(
        [1000 * mib, 1010 * mib, 990 * mib, 1005 * mib, 1000 * mib, 1020 * mib], 0.1
    )
    assert flat.flat and abs(flat.growth) < 0.02
    leak = rss_flatness([1000 * mib + i * 50 * mib for i in range(9)], 0.1)
    assert leak.flat is False and leak.growth > 0.1 and "growing" in leak.note
    assert rss_flatness([mib] * 3, 0.1).flat is None


def test_the_report_is_written(tmp_path):
    log, requests = events_of_a_run()
    requests.close("still in flight")
    frame = log.frame()
    samples = [Sample(float(t), "soak", (500 + t) * 2**20, 4, None, None, None)
               for t in range(0, 20, 2)]  # fmt: skip
    result = {
        "started_at": "2026-01-01T00:00:00",
        "wall_s": 20.0,
        "settings": {"clients": 4, "duration_s": 20.0, "max_tokens": 8, "deadline_s": 60.0,
                     "machine": "test", "max_stall_s": 5.0},
        "server": {"description": "test"},
        "saturation": {"clients": 2, "steps": [], "note": "given"},
        "rss": rss_flatness([s.rss_bytes for s in samples], 0.1),
        "rss_note": "",
        "drain": {"ready_after_soak": "200"},
        "engine": {"kv_cache_bytes": "not exported"},
        "drill": {"done": False, "note": "skipped"},
        "editor": {"done": False, "note": "skipped"},
        "stalls": [Stall("soak", 1.2, 3.0, 50, bound_s=5.0)],
        "checks": [Check("nothing unanswered", FAIL, "1 request(s)")],
    }  # fmt: skip
    paths = write_run(tmp_path, result, frame, samples, [("soak", 0.0, 20.0)])
    assert {p.name for p in paths} >= {"summary.json", "report.md", "soak.png", "samples.csv"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] is True and summary["kinds"][-1]["sent"] == 7
    report = (tmp_path / "report.md").read_text()
    assert "| nothing unanswered | FAIL " in report and "runtime_top_p must be" in report
    assert "soak: 1.2 s from t=3 s (50 progress events; bound 5 s)" in report
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert len((tmp_path / "samples.csv").read_text().splitlines()) == 11


def test_a_short_real_soak_accounts_for_everything(server, model_repository, tmp_path: Path):
    """Four clients for a few seconds, weighted towards the invalid and hostile cases so that
    every one of them is sent; the server was found running, so there is no drill. The soak
    runs Locust, which patches its process with gevent: it runs in a process of its own."""
    out = tmp_path / "soak"
    mix = "unary_grpc=2,unary_http=2,stream=2,vanish_stream=1,vanish_unary=2,invalid=10,hostile=9"
    command = [
        sys.executable, "-m", "loadtest.soak", "--host", server.http_url, "--grpc-url",
        server.grpc_url, "--metrics-url", server.metrics_url, "--model-repository",
        str(model_repository), "--saturation", "2", "--duration", "20", "--mix", mix,
        "--max-tokens", "8", "--long-tokens", "96", "--prompt-chars", "150", "--rss-every", "1",
        "--progress-every", "5", "--editor-duration", "8", "--editor-typists", "2",
        # the bound real runs use is 5 s; a test may not depend on the machine's speed, so
        # it checks that the stall is measured, with a bound no healthy run comes near
        "--max-stall", "120", "--out", str(out),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    total = summary["total"]
    assert total["unanswered"] == 0
    assert total["sent"] == total["ok"] + total["rejected"] + total["abandoned"] > 0
    invalid = [c for c in summary["cases"] if c["kind"] == INVALID]
    assert {c["case"] for c in invalid} == {c.name for c in INVALID_CASES}, "not all sent"
    for case in invalid:
        assert case["as expected"] == case["sent"], case  # rejected, naming the option
    found = {c["name"]: c["status"] for c in summary["checks"]}
    assert found["stub-kill drill"] == "SKIP"  # a server the soak did not start
    assert found["engine idle after the drain"] == PASS
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert set(ALL_KINDS) | {"all"} >= {k["kind"] for k in summary["kinds"]}
    editor = {k["kind"]: k for k in summary["kinds"]}[EDITOR]
    assert editor["sent"] >= 2 and editor["unexpected"] == 0, editor  # answered or abandoned
    assert found["editor requests answered or abandoned"] == PASS
    assert found["no stall over max(120 s, 8 lone requests)"] == PASS
    assert [s["phase"] for s in summary["stalls"]] == ["soak", "editor"]
    assert [p[0] for p in summary["phases"]] == [SOAK, EDITOR_STAGE, DRAIN]
    events = pd.read_csv(out / "events.csv")
    assert len(events) == sum(k["sent"] for k in summary["kinds"][:-1])
    assert "## Editor phase" in (out / "report.md").read_text()
    assert "soak passed" in run.stdout


def test_the_sampler_says_what_the_engine_did_during_a_stall():
    sampler = Sampler(SimpleNamespace(), clock=lambda: 0.0, every=1.0)
    sampler.samples = [
        Sample(10.0, "editor", None, 0, 100.0, 0.0, 0.0),
        Sample(11.0, "editor", None, 0, 100.0, 0.0, 37.0),  # requests pending, no steps
        Sample(20.0, "editor", None, 0, 100.0, 0.0, 37.0),
    ]
    assert sampler.during(10.0, 20.0) == (
        "0 steps in 10 s, up to 0 sequences running and 37 requests pending in Triton"
    )
    assert sampler.during(30.0, 40.0) == ""
