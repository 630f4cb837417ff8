"""The soak's editor phase: the typists of ``make loadtest PROFILE=editor`` through the OpenAI
API, each request a streamed completion of a long file prefix abandoned at the next keystroke.

An earlier soak found traffic of this shape crashed Triton, wedged ``ensemble_stream`` and leaked
the API's capacity; the soak's other phases never send it. The API is started here in front of
the soak's Triton (as the load test starts it, :class:`loadtest.api_process.ApiProcess`) and
stopped after the phase. Every request is a request event of kind ``editor``
(:class:`~loadtest.soak.send.Requests`: answered -> ok, abandoned -> abandoned, an error ->
rejected with its category), so the accounting, the error list and the stall check
(:mod:`loadtest.soak.checks`) cover it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from contract.corpus import held_out_files
from loadtest.api_process import ApiProcess
from loadtest.editor.drive import Typing, progress_line
from loadtest.editor.figures import ABANDONED, ANSWERED, EditorRecord, editor_figures
from loadtest.editor.protocols import Sender
from loadtest.editor.suffix import ProbeError, probe
from loadtest.editor.typist import TypingStyle, Typist
from loadtest.editor.window import CheckpointTokenizer, Clipper
from loadtest.soak.cases import ABANDONED as LEDGER_ABANDONED
from loadtest.soak.cases import EDITOR, OK, REJECTED, classify_error
from loadtest.soak.checks import FAIL, PASS, SKIP, Check
from loadtest.soak.send import Outcome, Requests
from loadtest.soak.server import Sampler
from loadtest.soak.settings import SoakSettings
from reporting.triton import model_context
from serving.paths import checkpoint_dir

log = logging.getLogger("soak")
TRANSPORT = "openai-sse"
# Pauses shorter than the editor profile's typist makes (0.4-2.5 s), so that a good share of the
# requests is abandoned before or during its stream, which is the traffic this phase is for.
SOAK_STYLE = TypingStyle(pause_s=(0.1, 1.0))


def _status(record: EditorRecord) -> tuple[str, str]:
    """The ledger's status and error category of an editor request."""
    if record.outcome == ANSWERED:
        return OK, ""
    if record.outcome == ABANDONED:
        return LEDGER_ABANDONED, ""
    return REJECTED, classify_error(record.error)


def lone_first_token_s(
    sender: Sender, clipper: Clipper, with_suffix: bool, seed: int
) -> float | None:
    """First token of one full-context request alone on the idle server: the machine's speed,
    which the stall check scales its bound to (loadtest.soak.checks)."""
    visit = next(Typist(0, held_out_files(), seed).visits())
    window = clipper.clip(visit.text, visit.pause.cursor, with_suffix, visit.pause.suffix_at)
    exchange = sender.open(window.prefix, window.suffix, seed)
    if not exchange.wait(time.monotonic() + 120.0):
        exchange.abandon()
    return exchange.first_token_s


def run_editor_phase(
    settings: SoakSettings, requests: Requests, sampler: Sampler
) -> tuple[float, float, dict[str, Any]]:
    """The phase; (begin, end) in wall-clock time and what it did, for the report."""
    begin = time.time()
    if settings.editor_duration_s <= 0:
        return begin, begin, {"done": False, "note": "skipped (--editor-duration 0)"}
    sampler.phase = "editor"
    api = ApiProcess(settings.endpoints.grpc, settings.out / "openai_api.log")
    try:
        try:
            clipper = Clipper(
                CheckpointTokenizer(checkpoint_dir(settings.model_repository)),
                model_context(settings.model_repository),
                settings.editor_max_tokens,
            )
            api.start()
            api.wait_ready()
        except (OSError, TimeoutError, RuntimeError, ValueError) as exc:
            # the phase cannot run (no tokenizer, the API not ready: Triton gone): a failed
            # check in the report, not a soak without one
            return begin, time.time(), {"done": False, "error": f"{type(exc).__name__}: {exc}"}
        sender = Sender("openai", api.url.removeprefix("http://"), settings.editor_max_tokens)
        try:
            mode = probe(sender.open, True)
        except ProbeError as exc:
            return begin, time.time(), {"done": False, "error": str(exc)}
        (log.warning if mode.refused else log.info)(f"editor phase: {mode.note}")
        style = SOAK_STYLE
        lone = lone_first_token_s(sender, clipper, mode.send, settings.seed)
        log.info(f"editor phase: a full-context request alone: first token {lone or 0:.2f} s")

        def end(ticket: Any, record: EditorRecord) -> None:
            status, category = _status(record)
            first = None if record.first_token_ms is None else record.first_token_ms / 1000
            requests.end(ticket, Outcome(status, category, record.error, first))

        typing = Typing(
            held_out_files(),
            settings.editor_typists,
            sender,
            clipper,
            mode,
            settings.seed,
            style,
            begin=lambda: requests.begin(EDITOR, "", TRANSPORT),
            end=end,
        )
        log.info(
            f"editor phase: {settings.editor_typists} typists through the API for "
            f"{settings.editor_duration_s:.0f}s, prompts up to {clipper.budget} tokens"
        )
        began = time.monotonic()
        begin = time.time()
        typing.start(began + settings.editor_duration_s)
        while typing.join(settings.progress_every_s):
            elapsed = time.monotonic() - began
            log.info(progress_line(typing, "soak editor", elapsed, settings.editor_duration_s))
            if time.monotonic() - began > settings.editor_duration_s + style.longest_step_s + 30:
                break
        typing.stop.set()
        stuck = typing.join(5.0)
        end_s = time.time()
        records, _ = typing.snapshot()
    finally:
        api.stop()
    figures = editor_figures(records)
    return (
        begin,
        end_s,
        {
            "done": True,
            "typists": settings.editor_typists,
            "duration_s": settings.editor_duration_s,
            "max_tokens": settings.editor_max_tokens,
            "prompt_budget_tokens": clipper.budget,
            "lone_first_token_s": lone,
            "suffix": asdict(mode),
            "stuck_typists": stuck,
            "typist_failures": typing.failures,
            "figures": asdict(figures),
        },
    )


def editor_check(phase: dict[str, Any]) -> Check:
    """The phase ran, and its requests were answered or abandoned: none failed."""
    name = "editor requests answered or abandoned"
    if not phase.get("done"):
        if "error" in phase:
            return Check(name, FAIL, f"the editor phase could not start: {phase['error']}")
        return Check(name, SKIP, str(phase.get("note", "not run")))
    f = phase["figures"]
    problems = [*phase["typist_failures"]]
    if phase["stuck_typists"]:
        problems.append(f"{phase['stuck_typists']} typist(s) stuck")
    suffix = "" if phase["suffix"]["send"] else " (PREFIX-ONLY: the server refused the suffix)"
    return Check(
        name,
        PASS if f["errors"] == 0 and not problems else FAIL,
        f"{f['requests']} sent: {f['answered']} answered, {f['abandoned']} abandoned, "
        f"{f['errors']} failed; first token p50 {f['first_token_ms']['p50'] or 0:.0f} ms"
        + suffix
        + ("; " + "; ".join(problems) if problems else ""),
    )
