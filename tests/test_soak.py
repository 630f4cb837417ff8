"""The soak (``make soak``): its parts without a server or Locust (error classification of
real Triton error texts, the accounting, the stalls, the plan, the flatness check, the report);
the run itself is tests/test_soak_run.py's."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, MAX_WORDS_PER_LIST
from loadtest.soak import cases as c
from loadtest.soak import checks
from loadtest.soak.drill import SAMPLE_COLUMNS, Sampler
from loadtest.soak.plan import DRAIN, RAMP, SOAK, SoakPlan
from loadtest.soak.plan import EDITOR as EDITOR_STAGE
from loadtest.soak.report import write_run
from loadtest.soak.send import Outcome, Requests
from reporting.events import EventLog
from reporting.triton import EngineState

# Error texts as this Triton (2.51, python backend) and tritonclient really produce them.
E = "in ensemble 'ensemble', "
REAL_ERRORS = {
    E + "runtime_top_p must be in [0, 1], got 1.5": (c.VALIDATION, "runtime_top_p"),
    E + "INPUT_0 row 0 is an empty prompt: send text to complete": (c.VALIDATION, "INPUT_0"),
    E + "prompt (163840 tokens) + request_output_len (32) = 163872 exceeds the model's "
    "context of 512 tokens; shorten the prompt or ask for fewer tokens": (
        c.VALIDATION,
        "request_output_len",
    ),
    E + "INPUT_3 (stop words) of row 0 has 65 words, over the limit of 64": (
        c.VALIDATION,
        "INPUT_3",
    ),
    E + "beam_width=64 is over this server's limit of 8 (max_beam_width in "
    "engine/config.pbtxt); ask for fewer beams": (c.VALIDATION, "beam_width"),
    E + "Stub process 'gptj_0_0' is not healthy.": (c.UNAVAILABLE, None),
    "Exceeds maximum queue size": (c.QUEUE_FULL, None),
    "Request timeout expired": (c.TIMEOUT, None),
    "Deadline Exceeded": (c.TIMEOUT, None),
    "cancelled: the client went away or its timeout passed": (c.CANCELLED, None),
    "Locally cancelled by application!": (c.CANCELLED, None),
    "no Triton server answers at grpc://127.0.0.1:1 (connection refused); start one with "
    "`make triton` (HTTP on port 8000, gRPC on 8001) or point the client at yours": (
        c.UNAVAILABLE,
        None,
    ),
    "Request for unknown model: 'gptj' is not found": (c.UNAVAILABLE, None),
    # a drill's probes while the launcher stops the server (tritonclient.http, a gRPC stream)
    "HTTPConnectionClosed: connection closed.": (c.UNAVAILABLE, None),
    "[request id: codegen-stream-9b03] Server is stopping, scheduler for model has stopped "
    "accepting new inference requests": (c.UNAVAILABLE, None),
    "the server said something new": (c.UNCLEAR, None),
}


@pytest.mark.parametrize("message", list(REAL_ERRORS))
def test_real_error_texts_are_classified(message):
    category, option = REAL_ERRORS[message]
    assert c.classify_error(message) == category
    if option:
        assert c.named_option(message) == option


def test_a_dead_stub_is_never_taken_for_a_bad_option():
    message = "in ensemble 'ensemble', Stub process 'gptj_0_0' is not healthy."
    assert c.classify_error(message) == c.UNAVAILABLE
    assert not c.judge(c.INVALID, "top_p_1.5", c.REJECTED, c.UNAVAILABLE, message)


def test_verdicts():
    named = "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5"
    assert c.judge(c.INVALID, "top_p_1.5", c.REJECTED, c.VALIDATION, named)
    assert not c.judge(c.INVALID, "top_p_1.5", c.OK, "", "")  # an invalid request answered
    assert not c.judge(c.INVALID, "top_p_1.5", c.REJECTED, c.VALIDATION, "temperature must be >= 0")
    assert c.judge(c.HOSTILE, "many_bad_words", c.OK, "", "")  # legal: must be answered
    # ... or refused by a backend that cannot honour it, naming the option; never otherwise
    no_bad_words = "bad_words_list is not supported by the openvino backend"
    assert c.judge(c.HOSTILE, "many_bad_words", c.REJECTED, c.VALIDATION, no_bad_words)
    assert not c.judge(
        c.HOSTILE, "many_bad_words", c.REJECTED, c.VALIDATION, "temperature must be > 0"
    )
    assert not c.judge(c.HOSTILE, "many_bad_words", c.REJECTED, c.UNAVAILABLE, no_bad_words)
    too_small = "temperature 1e-30 is too small to sample with (it overflows the logits)"
    assert c.judge(c.HOSTILE, "tiny_temperature", c.REJECTED, c.VALIDATION, too_small)
    assert not c.judge(c.HOSTILE, "tiny_temperature", c.OK, "", "")
    assert c.judge(c.UNARY_GRPC, "", c.OK, "", "")
    assert c.judge(c.UNARY_GRPC, "", c.REJECTED, c.QUEUE_FULL, "Exceeds maximum queue size")
    assert not c.judge(c.UNARY_GRPC, "", c.REJECTED, c.VALIDATION, named)
    assert c.judge(c.VANISH_UNARY, "", c.ABANDONED, "", "")
    assert not c.judge(c.STREAM, "", c.UNANSWERED, "", "")


def test_every_raw_case_builds_tensors_that_skip_the_client_check():
    base = CompletionRequest("def f(x):\n", max_tokens=8)
    for case in c.CASES.values():
        tensors = c.raw_tensors(case, base, context=512)
        assert set(base.tensors()) <= set(tensors)
        for name, array in tensors.items():
            assert array.shape == (1, 1), (case.name, name)
            assert array.dtype == base.tensors()[name].dtype, (case.name, name)
    cap = c.raw_tensors(c.CASES["prompt_at_byte_cap"], base, 512)["INPUT_0"][0, 0]
    assert len(cap) == MAX_PROMPT_BYTES
    assert np.isnan(c.raw_tensors(c.CASES["temperature_nan"], base, 512)["temperature"][0, 0])
    too_many = c.raw_tensors(c.CASES["too_many_stop_words"], base, 512)["INPUT_3"][0, 0]
    assert len(too_many.split(b",")) == MAX_WORDS_PER_LIST + 1
    assert all(case.expect for case in c.INVALID_CASES)


def test_schedule_keeps_the_mix_and_rotation_covers_every_case_and_transport():
    schedule = c.schedule(c.parse_mix("unary_grpc=5,invalid=3,hostile=2"))
    picked = [next(schedule) for _ in range(100)]
    assert picked.count(c.UNARY_GRPC) == 50 and picked.count(c.INVALID) == 30
    assert set(picked[:10]) == {c.UNARY_GRPC, c.INVALID, c.HOSTILE}  # all within one cycle
    assert all(set(picked[i : i + 3]) != {c.UNARY_GRPC} for i in range(97))  # smooth: no 3 in a row
    for kind, cases in ((c.INVALID, c.INVALID_CASES), (c.HOSTILE, c.HOSTILE_CASES)):
        rotation, every = c.rotation(kind), len(cases) * len(c.TRANSPORTS[kind])
        assert len({next(rotation) for _ in range(every)}) == every
    with pytest.raises(ValueError, match="unknown kind"):
        c.parse_mix("bogus=1")
    with pytest.raises(ValueError, match="nothing to send"):
        c.parse_mix("invalid=0")


def events_of_a_run() -> tuple[EventLog, Requests]:
    """Requests ended through the soak's event hook into an event table, one left in flight."""
    log = EventLog(profile="soak")
    requests = Requests(SimpleNamespace(request=SimpleNamespace(fire=log.on_request)))
    requests.window = "soak"
    ends = [
        (c.UNARY_GRPC, "", c.OK, "", ""),
        (c.UNARY_GRPC, "", c.REJECTED, c.QUEUE_FULL, "Exceeds maximum queue size"),
        (c.STREAM, "", c.OK, "", ""),
        (c.VANISH_UNARY, "", c.ABANDONED, "", "client timeout passed (on purpose)"),
        (
            c.INVALID,
            "top_p_1.5",
            c.REJECTED,
            c.VALIDATION,
            "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5",
        ),
        (c.INVALID, "empty_prompt", c.OK, "", ""),  # the server accepted an invalid request
    ]
    for kind, case, status, category, message in ends:
        requests.end(requests.begin(kind, case, "grpc"), Outcome(status, category, message))
    requests.begin(c.UNARY_GRPC, "", "http")  # never ends
    return log, requests


