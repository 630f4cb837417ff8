"""The editor profile without a server: the typists' schedule, the context window, the suffix
decision, the figures and the report."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from client.results import CodegenError, Piece
from contract.corpus import held_out_files, stdlib_root
from loadtest.editor.drill import DrillOutcome, drill_figures, points
from loadtest.editor.protocols import Exchange, Sender, request_event
from loadtest.editor.report import Target, evaluate, system_figures, write_report
from loadtest.editor.suffix import ProbeError, SuffixMode, probe
from loadtest.editor.typist import TypingStyle, Typist, keystroke, line_starts, pauses
from loadtest.editor.window import (
    CHUNK_LINES,
    CONTEXT_CHUNKS,
    MARGIN_TOKENS,
    Clipper,
    Window,
    neighbour_chunks,
)
from modelbuild.corpus import split
from reporting.events import EventLog
from reporting.machine import describe

TEXT = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(60))


# --- held-out files --------------------------------------------------------------------------


def test_the_typed_files_are_exactly_those_make_model_holds_out():
    train, valid = split()
    held = held_out_files()
    assert held == valid and held, "the editor types the model build's held-out files"
    assert not set(held) & set(train)
    assert all(p.is_relative_to(stdlib_root()) for p in held)


# --- typists ---------------------------------------------------------------------------------


def test_the_schedule_is_the_same_for_the_same_seed_and_differs_between_typists(tmp_path):
    files = []
    for i in range(3):
        path = tmp_path / f"m{i}.py"
        path.write_text(TEXT.replace("x", f"v{i}"))
        files.append(path)

    def first(index: int, seed: int, n: int = 30):
        visits = Typist(index, files, seed).visits()
        return [(v.path.name, v.pause) for v, _ in zip(visits, range(n), strict=False)]

    assert first(0, 7) == first(0, 7)
    assert first(0, 7) != first(1, 7)
    assert first(0, 7) != first(0, 8)


def test_pauses_follow_the_style_and_move_the_cursor_forward():
    style = TypingStyle(
        keystroke_s=(0.1, 0.2), burst=(2, 5), pause_s=(0.5, 1.5), pauses_per_file=50
    )
    cursor = None
    made = list(pauses(TEXT, random.Random(3), style))
    assert len(made) == 50
    for pause in made:
        assert 2 <= pause.keystrokes <= 5
        assert 0.1 * pause.keystrokes <= pause.typing_s <= 0.2 * pause.keystrokes
        assert 0.5 <= pause.pause_s <= 1.5
        assert 0 < pause.cursor <= len(TEXT)  # a prefix is never empty
        assert cursor is None or pause.cursor > cursor
        cursor = pause.cursor
    # the stretch typed is new code: the text after it is the suffix all visit long
    assert {pause.suffix_at for pause in made} == {made[-1].cursor}
    assert style.longest_step_s == pytest.approx(5 * 0.2 + 1.5)


def test_a_newline_keystroke_takes_the_indentation_and_the_file_end_stops_the_visit():
    assert keystroke("a\n    b", 0) == 1
    assert keystroke("a\n    b", 1) == 6  # the newline and the next line's indentation
    text = "a\n  b\n"
    assert line_starts(text) == [2]  # never 0 (an empty prefix), never the file's end
    style = TypingStyle(burst=(1, 1), pauses_per_file=10)
    made = list(pauses(text, random.Random(0), style))
    assert [p.cursor for p in made] == [3, 4, 5, 6]  # then the file ends: no more pauses
    assert list(pauses("no newline at all", random.Random(0), style)) == []


def test_typists_prefer_files_long_enough_for_long_prefixes(tmp_path):
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\ny = 2\n")
    long.write_text(TEXT * 3)
    assert Typist(0, [short, long], 0).files == [long]  # at least MIN_FILE_BYTES
    assert Typist(0, [short], 0).files == [short]  # better than nothing
    # a visit starts in the file's second half: the prefix is at least half the file
    for visit, _ in zip(Typist(0, [long], 0).visits(), range(50), strict=False):
        assert visit.pause.cursor >= len(visit.text) // 2 - 40


def test_a_typist_whose_files_give_no_pause_raises_instead_of_spinning(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1")
    with pytest.raises(RuntimeError, match="can be typed"):
        next(Typist(0, [empty], 0).visits())
    with pytest.raises(RuntimeError, match="none of the 0 source files"):
        next(Typist(0, [], 0).visits())


# --- the window ------------------------------------------------------------------------------


class CharEncoder:
    """One token per character: clipping is then exact and easy to check."""

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [(i, i + 1) for i in range(len(text))]


def test_the_prefix_is_clipped_from_the_left_and_the_suffix_from_the_right():
    clipper = Clipper(CharEncoder(), context=200, max_tokens=32, suffix_share=0.25)
    budget = 200 - 32 - MARGIN_TOKENS
    assert clipper.budget == budget
    cursor = 1000
    window = clipper.clip(TEXT, cursor, with_suffix=True)
    assert window.suffix == TEXT[cursor : cursor + int(budget * 0.25)]
    assert window.prefix == TEXT[cursor - (budget - len(window.suffix)) : cursor]
    assert window.prefix_tokens + window.suffix_tokens == budget
    alone = clipper.clip(TEXT, cursor, with_suffix=False)
    assert alone.suffix == "" and alone.prefix == TEXT[cursor - budget : cursor]
    # the suffix from where the stretch being typed ends, not from the cursor
    later = clipper.clip(TEXT, cursor, with_suffix=True, suffix_at=cursor + 300)
    assert later.suffix == TEXT[cursor + 300 : cursor + 300 + int(budget * 0.25)]
    assert later.prefix == window.prefix
    short = clipper.clip(TEXT, 10, with_suffix=False)
    assert short.prefix == TEXT[:10] and short.prefix_tokens == 10


def test_an_editor_sends_chunks_of_other_files_the_same_for_every_request_on_a_file(tmp_path):
    files = []
    for name in "abcd":
        path = tmp_path / f"{name}.py"
        path.write_text("".join(f"{name} = {i}\n" for i in range(CHUNK_LINES + 10)))
        files.append(path)
    chunks = neighbour_chunks(files, files[3])
    assert [c["filename"] for c in chunks] == ["a.py", "b.py"][:CONTEXT_CHUNKS]
    assert all(c["text"].count("\n") == CHUNK_LINES for c in chunks)
    assert neighbour_chunks(files, files[3]) == chunks
    assert files[3].name not in {c["filename"] for c in neighbour_chunks(files, files[3])}


def test_only_the_openai_protocol_carries_input_extra():
    sender = Sender("grpc", "127.0.0.1:1", max_tokens=8)
    with pytest.raises(ValueError, match="input_extra"):
        sender.open("x = ", "", seed=0, extra=[{"filename": "a.py", "text": "a = 1\n"}])


def test_a_context_too_small_for_the_completion_is_refused():
    with pytest.raises(ValueError, match="ask for fewer"):
        Clipper(CharEncoder(), context=40, max_tokens=32)


# --- the suffix decision ---------------------------------------------------------------------


def _ended(finished: bool = False, error: str = "") -> Exchange:
    exchange = Exchange()
    exchange.finished, exchange.error = finished, error
    return exchange


def decide(requested: bool, ended: Exchange) -> SuffixMode:
    return probe(lambda *args: ended, requested)


def test_an_answered_probe_keeps_the_suffix():
    mode = decide(True, _ended(finished=True))
    assert mode.send and not mode.refused


def test_a_refusal_naming_suffix_runs_prefix_only_and_says_so_loudly():
    for error in (
        "HTTP 400: suffix (fill in the middle) is not supported by this model [param: suffix]",
        "[request id: <id_unknown>] unexpected inference input 'suffix' for model "
        "'ensemble_stream'",
    ):
        mode = decide(True, _ended(error=error))
        assert mode.refused and not mode.send
        assert "PREFIX-ONLY" in mode.note and error in mode.note


def test_any_other_probe_failure_stops_the_run():
    with pytest.raises(ProbeError, match="another reason"):
        decide(True, _ended(error="HTTP 503: Triton is not answering"))
    with pytest.raises(ProbeError, match="no answer"):
        decide(True, Exchange())  # still running when the probe gave up


def test_no_suffix_sends_no_probe():
    sent = []
    mode = probe(lambda *args: sent.append(args) or _ended(finished=True), requested=False)
    assert not mode.send and not mode.refused and sent == []
    mode = probe(lambda *args: sent.append(args) or _ended(finished=True), requested=True)
    assert mode.send and len(sent) == 1 and sent[0][1], "the probe carries a suffix"


# --- figures and report ----------------------------------------------------------------------


def _record(ttft_ms: float | None = None, read: int = 0, **fields) -> Exchange:
    """A request as a typist's exchange ended it (``finished``: answered; ``error``: failed;
    neither: abandoned at the next keystroke)."""
    first = None if ttft_ms is None else ttft_ms / 1000
    return Exchange(first_token_s=first, pieces=read, tokens_read=read, **fields)


RECORDS = [
    *(
        _record(100.0 + i, 8, latency_s=(400.0 + i) / 1000, completion_tokens=10, finished=True)
        for i in range(10)
    ),
    *(_record(150.0, 3) for _ in range(20)),
    *(_record() for _ in range(10)),
    _record(error="HTTP 504: no answer within 12 s"),
    _record(error="HTTP 504: no answer within 7 s"),
]


def _events(records, system: str = "cache-on", protocol: str = "openai") -> pd.DataFrame:
    """The event table the Locust users would have written: each exchange through the same
    event arguments (request_event) into the one schema's listener."""
    log, window = EventLog(profile="editor", system=system, window=0), Window("", "", 900, 100)
    for i, record in enumerate(records):
        event = request_event(record, window, 1.0, 0, protocol, True, log._t0_wall + i)
        log.on_request(**event)
    return log.frame()


