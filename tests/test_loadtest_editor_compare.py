"""The editor profile's cache-on/off comparison, without a server: the repository copy that
steers ``prefix_caching``, the check that the engine runs the setting asked for, the targets'
verdicts (each PASS, FAIL or NOT MEASURED, never a pass by default) and the report."""

from __future__ import annotations

import json

import pytest

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.editor.compare import (
    FAIL,
    NOT_MEASURED,
    OFF,
    ON,
    PASS,
    Comparison,
    cache_repository,
    check_caching,
    evaluate,
    set_caching,
    write_comparison,
)
from loadtest.editor.drill import (
    DrillOutcome,
    abandon_at_first_piece,
    drill_figures,
    drill_prompts,
)
from loadtest.editor.figures import (
    ABANDONED,
    ANSWERED,
    ERROR,
    EditorRecord,
    editor_figures,
    engine_figures,
)
from loadtest.editor.protocols import Exchange
from loadtest.editor.report import EditorRun
from loadtest.editor.typist import TypingStyle
from loadtest.editor.window import Clipper
from loadtest.metrics import reuse_line, reuse_share
from loadtest.results import MachineInfo, ModelInfo
from serving.paths import MODEL_REPOSITORY, checkpoint_dir

# --- the repository copy and the engine's word -------------------------------------------------


def test_set_caching_flips_the_one_parameter_and_refuses_a_config_without_it():
    config = (MODEL_REPOSITORY / ENGINE_MODEL / "config.pbtxt").read_text()
    off = set_caching(config, False)
    assert 'key: "prefix_caching" value: { string_value: "false" }' in off
    assert set_caching(off, True) == config  # only that parameter changed
    with pytest.raises(ValueError, match="0 prefix_caching parameters"):
        set_caching('name: "engine"\n', True)
    with pytest.raises(ValueError, match="2 prefix_caching parameters"):
        set_caching(config + config, True)


def test_the_repository_copy_links_the_checkpoint_and_leaves_the_source_alone(tmp_path):
    source = tmp_path / "repo"
    (source / "ensemble").mkdir(parents=True)
    (source / ENGINE_MODEL).mkdir()
    original = (MODEL_REPOSITORY / ENGINE_MODEL / "config.pbtxt").read_text()
    (source / ENGINE_MODEL / "config.pbtxt").write_text(original)
    checkpoint = checkpoint_dir(source)
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    copy = cache_repository(source, tmp_path / "out" / "repo", caching=False)
    assert checkpoint_dir(copy).is_symlink() and checkpoint_dir(copy).resolve() == checkpoint
    assert (
        '"prefix_caching" value: { string_value: "false" }'
        in (copy / ENGINE_MODEL / "config.pbtxt").read_text()
    )
    assert (source / ENGINE_MODEL / "config.pbtxt").read_text() == original
    again = cache_repository(source, tmp_path / "out" / "repo", caching=True)  # replaced
    assert (
        '"prefix_caching" value: { string_value: "true" }'
        in (again / ENGINE_MODEL / "config.pbtxt").read_text()
    )
    (checkpoint / "config.json").unlink()
    with pytest.raises(SystemExit, match="make model"):
        cache_repository(source, tmp_path / "elsewhere", caching=True)