def test_every_request_is_accounted_for_and_leftovers_are_unanswered():
    log, requests = events_of_a_run()
    assert requests.close("still in flight") == 1
    frame = checks.soak_rows(log.frame())
    assert len(frame) == requests.sent == 7 and not requests.in_flight
    assert set(frame["outcome"]) == {"ok", "shed", "abandoned", "error"}
    table = checks.kinds(frame)
    total = table.iloc[-1]
    assert (total["ok"], total["abandoned"], total["unanswered"]) == (3, 1, 1)
    assert total["rejected"] == "validation 1, queue_full 1"
    grpc = table[table["kind"] == c.UNARY_GRPC].iloc[0]
    assert (grpc["sent"], grpc["unanswered"], grpc["unexpected"]) == (3, 1, 1)
    found = {k.name: k.status for k in checks.accounting_checks(table, 7, len(frame))}
    assert found["every request accounted for"] == checks.PASS
    assert found["nothing unanswered"] == checks.FAIL
    assert found["every error classified"] == checks.PASS
    lost = {k.name: k.status for k in checks.accounting_checks(table, 8, len(frame))}
    assert lost["every request accounted for"] == checks.FAIL  # one sent and never reported
    cases = checks.cases(frame).set_index("case")
    assert cases.loc["top_p_1.5", "as expected"] == 1 and cases.loc["empty_prompt", "sent"] == 1
    assert cases.loc["empty_prompt", "as expected"] == 0
    assert checks.case_check(cases.reset_index(), c.INVALID).status == checks.FAIL
    errors = checks.error_messages(frame)
    assert errors["count"].tolist() == [1, 1, 1]