def _windows(system: str = "cache-on", **counters) -> pd.DataFrame:
    return pd.DataFrame(
        [{"system": system, "window": 0, "seconds": 10.0, "cpu_s": 4.0, **counters}]
    )


def test_the_figures_count_outcomes_and_percentiles_of_the_answered_only():
    f = system_figures(_events(RECORDS), _windows())["cache-on"]
    assert (f["requests"], f["answered"], f["abandoned"], f["errors"]) == (42, 10, 30, 2)
    assert f["abandoned share"] == pytest.approx(30 / 40)
    assert f["abandoned while streaming"] == 20
    assert f["first token p50 ms"] == pytest.approx(104.5)
    assert f["latency p50 ms"] == pytest.approx(404.5)
    assert f["prompt tokens sent / request"] == 1000
    assert f["CPU seconds"] == 4.0 and f["CPU ms / answered request"] == 400.0


def test_tokens_for_abandoned_requests_are_generated_minus_delivered():
    windows = _windows(
        generated=500.0,
        sequences=41.0,
        cancelled=30.0,
        prompt=41_000.0,
        reused=20_500.0,
        editor_stops=10.0,
        past_stop=0.0,
    )
    f = system_figures(_events(RECORDS), windows)["cache-on"]
    assert f["tokens delivered"] == 10 * 10 + 20 * 3  # answered: server count; abandoned: read
    assert f["generated for abandoned, unread (at most)"] == 500 - 160
    assert f["... per abandoned request (at most)"] == pytest.approx(340 / 30)
    assert f["prompt-cache reuse share (at most)"] == pytest.approx(0.5)
    assert f["tokens generated past a stop"] == 0 and f["editor stops"] == 10
    # a system without a counter (llama.cpp has no sequences) reports none, not zero
    bare = system_figures(_events(RECORDS), _windows(generated=500.0))["cache-on"]
    assert bare["sequences"] is None and bare["prompt-cache reuse share (at most)"] is None