def test_the_engine_must_say_it_runs_the_setting_asked_for(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_text("engine: serving /x (openvino backend, 2 layers, prefix cache off, on CPU)\n")
    check_caching(log, expected=False)
    with pytest.raises(SystemExit, match="prefix cache is off, expected on"):
        check_caching(log, expected=True)
    log.write_text("engine: serving /x (torch backend, 2 layers, float32, on cpu)\n")
    with pytest.raises(SystemExit, match="only the openvino backend"):
        check_caching(log, expected=True)
    with pytest.raises(SystemExit, match="did not log"):
        check_caching(tmp_path / "missing.log", expected=True)


def test_reuse_is_reused_over_received_and_the_sweep_line_says_so():
    assert reuse_share(1000.0, 700.0) == pytest.approx(0.7)
    assert reuse_share(0.0, 5.0) is None and reuse_share(10.0, None) is None
    line = reuse_line(1000.0, 700.0)
    assert "700 of 1,000 prompt tokens received (70.0%" in line
    assert names.ENGINE_PROMPT_TOKENS_REUSED in line and "upper bound" in line


# --- the anchored prefix window ---------------------------------------------------------------


class CharEncoder:
    """One token per character: clipping is exact."""

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [(i, i + 1) for i in range(len(text))]


def test_an_anchored_prefix_keeps_its_start_while_the_cursor_moves_within_a_step():
    text = "abcdefghi\n" * 300  # a line starts every 10 characters
    anchored = Clipper(CharEncoder(), context=200, max_tokens=32, anchor_chars=50)
    budget = anchored.budget  # 160: the exact cut of cursor c is c - 160
    starts = {}
    for cursor in range(1000, 1060):
        window = anchored.clip(text, cursor, with_suffix=False)
        assert 0 < window.prefix_tokens <= budget and text[:cursor].endswith(window.prefix)
        starts[cursor] = cursor - len(window.prefix)
    # cuts 840..850 round up to 850, cuts 851..899 to 900: both line starts
    assert {starts[c] for c in range(1000, 1011)} == {850}
    assert {starts[c] for c in range(1011, 1060)} == {900}
    exact = Clipper(CharEncoder(), context=200, max_tokens=32)
    assert exact.clip(text, 1000, with_suffix=False).prefix == text[1000 - budget : 1000]
    # no line start between the step and the cursor: the exact cut stays
    flat = "x" * 2000
    assert anchored.clip(flat, 1000, with_suffix=False).prefix == flat[1000 - budget : 1000]
    # a prefix that fits whole is never cut
    assert anchored.clip(text, 100, with_suffix=False).prefix == text[:100]
    with pytest.raises(ValueError, match="anchor_chars"):
        Clipper(CharEncoder(), context=200, max_tokens=32, anchor_chars=-1)


# --- the abandonment drill ---------------------------------------------------------------------


class ScriptedExchange(Exchange):
    """An exchange whose pieces arrive on the scripted polls: ``script`` lists, per poll,
    the tokens of a piece (0: nothing yet), then "end" or "error"."""

    def __init__(self, script: list) -> None:
        super().__init__()
        self.script = list(script)
        self.polls = 0
        self.abandoned = False

    def wait(self, deadline: float) -> bool:
        self.polls += 1
        step = self.script.pop(0) if self.script else 0
        if step == "end":
            self.finished, self.completion_tokens = True, self.tokens_read + 3
        elif step == "error":
            self._fail("HTTP 500: boom")
        elif step:
            self._piece(step)
        return self.over

    def abandon(self) -> None:
        self.abandoned = True


def test_the_drill_leaves_at_the_first_piece_and_counts_what_was_read():
    late = ScriptedExchange([0, 0, 2, 1, 1])
    outcome = abandon_at_first_piece(late)
    assert outcome == DrillOutcome(ABANDONED, 2) and late.abandoned and late.polls == 3
    quick = ScriptedExchange(["end"])  # the model ended the text before any piece: answered
    assert abandon_at_first_piece(quick) == DrillOutcome(ANSWERED, 3) and not quick.abandoned
    failed = abandon_at_first_piece(ScriptedExchange(["error"]))
    assert failed.outcome == ERROR and failed.error == "HTTP 500: boom"
    silent = ScriptedExchange([])
    assert abandon_at_first_piece(silent, limit_s=0.0).outcome == ERROR and silent.abandoned


def test_drill_figures_are_unread_tokens_per_abandoned_request():
    outcomes = [DrillOutcome(ABANDONED, 1, generated=g) for g in (2.0, 3.0, 3.0, 4.0)]
    outcomes.append(DrillOutcome(ANSWERED, 10, generated=10.0))
    d = drill_figures(outcomes, max_tokens=200, sse=True)
    assert (d.requests, d.abandoned, d.answered, d.errors, d.tokens_read) == (5, 4, 1, 0, 14)
    assert d.generated == 22.0 and d.unread_each == [1.0, 2.0, 2.0, 3.0]
    assert d.unread_per_abandoned == pytest.approx((22 - 14) / 4) and "SSE" in d.bound
    # one request whose count was not read: no total, and it is left out of the list
    unread = drill_figures([*outcomes, DrillOutcome(ABANDONED, 1)], 200, sse=False)
    assert unread.unread_per_abandoned is None and unread.generated is None
    assert unread.unread_each == [1.0, 2.0, 2.0, 3.0] and "SSE" not in unread.bound
    none = drill_figures([DrillOutcome(ANSWERED, 5, generated=5.0)], 200, sse=False)
    assert none.unread_per_abandoned is None and none.unread_each == []


def test_drill_prompts_take_the_files_in_turn_up_to_their_middle_line(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("".join(f"a{i}\n" for i in range(10)))
    b.write_text("".join(f"b{i}\n" for i in range(4)))
    prompts = drill_prompts([a, b, tmp_path / "missing.py"], lambda text, at: text[:at], 3)
    assert prompts == ["a0\na1\na2\na3\na4\n", "b0\nb1\n", "a0\na1\na2\na3\na4\n"]
    with pytest.raises(RuntimeError, match="no held-out file"):
        drill_prompts([tmp_path / "missing.py"], lambda text, at: text, 1)


# --- targets -----------------------------------------------------------------------------------


def _record(outcome: str, ttft: float | None = None, read: int = 0) -> EditorRecord:
    return EditorRecord(
        typist=0,
        t_s=1.0,
        outcome=outcome,
        pause_s=1.0,
        prefix_tokens=900,
        suffix_tokens=100,
        first_token_ms=ttft,
        latency_ms=None if ttft is None else ttft + 200,
        pieces=read,
        tokens_read=read,
        completion_tokens=10 if outcome == ANSWERED else None,
        error="HTTP 500: boom" if outcome == ERROR else "",
    )


def _run(
    ttft: float | None,
    abandoned: int = 4,
    wasted: float = 4.0,
    errors: int = 0,
    after: str = "answered a plain request in 20 ms",
    engine: bool = True,
    drill: tuple[int, float] | None = None,  # abandoned, unread tokens
) -> EditorRun:
    """A half whose answered requests (ten of them) all took ``ttft`` to the first token and
    whose engine generated ``wasted`` tokens no reader got (abandoned requests read 2 each)."""
    records = [_record(ANSWERED, ttft) for _ in range(10 if ttft is not None else 0)]
    records += [_record(ABANDONED, 50.0, read=2) for _ in range(abandoned)]
    records += [_record(ERROR) for _ in range(errors)]
    delivered = 10 * len([r for r in records if r.outcome == ANSWERED]) + 2 * abandoned
    increases = {
        names.ENGINE_GENERATED_TOKENS: delivered + wasted,
        names.ENGINE_REQUESTS: float(len(records)),
        names.ENGINE_PROMPT_TOKENS: 1000.0 * len(records),
        names.ENGINE_PROMPT_TOKENS_REUSED: 600.0 * len(records),
    }
    figures = engine_figures(increases, records, exact_tokens=True) if engine else None
    return EditorRun(
        name="half",
        started="2026-01-01T00:00:00",
        seconds=30.0,
        command="python -m loadtest.editor --quick",
        protocol="grpc",
        settings={
            "typists": 2,
            "duration_s": 10.0,
            "max_tokens": 32,
            "suffix_share": 0.25,
            "context": 1024,
            "files": 30,
            "seed": 0,
            "sampling": {"top_k": 40},
            **{k: getattr(TypingStyle(), k) for k in ("keystroke_s", "burst", "pause_s")},
        },
        suffix={"requested": True, "send": True, "note": "", "refused": False},
        figures=editor_figures(records, figures),
        after=after,
        problems=[],
        machine=MachineInfo.here(),
        model=ModelInfo(),
        drill=None
        if drill is None
        else drill_figures(
            [DrillOutcome(ABANDONED, 1, generated=1 + drill[1] / drill[0])] * drill[0], 200, False
        ),
    )


def _verdicts(on: EditorRun, off: EditorRun) -> dict[str, str]:
    return {t.name: t.verdict for t in evaluate(on, off)}


def test_first_token_passes_at_a_third_and_fails_above_it():
    assert _verdicts(_run(100.0), _run(300.0))["first token"] == PASS
    assert _verdicts(_run(101.0), _run(300.0))["first token"] == FAIL
    assert _verdicts(_run(300.0), _run(100.0))["first token"] == FAIL


def test_first_token_without_answers_in_a_half_is_not_measured():
    target = next(t for t in evaluate(_run(None), _run(300.0)) if t.name == "first token")
    assert target.verdict == NOT_MEASURED and ON in target.measured


def test_tokens_after_abandonment_are_per_abandoned_request_in_each_half():
    # 8 unread tokens over 4 abandoned requests: 2 each, at the limit
    assert _verdicts(_run(100.0, wasted=8.0), _run(300.0))["abandoned requests"] == PASS
    assert _verdicts(_run(100.0), _run(300.0, wasted=9.0))["abandoned requests"] == FAIL
    # a half that abandoned nothing says nothing; if neither did, nothing was measured
    assert _verdicts(_run(100.0, abandoned=0), _run(300.0))["abandoned requests"] == PASS
    both_idle = _verdicts(_run(100.0, abandoned=0), _run(300.0, abandoned=0))
    assert both_idle["abandoned requests"] == NOT_MEASURED
    # abandoned requests whose engine counters were not read cannot pass
    unread = _verdicts(_run(100.0), _run(300.0, engine=False))
    assert unread["abandoned requests"] == NOT_MEASURED
    # the drill counts like the typists: it can pass alone, and fail a passing half
    drilled = _verdicts(_run(100.0, abandoned=0, drill=(8, 16.0)), _run(300.0, abandoned=0))
    assert drilled["abandoned requests"] == PASS
    spilled = _verdicts(_run(100.0, drill=(8, 17.0)), _run(300.0))
    assert spilled["abandoned requests"] == FAIL


def test_errors_and_the_after_check_fail_in_either_half():
    assert _verdicts(_run(100.0), _run(300.0))["errors"] == PASS
    assert _verdicts(_run(100.0), _run(300.0, errors=1))["errors"] == FAIL
    silent = _run(300.0, after="NO ANSWER to a plain request within 30 s")
    assert _verdicts(_run(100.0), silent)["after the run"] == FAIL


def test_the_comparison_report_puts_the_halves_side_by_side(tmp_path):
    on, off = _run(100.0, wasted=4.0), _run(400.0, wasted=12.0)
    load = {ON: (1.5, 2.5), OFF: (2.5, 3.0)}
    c = Comparison("run", on, off, load, ["avx512f"], "2026-01-01T00:10")
    assert not c.all_pass  # off wasted 3 per abandoned request
    assert Comparison("run", on, _run(400.0), {}, [], "").all_pass
    paths = write_comparison(tmp_path, c)
    report = (tmp_path / "comparison.md").read_text()
    assert "3 of 4 PASS" in report
    assert "| first token p50 ms (answered) | 100 | 400 | 0.25 |" in report
    assert "| first token | " in report and "100 ms / 400 ms = 0.25 | **PASS** |" in report
    assert "**FAIL**" in report and "cache-off typists: 3.00 over 4 abandoned" in report
    assert "| prefix-cache reuse share (at most) | 60.0% | 60.0% | 1.00 |" in report
    assert "cache-on 1.50 -> 2.50" in report and "avx512f" in report
    assert "| drill: the most for one request (at most) | - | - | - |" in report
    assert report.startswith("# Editor traffic, prefix cache on vs off: run\n")
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert [t["verdict"] for t in data["targets"]] == [PASS, FAIL, PASS, PASS]
    assert data["all_pass"] is False and {p.name for p in paths} == {
        "comparison.md",
        "comparison.json",
    }
    row = next(r for r in data["table"] if r["figure"].startswith("first token p50"))
    assert (row[ON], row[OFF], row["on / off"]) == (100.0, 400.0, 0.25)


def test_the_comparison_is_the_default_and_no_compare_is_the_single_run():
    from loadtest.editor.settings import parser

    assert parser().parse_args([]).compare is True
    assert parser().parse_args(["--no-compare"]).compare is False