def test_an_error_text_no_category_matches_is_a_warning_counted_per_request():
    log, requests = events_of_a_run()
    for _ in range(2):
        ticket = requests.begin(c.UNARY_GRPC, "", "grpc")
        requests.end(ticket, Outcome(c.REJECTED, c.UNCLEAR, "the server said something new"))
    requests.close("still in flight")
    table = checks.kinds(checks.soak_rows(log.frame()))
    found = {k.name: k for k in checks.accounting_checks(table, 9, 9)}
    assert found["every error classified"].status == "WARN"
    assert found["every error classified"].detail.startswith("2 error text(s)")


def _rows(*requests: tuple) -> pd.DataFrame:
    """(started_s, latency_s or None when unanswered, status, first token s) as table rows."""
    return pd.DataFrame(
        [
            {
                "started_s": t,
                "latency_ms": (lat or 0) * 1000,
                "status": st,
                "first_token_ms": None if ft is None else ft * 1000,
            }
            for t, lat, st, ft in ((*r, None)[:4] if len(r) == 3 else r for r in requests)
        ]
    )


def test_the_longest_stall_counts_only_time_with_requests_in_flight():
    rows = _rows(
        (0.0, 1.0, c.OK),  # answered at 1
        (2.0, 3.0, c.ABANDONED),  # in flight 2..5, no text: no progress
        (4.0, 4.0, c.ABANDONED, 3.5),  # first text at 7.5: progress
        (20.0, 2.0, c.OK),  # answered at 22; nothing in flight from 8 to 20
    )
    stall = checks.longest_stall("editor", rows, 0.0, 30.0)
    # in flight: 0..1, 2..8, 20..22; between progress events (edges 0, 1, 7.5, 22, 30) that
    # is 1, then 5.5 (2..7.5), then 2.5 (7.5..8 and 20..22), then 0
    assert stall.seconds == pytest.approx(5.5) and stall.at_s == 1.0
    assert stall.progress_events == 3
    assert checks.longest_stall("soak", _rows(), 0.0, 10.0).seconds == 0
    # a request that never ended stalls until the phase's end
    frozen = checks.longest_stall(
        "soak", _rows((0.0, 1.0, c.OK), (2.0, None, c.UNANSWERED)), 0.0, 60.0
    )
    assert frozen.seconds == pytest.approx(58.0)


def test_the_stall_check_fails_over_its_bound():
    ok, frozen = (
        checks.Stall("soak", 1.2, 3.0, 50, bound_s=5.0),
        checks.Stall("editor", 7.5, 40.0, 12),
    )
    assert checks.stall_check([ok], 5.0).status == checks.PASS
    failed = checks.stall_check([ok, frozen], 5.0)
    assert failed.status == checks.FAIL and "editor: 7.5 s from t=40 s" in failed.detail


def test_the_stall_bound_scales_to_a_machine_too_slow_for_it():
    bound = {
        ref: checks.longest_stall("soak", _rows(), 0, 1, 5.0, ref).bound_s
        for ref in (None, 0.2, 2.0)
    }
    assert bound == {None: 5.0, 0.2: 5.0, 2.0: 8 * 2.0}  # one request alone takes 2 s here
    rows = _rows((0.0, 1.0, c.OK), (1.0, 12.0, c.OK), (13.0, 1.0, c.OK))  # a 12 s gap at 1..13
    slow = checks.longest_stall("soak", rows, 0.0, 14.0, 5.0, reference_s=2.0)
    assert slow.seconds == pytest.approx(12.0) and slow.bound_s == 16.0
    assert checks.stall_check([slow], 5.0).status == checks.PASS
    assert "a request alone took 2.00 s" in checks.stall_check([slow], 5.0).detail
    fast = checks.longest_stall("soak", rows, 0.0, 14.0, 5.0, reference_s=0.5)
    assert fast.bound_s == 5.0 and checks.stall_check([fast], 5.0).status == checks.FAIL