def test_the_report_is_written_from_the_event_table_with_a_loud_prefix_only_banner(tmp_path):
    mode = decide(True, _ended(error="HTTP 400: suffix is not supported [param: suffix]"))
    events = pd.concat([_events(RECORDS), _events(RECORDS[:10], system="llama.cpp")])
    windows = pd.concat([_windows(generated=500.0), _windows("llama.cpp", generated=120.0)])
    figures = system_figures(events, windows)
    drill = drill_figures([DrillOutcome("abandoned", 1, generated=g) for g in (2.0, 4.0)])
    run = dict(
        name="test",
        started="2026-01-01T00:00:00",
        seconds=10.0,
        command="python -m loadtest.editor --quick",
        protocol="openai",
        settings={
            "typists": 2,
            "window_s": 10.0,
            "windows": 1,
            "order": ["cache-on", "llama.cpp"],
            "max_tokens": 32,
            "one_line": True,
            "t_max_predict_ms": 1000,
            "prompt_tokens": 1000,
            "context": 1024,
            "anchor_chars": 512,
            "drill": 0,
            "seed": 0,
            "resend": 0,
            "sampling": {"top_k": 40},
            "pause": TypingStyle().pause_s,
            "warm_up": 0.0,
        },
        suffix={"requested": True, "send": False, "note": mode.note, "refused": True},
        figures=figures,
        drills={"cache-on": drill},
        afters={"cache-on": "answered a plain request in 20 ms"},
        targets=evaluate(figures, {}, {"cache-on": "answered"}, one_line=True),
        problems=[],
        machine=describe(),
        servers={"cache-on": "Triton"},
        load={"cache-on": (0.5, 1.0)},
    )
    paths = write_report(tmp_path, events, windows, run)
    assert {p.name for p in paths} >= {"summary.json", "events.csv", "windows.csv", "report.md"}
    report = (tmp_path / "report.md").read_text()
    assert "**SUFFIX REFUSED" in report and "PREFIX-ONLY" in report
    # side by side, one column per system and their ratio
    assert "cache-on / llama.cpp" in report
    row = next(line for line in report.splitlines() if line[1:].strip().startswith("requests "))
    assert [c.strip() for c in row.strip("|").split("|")] == ["requests", "42", "10", "4.20"]
    assert "HTTP 504" in report  # the errors, from the table
    assert "Abandonment drill, cache-on: 2 requests of 200 tokens" in report
    assert "at most 2.00 tokens per abandoned request after the client left (median 2.0" in report
    for chart in ("editor_timeline.png", "editor_latency.png"):
        assert (tmp_path / chart).stat().st_size > 10_000 and f"]({chart})" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["figures"]["cache-on"]["abandoned"] == 30 and summary["suffix"]["refused"]
    assert summary["figures"]["llama.cpp"]["tokens generated"] == 120.0


