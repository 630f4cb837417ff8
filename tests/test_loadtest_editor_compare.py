"""The editor profile's cache-on/off comparison, without a server: the repository copy that
steers ``prefix_caching``, the check that the engine runs the setting asked for, the targets'
verdicts (each PASS, FAIL or NOT MEASURED, never a pass by default) and the report."""

from __future__ import annotations

import pandas as pd
import pytest

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.editor.drill import (
    DrillOutcome,
    abandon_at_first_piece,
    drill_figures,
    points,
)
from loadtest.editor.protocols import Exchange, Sender, indent_at, request_event
from loadtest.editor.report import FAIL, NOT_MEASURED, PASS, evaluate, system_figures
from loadtest.editor.settings import mirrored, parse_args
from loadtest.editor.systems import (
    LLAMA,
    OFF,
    ON,
    PROJECT,
    cache_repository,
    check_caching,
    set_caching,
)
from loadtest.editor.window import Clipper, Window
from loadtest.metrics import reuse_line, reuse_share
from reporting.events import EventLog
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
            self.error = "HTTP 500: boom"
        elif step:
            self.first_token_s, self.tokens_read = 0.01, self.tokens_read + step
        return self.over

    def abandon(self) -> None:
        self.abandoned = True


def test_the_drill_leaves_at_the_first_piece_and_counts_what_was_read():
    late = ScriptedExchange([0, 0, 2, 1, 1])
    outcome = abandon_at_first_piece(late)
    assert outcome == DrillOutcome("abandoned", 2) and late.abandoned and late.polls == 3
    quick = ScriptedExchange(["end"])  # the model ended the text before any piece: answered
    assert abandon_at_first_piece(quick) == DrillOutcome("ok", 3) and not quick.abandoned
    failed = abandon_at_first_piece(ScriptedExchange(["error"]))
    assert failed.outcome == "error" and failed.error == "HTTP 500: boom"
    silent = ScriptedExchange([])
    assert abandon_at_first_piece(silent, limit_s=0.0).outcome == "error" and silent.abandoned


def test_drill_figures_are_unread_tokens_per_abandoned_request():
    outcomes = [DrillOutcome("abandoned", 1, generated=g) for g in (2.0, 3.0, 3.0, 4.0)]
    outcomes.append(DrillOutcome("ok", 10, generated=10.0))
    d = drill_figures(outcomes)
    counts = [d[k] for k in ("requests", "abandoned", "answered", "errors", "tokens_read")]
    assert counts == [5, 4, 1, 0, 14] and d["max_tokens"] == 200
    assert d["generated"] == 22.0 and d["unread_each"] == [1.0, 2.0, 2.0, 3.0]
    assert d["unread_per_abandoned"] == pytest.approx((22 - 14) / 4)
    assert d["spread"] == " (median 2.0, most 3)."
    # one request whose count was not read: no total, and it is left out of the list
    unread = drill_figures([*outcomes, DrillOutcome("abandoned", 1)])
    assert unread["unread_per_abandoned"] is None and unread["generated"] is None
    assert unread["unread_each"] == [1.0, 2.0, 2.0, 3.0]
    none = drill_figures([DrillOutcome("ok", 5, generated=5.0)])
    assert none["unread_per_abandoned"] is None and none["unread_each"] == []