def test_the_plan_ramps_until_throughput_stops_rising_then_soaks_at_twice_it():
    done = {"n": 0}
    plan = SoakPlan(
        30.0,
        completed=lambda t: done["n"],
        saturation=None,
        ramp_step_s=4.0,
        ramp_gain=0.1,
        ramp_patience=2,
        max_clients=32,
    )
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
    assert c.judge(c.EDITOR, "", c.OK, "", "") and c.judge(c.EDITOR, "", c.ABANDONED, "", "")
    assert not c.judge(c.EDITOR, "", c.REJECTED, c.QUEUE_FULL, "Exceeds maximum queue size")
    assert not c.judge(c.EDITOR, "", c.UNANSWERED, "", "")
    figures = {
        "requests": 10,
        "answered": 3,
        "abandoned": 6,
        "errors": 1,
        "first_token_p50_ms": 90.0,
    }
    phase = {
        "done": True,
        "figures": figures,
        "typist_failures": [],
        "stuck_typists": 0,
        "suffix": {"send": False, "requested": True},
    }
    check = checks.editor_check(phase)
    assert (
        check.status == checks.FAIL and "1 failed" in check.detail and "PREFIX-ONLY" in check.detail
    )
    assert checks.editor_check({**phase, "figures": {**figures, "errors": 0}}).status == checks.PASS
    unanswered = {**figures, "errors": 0, "answered": 0, "abandoned": 10}
    check = checks.editor_check({**phase, "figures": unanswered})
    assert check.status == checks.FAIL and "none answered" in check.detail
    assert checks.editor_check({"done": False, "error": "no answer"}).status == checks.FAIL
    assert checks.editor_check({"done": False, "note": "skipped"}).status == "SKIP"


def test_the_typists_rows_are_labelled_and_summed_as_the_editor_phase():
    """The editor profile's typists fire their own events (kind ``openai``); the soak reads
    them as its ``editor`` kind: answered, abandoned, or rejected with its error's category."""
    log = EventLog(profile="soak", window="editor")
    for outcome, first, latency, error in (
        ("ok", 80.0, 300.0, None),
        ("ok", 120.0, 500.0, None),
        ("abandoned", None, 400.0, None),
        ("error", None, 50.0, "Exceeds maximum queue size"),
    ):
        log.on_request(
            "openai",
            "completion",
            latency,
            exception=error and RuntimeError(error),
            context={
                "outcome": outcome,
                "first_token_ms": first,
                "tokens": 4,
                "prefix_tokens": 100,
                "suffix_tokens": 20,
            },
        )
    rows = checks.measured(log.frame())
    assert rows["kind"].tolist() == [c.EDITOR] * 4
    assert rows["status"].tolist() == [c.OK, c.OK, c.ABANDONED, c.REJECTED]
    assert rows["category"].iloc[3] == c.QUEUE_FULL and rows["expected"].tolist() == [1, 1, 1, 0]
    figures = checks.editor_figures(rows)
    assert (figures["requests"], figures["answered"], figures["abandoned"]) == (4, 2, 1)
    assert figures["errors"] == 1 and figures["prompt_tokens_sent"] == 120.0
    assert figures["first_token_p50_ms"] == 100.0 and figures["latency_p50_ms"] == 400.0
    phase = {
        "done": True,
        "figures": figures,
        "typist_failures": [],
        "stuck_typists": 0,
        "suffix": {"send": True, "requested": True},
    }
    assert (
        checks.editor_check(phase).status == checks.FAIL
        and "1 failed" in checks.editor_check(phase).detail
    )