def test_the_resend_probe_has_figures_of_its_own_apart_from_the_typists(tmp_path):
    events = _events(RECORDS)
    log = EventLog(profile="editor", system="cache-on")
    for first, latency in ((20.0, 60.0), (40.0, 100.0), (None, 60_000.0)):
        outcome = "ok" if first else "error"
        log.record(
            window="resent",
            name="resent",
            kind="openai",
            first_token_ms=first,
            latency_ms=latency,
            tokens=3,
            outcome=outcome,
        )
    f = system_figures(pd.concat([events, log.frame()]), _windows())["cache-on"]
    assert f["requests"] == 42 and f["errors"] == 2  # the typists' figures alone
    assert f["resent +3 chars: first token p50 ms"] == pytest.approx(30.0)
    assert f["resent +3 chars: latency p50 ms"] == pytest.approx(80.0)
    # the probe's points: a line start three quarters down each file that has lines enough
    (tmp_path / "a.py").write_text("".join(f"a{i}\n" for i in range(8)))
    (tmp_path / "short.py").write_text("x\ny\n")
    found = points([tmp_path / "short.py", tmp_path / "a.py"], 0.75, 2, min_lines=4)
    assert found == [((tmp_path / "a.py").read_text(), 3 * 6)] * 2  # the files in turn


def test_the_chat_drill_is_judged_beside_the_completion_drill():
    """A model that chats is drilled again through /v1/chat/completions (drills["<system>
    chat"]): its tokens after leaving count in the abandoned-requests target."""
    figures = system_figures(_events(RECORDS), _windows(generated=500.0))
    good = drill_figures([DrillOutcome("abandoned", 1, generated=2.0)])
    bad = drill_figures([DrillOutcome("abandoned", 1, generated=9.0)])
    (system,) = figures

    def verdict(drills: dict) -> Target:
        return next(t for t in evaluate(figures, drills, {}, True) if t.name.startswith("aband"))

    assert (
        "chat drill: 1.00 over 1 abandoned"
        in verdict({system: good, f"{system} chat": good}).measured
    )
    assert verdict({system: good, f"{system} chat": bad}).verdict == "FAIL"


def test_a_chat_sender_asks_the_chat_route_with_the_prefix_as_a_user_message():
    sent = {}

    class Recording:
        def openai_stream(self, body, route="completions"):
            sent.update(body=body, route=route)
            raise CodegenError("recorded")

    sender = Sender("openai", "127.0.0.1:1", max_tokens=8, chat=True)
    object.__setattr__(sender, "transport", Recording())
    assert sender.open("def f(x):\n", "", seed=3).error.endswith("recorded")
    assert sent["route"] == "chat/completions"
    assert sent["body"]["messages"] == [{"role": "user", "content": "def f(x):\n"}]
    assert "prompt" not in sent["body"] and sent["body"]["seed"] == 3
    assert Piece.from_openai({"choices": [{"delta": {"content": "x"}}]}).text == "x"