def test_drill_prompts_take_the_files_in_turn_up_to_their_middle_line(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("".join(f"a{i}\n" for i in range(10)))
    b.write_text("".join(f"b{i}\n" for i in range(4)))
    prompts = [text[:at] for text, at in points([a, b, tmp_path / "missing.py"], 0.5, 3)]
    assert prompts == ["a0\na1\na2\na3\na4\n", "b0\nb1\n", "a0\na1\na2\na3\na4\n"]
    assert points([tmp_path / "missing.py"], 0.5, 1) == []  # nothing readable: no prompt


# --- targets -----------------------------------------------------------------------------------


def _record(outcome: str, ttft: float | None = None, read: int = 0) -> Exchange:
    return Exchange(
        first_token_s=None if ttft is None else ttft / 1000,
        pieces=read,
        tokens_read=read,
        latency_s=None if ttft is None else (ttft + 200) / 1000,
        finished=outcome == "ok",
        completion_tokens=10 if outcome == "ok" else None,
        error="HTTP 500: boom" if outcome == "error" else "",
    )


def _figures(
    ttft: float | None,
    abandoned: int = 4,
    wasted: float = 4.0,
    errors: int = 0,
    counted: bool = True,
    past_stop: float = 0.0,
) -> dict:
    """A system whose answered requests (ten of them) all took ``ttft`` to the first token and
    whose server generated ``wasted`` tokens no reader got (abandoned requests read 2 each)."""
    records = [_record("ok", ttft) for _ in range(10 if ttft is not None else 0)]
    records += [_record("abandoned", 50.0, read=2) for _ in range(abandoned)]
    records += [_record("error") for _ in range(errors)]
    log, window = EventLog(profile="editor", system="s", window=0), Window("", "", 900, 100)
    for record in records:
        log.on_request(**request_event(record, window, 1.0, 0, "grpc", True, log._t0_wall))
    delivered = 10 * (10 if ttft is not None else 0) + 2 * abandoned
    counters = {"generated": delivered + wasted, "editor_stops": 10.0, "past_stop": past_stop}
    windows = pd.DataFrame(
        [
            {
                "system": "s",
                "window": 0,
                "seconds": 10.0,
                "cpu_s": 1.0,
                **(counters if counted else {}),
            }
        ]
    )
    return system_figures(log.frame(), windows)["s"]


def _drill(abandoned: int, unread: float) -> dict:
    outcomes = [DrillOutcome("abandoned", 1, generated=1 + unread / abandoned)] * abandoned
    return drill_figures(outcomes)


AFTER = "answered a plain request in 20 ms"


def _verdicts(on: dict, off: dict, drills: dict | None = None, after: str = AFTER) -> dict:
    targets = evaluate({ON: on, OFF: off}, drills or {}, {ON: AFTER, OFF: after}, True)
    return {t.name: t.verdict for t in targets}


FIRST = "first token, cache on / off"


def test_first_token_passes_at_a_third_and_fails_above_it():
    assert _verdicts(_figures(100.0), _figures(300.0))[FIRST] == PASS
    assert _verdicts(_figures(101.0), _figures(300.0))[FIRST] == FAIL
    assert _verdicts(_figures(300.0), _figures(100.0))[FIRST] == FAIL


def test_first_token_without_answers_in_a_half_is_not_measured():
    figures = {ON: _figures(None), OFF: _figures(300.0)}
    targets = {t.name: t for t in evaluate(figures, {}, {ON: AFTER}, True)}
    assert targets[FIRST].verdict == NOT_MEASURED
    assert targets["one-line p50"].verdict == NOT_MEASURED  # nothing answered: not a pass


def test_the_latency_targets_hold_the_project_to_the_editor_budget():
    # answered requests of 100 ms to the first token, 300 ms to the end of the line
    verdicts = _verdicts(_figures(100.0), _figures(300.0))
    assert verdicts["first token p50"] == PASS and verdicts["one-line p50"] == FAIL
    assert verdicts["one-line p95"] == PASS
    fast = _verdicts(_figures(40.0), _figures(300.0))
    assert fast["one-line p50"] == PASS and fast["first token p50"] == PASS
    off = evaluate({ON: _figures(40.0)}, {}, {ON: AFTER}, one_line=False)
    assert next(t for t in off if t.name == "one-line").verdict == NOT_MEASURED


def test_the_project_against_llama_cpp_passes_at_equal_one_line_latency():
    def verdict(ours: float, theirs: float) -> str:
        figures = {PROJECT: _figures(ours), LLAMA: _figures(theirs, abandoned=0)}
        targets = evaluate(figures, {}, {PROJECT: AFTER, LLAMA: AFTER}, True)
        return next(t for t in targets if "llama.cpp" in t.name).verdict

    assert verdict(100.0, 100.0) == PASS and verdict(101.0, 100.0) == FAIL
    # a peer that answered nothing within the pauses is not beaten: nothing was measured
    figures = {PROJECT: _figures(100.0), LLAMA: _figures(None)}
    targets = evaluate(figures, {}, {PROJECT: AFTER, LLAMA: AFTER}, True)
    assert next(t for t in targets if "llama.cpp" in t.name).verdict == NOT_MEASURED
    # llama.cpp's own waste is a figure, never one of the project's targets
    figures = {PROJECT: _figures(50.0), LLAMA: _figures(50.0, wasted=1000.0)}
    targets = evaluate(figures, {}, {PROJECT: AFTER, LLAMA: AFTER}, True)
    waste = next(t for t in targets if t.name == "abandoned requests")
    assert waste.verdict == PASS and LLAMA not in waste.measured


def test_tokens_after_abandonment_are_per_abandoned_request_in_each_half():
    # 8 unread tokens over 4 abandoned requests: 2 each, at the limit
    assert _verdicts(_figures(100.0, wasted=8.0), _figures(300.0))["abandoned requests"] == PASS
    assert _verdicts(_figures(100.0), _figures(300.0, wasted=9.0))["abandoned requests"] == FAIL
    # a half that abandoned nothing says nothing; if neither did, nothing was measured
    idle = _figures(100.0, abandoned=0)
    assert _verdicts(idle, _figures(300.0))["abandoned requests"] == PASS
    both_idle = _verdicts(idle, _figures(300.0, abandoned=0))
    assert both_idle["abandoned requests"] == NOT_MEASURED
    # abandoned requests whose counters were not read cannot pass
    unread = _verdicts(_figures(100.0), _figures(300.0, counted=False))
    assert unread["abandoned requests"] == NOT_MEASURED
    # the drill counts like the typists: it can pass alone, and fail a passing half
    drilled = _verdicts(idle, _figures(300.0, abandoned=0), {ON: _drill(8, 16.0)})
    assert drilled["abandoned requests"] == PASS
    spilled = _verdicts(_figures(100.0), _figures(300.0), {ON: _drill(8, 17.0)})
    assert spilled["abandoned requests"] == FAIL


def test_a_token_past_an_editor_stop_fails():
    assert _verdicts(_figures(100.0), _figures(300.0))["past a stop"] == PASS
    assert _verdicts(_figures(100.0), _figures(300.0, past_stop=1.0))["past a stop"] == FAIL
    uncounted = _verdicts(_figures(100.0), _figures(300.0, counted=False))
    assert uncounted["past a stop"] == NOT_MEASURED


def test_errors_and_the_after_check_fail_in_either_half():
    assert _verdicts(_figures(100.0), _figures(300.0))["errors"] == PASS
    assert _verdicts(_figures(100.0), _figures(300.0, errors=1))["errors"] == FAIL
    silent = _verdicts(_figures(100.0), _figures(300.0), after="NO ANSWER within 30 s")
    assert silent["after the run"] == FAIL


def test_mirrored_windows_put_each_system_first_as_often_as_last():
    assert mirrored(["a", "b"], 2) == ["a", "b", "b", "a"]
    assert mirrored(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]
    assert mirrored(["x"], 2) == ["x", "x"]


def test_the_comparison_is_the_default_and_no_compare_is_the_single_run():
    assert parse_args([])[0].compare is True
    assert parse_args(["--no-compare"])[0].compare is False
    quick, _ = parse_args(["--quick"])
    assert (quick.typists, quick.duration) == (2, 20.0)
    single, _ = parse_args(["--quick", "--no-compare", "--typists", "3"])
    assert (single.typists, single.duration) == (3, 25.0)  # a flag beats the preset
    with pytest.raises(SystemExit):
        parse_args(["--pause", "2,1"])  # MIN above MAX
    args, _ = parse_args(["--peer", "llama"])
    assert args.peer == "llama" and args.no_suffix  # llama.cpp's /v1/completions has none
    with pytest.raises(SystemExit):
        parse_args(["--peer", "llama", "--no-compare"])


def test_the_stop_rules_go_to_each_server_under_its_own_names():
    def stops(protocol: str, n_indent: int, **rules) -> dict:
        return Sender(protocol, "127.0.0.1:1", 8, **rules).stops(n_indent)

    on = {"one_line": True, "t_max_predict_ms": 1000}
    assert stops("grpc", 0, **on) == {"single_line": True, "t_max_predict_ms": 1000}
    assert stops("openai", 4, **on) == {**stops("grpc", 0, **on), "n_indent": 4}
    assert stops("llama", 8, **on) == {"stop": ["\n"], "n_indent": 8, "t_max_predict_ms": 1000}
    assert stops("llama", 8) == {"n_indent": 8}  # off: nothing sent
    assert indent_at("def f():\n    if x:\n        ret", 30) == 8
    assert indent_at("x = 1", 3) == 0