def test_the_server_checks_read_the_engine_after_the_drain():
    idle = EngineState(0.0, 0.0, 0.0, 0.0)
    found = {
        k.name: k
        for k in checks.server_checks("200", idle, EngineState(9.0, 0.0, 3 * 2**30, 45.0), 120.0)
    }
    assert found["server ready after the soak"].status == checks.PASS
    busy, kv = found["engine idle after the drain"], found["KV cache back to idle"]
    assert (
        busy.status == checks.FAIL and "running sequences 9.0, pending requests 0.0" in busy.detail
    )
    assert kv.status == checks.WARN and kv.detail == "3072.0 MiB after the drain vs 0.0 MiB idle"
    drained = checks.server_checks("200", idle, EngineState(0.0, 0.0, 2**19, 45.0), 3.0)
    assert [k.status for k in drained] == [checks.PASS] * 3
    assert [k.status for k in checks.server_checks("no answer", None, None, 120.0)] == [
        checks.FAIL,
        checks.FAIL,
        checks.SKIP,
    ]
    unknown = EngineState(None, 0.0, None, None)  # not exported: not idle, no KV figure
    assert [k.status for k in checks.server_checks("200", idle, unknown, 1.0)] == [
        checks.PASS,
        checks.FAIL,
        checks.SKIP,
    ]


def test_flatness_check():
    mib = 2**20
    flat = checks.rss_check(
        [1000 * mib, 1010 * mib, 990 * mib, 1005 * mib, 1000 * mib, 1020 * mib], 0.1, strict=False
    )
    assert flat.status == checks.PASS and "(+1.0%, tolerance 10%)" in flat.detail
    leak = [1000 * mib + i * 50 * mib for i in range(9)]  # first third max 1100, last 1400
    assert checks.rss_check(leak, 0.1, strict=False).status == checks.WARN
    assert checks.rss_check(leak, 0.1, strict=True).status == checks.FAIL
    assert "growing" in checks.rss_check(leak, 0.1, strict=True).detail
    assert "(+27.3%" in checks.rss_check(leak, 0.1, strict=True).detail
    assert checks.rss_check([mib] * 3, 0.1, strict=False).status == checks.SKIP
    assert checks.rss_check(None, 0.1, strict=True).status == checks.SKIP


def test_the_report_is_written(tmp_path):
    log, requests = events_of_a_run()
    requests.close("still in flight")
    frame = log.frame()  # write_run labels it
    samples = [
        dict(zip(SAMPLE_COLUMNS, (t, "soak", (500 + t) * 2**20, 4, None, None, None), strict=True))
        for t in range(0, 20, 2)
    ]
    result = {
        "started_at": "2026-01-01T00:00:00",
        "wall_s": 20.0,
        "settings": {
            "clients": 4,
            "duration": 20.0,
            "max_tokens": 8,
            "deadline": 60.0,
            "machine": "test",
            "max_stall": 5.0,
        },
        "server": {"description": "test"},
        "saturation": {"clients": 2, "steps": [], "note": "given"},
        "drain": {"ready_after_soak": "200", "drain_s": 0.5},
        "drill": {"done": False, "note": "skipped"},
        "editor": {"done": False, "note": "skipped"},
        "stalls": [checks.Stall("soak", 1.2, 3.0, 50, bound_s=5.0)],
        "checks": [
            checks.Check("nothing unanswered", checks.FAIL, "1 request(s)"),
            checks.rss_check([s["rss_bytes"] for s in samples], 0.1, strict=False),
        ],
    }
    paths = write_run(tmp_path, result, frame, samples, [("soak", 0.0, 20.0)])
    assert {p.name for p in paths} >= {"summary.json", "report.md", "soak.png", "samples.csv"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] is True and summary["kinds"][-1]["sent"] == 7
    report = (tmp_path / "report.md").read_text()
    assert re.search(r"\| nothing unanswered +\| FAIL ", report)
    assert "runtime_top_p must be" in report
    assert "soak: 1.2 s from t=3 s (50 progress events; bound 5 s)" in report
    assert "## Memory\n\nflat: last third max 518 MiB vs first third max 504 MiB (+2.8%" in report
    assert "## Drain and engine\n\n- ready_after_soak: 200\n- drain_s: 0.5\n" in report
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert len((tmp_path / "samples.csv").read_text().splitlines()) == 11


def test_the_sampler_says_what_the_engine_did_during_a_stall():
    sampler = Sampler(SimpleNamespace(), clock=lambda: 0.0, every=1.0)
    sampler.samples = [
        dict(zip(SAMPLE_COLUMNS, row, strict=True))
        for row in (
            (10.0, "editor", None, 0, 100.0, 0.0, 0.0),
            (11.0, "editor", None, 0, 100.0, 0.0, 37.0),  # requests pending, no steps
            (20.0, "editor", None, 0, 100.0, 0.0, 37.0),
        )
    ]
    assert sampler.during(10.0, 20.0) == (
        "0 steps in 10 s, up to 0 sequences running and 37 requests pending in Triton"
    )
    assert sampler.during(30.0, 40.0) == ""
