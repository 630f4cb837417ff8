"""The soak (``make soak``): its pure parts without a server (error classification of real
Triton error texts, the accounting, the flatness check, the report), then one very short real
soak against the session's server (found running, so never drilled)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from client.request import CompletionRequest
from contract.options import MAX_PROMPT_BYTES, MAX_WORDS_PER_LIST
from loadtest.soak import run as soak
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
    Schedule,
    classify_error,
    named_option,
    parse_mix,
    raw_tensors,
)
from loadtest.soak.clients import Rotation
from loadtest.soak.editor_phase import editor_check
from loadtest.soak.report import write_run
from loadtest.soak.results import (
    FAIL,
    PASS,
    Check,
    Ledger,
    Record,
    SoakResult,
    accounting_checks,
    case_check,
    case_summaries,
    error_messages,
    judge,
    kind_summaries,
    total_summary,
)
from loadtest.soak.server import RssSample, rss_flatness
from loadtest.soak.stall import Stall, longest_stall, stall_bound, stall_check

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


def ledger_with_a_run() -> Ledger:
    ledger = Ledger()
    ends = [
        (UNARY_GRPC, "", OK, "", ""),
        (UNARY_GRPC, "", REJECTED, QUEUE_FULL, "Exceeds maximum queue size"),
        (STREAM, "", OK, "", ""),
        (VANISH_UNARY, "", ABANDONED, "", "client timeout passed (on purpose)"),
        (
            INVALID,
            "top_p_1.5",
            REJECTED,
            VALIDATION,
            "in ensemble 'ensemble', runtime_top_p must be in [0, 1], got 1.5",
        ),
        (INVALID, "empty_prompt", OK, "", ""),  # the server accepted an invalid request
    ]
    for kind, case, status, category, message in ends:
        ticket = ledger.begin(kind, case, "grpc", "soak")
        ledger.end(ticket, status, category, message)
    ledger.begin(UNARY_GRPC, "", "http", "soak")  # never ends
    return ledger


def test_every_request_is_accounted_for_and_leftovers_are_unanswered():
    ledger = ledger_with_a_run()
    assert ledger.close("still in flight") == 1
    records, in_flight = ledger.snapshot()
    assert in_flight == 0 and len(records) == ledger.sent == 7
    kinds = kind_summaries(records)
    total = total_summary(kinds)
    assert all(k.accounted for k in kinds) and total.accounted
    assert (total.ok, total.abandoned, total.unanswered) == (3, 1, 1)
    assert total.rejected == {QUEUE_FULL: 1, VALIDATION: 1}
    grpc = next(k for k in kinds if k.kind == UNARY_GRPC)
    assert (grpc.sent, grpc.unanswered, grpc.unexpected) == (3, 1, 1)
    checks = {c.name: c.status for c in accounting_checks(total, kinds)}
    assert checks["every request accounted for"] == PASS
    assert checks["nothing unanswered"] == FAIL
    cases = {c.case: c for c in case_summaries(records)}
    assert cases["top_p_1.5"].passed and not cases["empty_prompt"].passed
    assert case_check(list(cases.values()), INVALID).status == FAIL
    assert error_messages(records)[0]["count"] == 1


def _done(started: float, latency: float | None, status: str = OK, first: float | None = None):
    return Record(EDITOR, "", "openai-sse", "editor", started, latency, status, "", "", True, first)


def test_the_longest_stall_counts_only_time_with_requests_in_flight():
    records = [
        _done(0.0, 1.0),  # answered at 1
        _done(2.0, 3.0, ABANDONED),  # in flight 2..5, no text: no progress
        _done(4.0, 4.0, ABANDONED, first=3.5),  # first text at 7.5: progress
        _done(20.0, 2.0),  # answered at 22; nothing in flight from 8 to 20
    ]
    stall = longest_stall("editor", records, 0.0, 30.0)
    # in flight: 0..1, 2..8, 20..22; between progress events (edges 0, 1, 7.5, 22, 30) that
    # is 1, then 5.5 (2..7.5), then 2.5 (7.5..8 and 20..22), then 0
    assert stall.seconds == pytest.approx(5.5) and stall.at_s == 1.0
    assert stall.progress_events == 3
    assert longest_stall("soak", [], 0.0, 10.0).seconds == 0
    # a request that never ended stalls until the phase's end
    frozen = longest_stall("soak", [_done(0.0, 1.0), _done(2.0, None, UNANSWERED)], 0.0, 60.0)
    assert frozen.seconds == pytest.approx(58.0)


def test_the_stall_check_fails_over_its_bound():
    ok, frozen = Stall("soak", 1.2, 3.0, 50), Stall("editor", 7.5, 40.0, 12)
    assert stall_check([ok], 5.0).status == PASS
    failed = stall_check([ok, frozen], 5.0)
    assert failed.status == FAIL and "editor: 7.5 s from t=40 s" in failed.detail


def test_the_stall_bound_scales_to_a_machine_too_slow_for_it():
    assert stall_bound(5.0, None) == 5.0 and stall_bound(5.0, 0.2) == 5.0
    assert stall_bound(5.0, 2.0) == 8 * 2.0  # one request alone takes 2 s here
    records = [_done(0.0, 1.0), _done(1.0, 12.0), _done(13.0, 1.0)]  # a 12 s gap at 1..13
    slow = longest_stall("soak", records, 0.0, 14.0, 5.0, reference_s=2.0)
    assert slow.seconds == pytest.approx(12.0) and slow.bound_s == 16.0
    assert stall_check([slow], 5.0).status == PASS
    assert "a request alone took 2.00 s" in stall_check([slow], 5.0).detail
    fast = longest_stall("soak", records, 0.0, 14.0, 5.0, reference_s=0.5)
    assert fast.bound_s == 5.0 and stall_check([fast], 5.0).status == FAIL


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
    from types import SimpleNamespace

    from loadtest.soak.editor_phase import run_editor_phase
    from loadtest.soak.settings import parse_args

    settings = parse_args(["--model-repository", str(tmp_path), "--out", str(tmp_path / "out")])
    _, _, phase = run_editor_phase(settings, Ledger(), SimpleNamespace(phase=""))
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
    ledger = ledger_with_a_run()
    ledger.close("still in flight")
    records, _ = ledger.snapshot()
    kinds = kind_summaries(records)
    samples = [RssSample(float(t), "soak", (500 + t) * 2**20, 4) for t in range(0, 20, 2)]
    result = SoakResult(
        settings={"clients": 4, "duration_s": 20.0, "max_tokens": 8, "deadline_s": 60.0},
        server={"description": "test"},
        saturation={"clients": 2, "steps": [], "note": "given"},
        kinds=kinds,
        total=total_summary(kinds),
        cases=case_summaries(records),
        errors=error_messages(records),
        rss=rss_flatness([s.rss_bytes for s in samples], 0.1),
        rss_note="",
        drain={"ready_after_soak": "200"},
        engine={"kv_cache_bytes": "not exported"},
        drill={"done": False, "note": "skipped"},
        checks=[Check("nothing unanswered", FAIL, "1 request(s)")],
        started_at="2026-01-01T00:00:00",
    )
    paths = write_run(tmp_path, result, records, samples, [("soak", 0.0, 20.0)])
    assert {p.name for p in paths} >= {"summary.json", "report.md", "soak.png", "requests.csv"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] is True and summary["total"]["sent"] == 7
    report = (tmp_path / "report.md").read_text()
    assert "| nothing unanswered | FAIL |" in report and "runtime_top_p must be" in report
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert len((tmp_path / "requests.csv").read_text().splitlines()) == 8


def test_a_short_real_soak_accounts_for_everything(server, model_repository, tmp_path: Path):
    """Four clients for a few seconds, weighted towards the invalid and hostile cases so that
    every one of them is sent; the server was found running, so there is no drill."""
    out = tmp_path / "soak"
    mix = "unary_grpc=2,unary_http=2,stream=2,vanish_stream=1,vanish_unary=2,invalid=10,hostile=9"
    code = soak.main(
        [
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
            "--progress-every",
            "5",
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
    )
    summary = json.loads((out / "summary.json").read_text())
    total = summary["total"]
    assert total["unanswered"] == 0
    assert total["sent"] == total["ok"] + sum(total["rejected"].values()) + total["abandoned"]
    assert total["sent"] > 0
    invalid = [c for c in summary["cases"] if c["kind"] == INVALID]
    assert {c["case"] for c in invalid} == {c.name for c in INVALID_CASES}, "not all sent"
    for case in invalid:
        assert case["as_expected"] == case["sent"], case  # rejected, naming the option
    checks = {c["name"]: c["status"] for c in summary["checks"]}
    assert checks["stub-kill drill"] == "SKIP"  # a server the soak did not start
    assert checks["engine idle after the drain"] == PASS
    assert code == 0, [c for c in summary["checks"] if c["status"] == FAIL]
    assert set(ALL_KINDS) >= {k["kind"] for k in summary["kinds"]}
    editor = {k["kind"]: k for k in summary["kinds"]}[EDITOR]
    assert editor["sent"] >= 2 and editor["unexpected"] == 0, editor  # answered or abandoned
    assert checks["editor requests answered or abandoned"] == PASS
    assert checks["no stall over max(120 s, 8 lone requests)"] == PASS
    assert [s["phase"] for s in summary["stalls"]] == ["soak", "editor"]
    assert "## Editor phase" in (out / "report.md").read_text()


def test_the_engine_sampler_says_what_the_engine_did_during_a_stall():
    from loadtest.soak.stall import EngineSample, EngineSampler, explain

    sampler = EngineSampler("http://127.0.0.1:1/metrics", clock=lambda: 0.0)
    sampler.samples = [
        EngineSample(10.0, 100.0, 0.0, 0.0),
        EngineSample(11.0, 100.0, 0.0, 37.0),  # requests pending, the engine not stepping
        EngineSample(20.0, 100.0, 0.0, 37.0),
    ]
    stall = explain(Stall("editor", 9.5, 10.0, 3, until_s=20.0), sampler)
    assert stall.engine == (
        "0 steps in 10 s, up to 0 sequences running and 37 requests pending in Triton"
    )
    assert "engine meanwhile: 0 steps" in stall_check([stall], 5.0).detail
    assert explain(Stall("soak", 1.0, None, 0), sampler).engine == ""
