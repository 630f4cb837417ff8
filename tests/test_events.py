"""The one result schema (reporting/events.py): Locust's request events become rows, the rows
survive a CSV round trip, and the summary every report prints is computed from them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reporting import events


class Environment:
    """Locust's ``Environment.events.request`` hook, as far as a listener sees it. Locust itself
    is not imported: it monkey-patches the test process for gevent."""

    def __init__(self) -> None:
        listeners = []
        fire = lambda **kwargs: [listener(**kwargs) for listener in listeners]  # noqa: E731
        self.events = SimpleNamespace(
            request=SimpleNamespace(add_listener=listeners.append, fire=fire)
        )


def _fire(env: Environment, name: str, ms: float, **context) -> None:
    exception = context.pop("exception", None)
    env.events.request.fire(
        request_type="openai",
        name=name,
        response_time=ms,
        response_length=0,
        exception=exception,
        context=context,
    )


def test_locust_events_become_rows_with_their_context(tmp_path):
    env = Environment()
    log = events.EventLog(profile="editor", system="openvino").attach(env)
    _fire(env, "one-line", 120.0, first_token_ms=40.0, tokens=9)
    log.stamp(system="llama.cpp")
    _fire(env, "one-line", 90.0, first_token_ms=30.0, tokens=7, outcome="abandoned")
    _fire(env, "one-line", 5.0, exception=RuntimeError("503 queue full"), tokens=0)

    frame = events.load(log.save(tmp_path / "events.csv"))
    assert list(frame.columns[: len(events.COLUMNS)]) == list(events.COLUMNS)
    assert frame["system"].tolist() == ["openvino", "llama.cpp", "llama.cpp"]
    assert frame["outcome"].tolist() == ["ok", "abandoned", "error"]
    assert frame["error"].tolist() == ["", "", "503 queue full"]
    assert frame["first_token_ms"].tolist()[:2] == [40.0, 30.0]


def test_an_unknown_outcome_is_refused():
    log = events.EventLog()
    with pytest.raises(ValueError, match="outcome 'lost'"):
        log.on_request("http", "x", 1.0, context={"outcome": "lost"})


def test_summary_counts_outcomes_and_takes_percentiles_of_ok_rows_only():
    log = events.EventLog(profile="bench")
    for i, ms in enumerate((100.0, 200.0, 300.0, 400.0)):
        log.record(
            system="a",
            name="n",
            latency_ms=ms,
            first_token_ms=ms / 4,
            tokens=10,
            outcome="ok",
            started_s=float(i),
        )
    log.record(
        system="a", name="n", latency_ms=9999.0, tokens=3, outcome="abandoned", started_s=0.5
    )
    log.record(system="a", name="n", latency_ms=1.0, tokens=0, outcome="shed", started_s=1.5)
    summary = events.summarize(log.frame(), by=["system"]).iloc[0]
    assert (summary.requests, summary.failures, summary.abandoned, summary.shed) == (6, 0, 1, 1)
    assert summary.latency_p50_ms == pytest.approx(250.0)
    assert summary.first_token_p50_ms == pytest.approx(62.5)
    # span: first send at 0 s, last answer at 0.5 + 9.999 s; 43 tokens over it
    assert summary.tokens_per_s == pytest.approx(43 / 10.499)
    assert "| system" in events.markdown(events.summarize(log.frame(), by=["system"]))


def test_a_row_without_a_latency_is_kept():
    log = events.EventLog(profile="editor")
    log.record(name="resend", latency_ms=None, outcome="error", error="no answer")
    assert log.frame()["latency_ms"].isna().all() and len(log) == 1
