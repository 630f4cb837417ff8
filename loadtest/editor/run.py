"""``make loadtest PROFILE=editor``: simulated typists against the served model, with the
engine's prefix cache on and then off.

    python -m loadtest.editor --protocol openai [--quick] [--no-compare --host 127.0.0.1:8000]

By default (the comparison) the same typists (same seed) type twice, each half against a Triton
this run starts on free ports from a copy of the model repository whose engine config sets
``prefix_caching`` true, then false (:mod:`loadtest.editor.compare`, which also evaluates the
targets and writes ``comparison.md``); a server already at ``--host`` is left alone. With
``--no-compare``, one run against the server at ``--host``, as configured. Exit status: 0, every
target met (or the single run clean); 1, a problem (a typist died, no drain, no answer after
the run); 3, the comparison ran but missed a target.

Each run, in order: find or start Triton (and, for ``openai``, the API in front of it) as the
sweep does (:mod:`loadtest.targets`); the held-out files (:mod:`contract.corpus`) and the
checkpoint's tokenizer and context; the suffix probe (:mod:`loadtest.editor.suffix`); the typists
(:mod:`loadtest.editor.drive`) between two readings of the engine's counters, the second after
the server drained; one plain request to see that the server answers normally after the run;
the report (:mod:`loadtest.editor.report`). Traffic only goes to this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

from contract import metrics as names
from contract.corpus import held_out_files
from contract.tensors import ENGINE_MODEL, STREAM_MODEL
from loadtest import console
from loadtest.editor.compare import (
    HALVES,
    OFF,
    ON,
    Comparison,
    cache_repository,
    check_caching,
    write_comparison,
)
from loadtest.editor.drill import (
    DRILL_TOKENS,
    DrillFigures,
    abandon_at_first_piece,
    drill_figures,
    drill_prompts,
)
from loadtest.editor.drive import Typing, progress_line
from loadtest.editor.figures import ERROR, EngineFigures, editor_figures, engine_figures
from loadtest.editor.protocols import SAMPLING, Sender
from loadtest.editor.report import EditorRun, write_report
from loadtest.editor.settings import parse_args
from loadtest.editor.suffix import ProbeError, probe
from loadtest.editor.typist import TypingStyle
from loadtest.editor.window import CheckpointTokenizer, Clipper
from loadtest.metrics import snapshot_deltas
from loadtest.results import MachineInfo
from loadtest.targets import TARGETS, OpenAITarget, TritonTarget
from reporting.machine import cpu_flags
from reporting.triton import Endpoints, model_context, read_snapshot, wait_for_drain
from serving.paths import REPO_ROOT, checkpoint_dir
from serving.process import free_ports, http_ready

log = logging.getLogger("loadtest.editor")
RESULTS = REPO_ROOT / "loadtest" / "results"


TARGETS_MISSED = 3  # exit status: the comparison ran cleanly but missed a target


def _address(protocol: str, server: TritonTarget | OpenAITarget) -> str:
    if protocol == "grpc":
        return server.endpoints.grpc
    return server.users_url.removeprefix("http://")


def main(argv: list[str] | None = None) -> int:
    args, endpoints = parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    kind = "compare" if args.compare else args.protocol
    out = args.out or RESULTS / f"{stamp}-editor-{kind}"
    out.mkdir(parents=True, exist_ok=True)
    console()
    log.info(f"run folder {out}")
    command = " ".join(["python -m loadtest.editor", *(argv or sys.argv[1:])])
    if args.compare:
        return compare(args, endpoints, out, command)
    run = type_once(args, endpoints, args.model_repository, out, command)
    for problem in run.problems:
        log.error(f"problem: {problem}")
    return 1 if run.problems else 0


def compare(args: argparse.Namespace, endpoints: Endpoints, out: Path, command: str) -> int:
    """The same typists (same seed) twice, each half on a Triton this run starts on free ports
    from a copy of the model repository whose engine config sets ``prefix_caching``."""
    if http_ready(f"{endpoints.http_url}/v2/health/ready"):
        log.info(
            f"the server at {endpoints.host} is left alone: the comparison starts its own two "
            "servers, one with the prefix cache on and one with it off (--no-compare uses it)"
        )
    runs: dict[str, EditorRun] = {}
    loads: dict[str, tuple[float, float]] = {}
    copies = Path(tempfile.mkdtemp(prefix="editor-compare-"))  # outside the source tree
    try:
        for label, caching in HALVES:
            folder = out / label
            repository = cache_repository(args.model_repository, copies / label, caching)
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repository / ENGINE_MODEL / "config.pbtxt", folder / "engine_config.pbtxt")
            runs[label], loads[label] = _half(args, repository, folder, command, caching)
    finally:
        shutil.rmtree(copies, ignore_errors=True)
    comparison = Comparison(
        out.name,
        runs[ON],
        runs[OFF],
        loads,
        cpu_flags(),
        datetime.now().isoformat(timespec="seconds"),
    )
    paths = write_comparison(out, comparison)
    for target in comparison.targets:
        log.info(f"target: {target.verdict} {target.name}: {target.measured}")
    log.info("comparison: " + ", ".join(p.name for p in paths) + f" in {out}")
    problems = [f"{label}: {p}" for label, run in runs.items() for p in run.problems]
    for problem in problems:
        log.error(f"problem: {problem}")
    if problems:
        return 1
    return 0 if comparison.all_pass else TARGETS_MISSED


def _half(
    args: argparse.Namespace, repository: Path, folder: Path, command: str, caching: bool
) -> tuple[EditorRun, tuple[float, float]]:
    """One half on a Triton started on free ports; with the load average around it."""
    http, grpc, metrics = free_ports(3)
    half = Endpoints(
        f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics"
    )
    log.info(f"--- {folder.name}: prefix_caching {str(caching).lower()} ---")
    before = os.getloadavg()[0]
    run = type_once(args, half, repository, folder, command, expect_caching=caching, fresh=True)
    return run, (before, os.getloadavg()[0])


def type_once(
    args: argparse.Namespace,
    endpoints: Endpoints,
    model_repository: Path,
    out: Path,
    command: str,
    expect_caching: bool | None = None,
    fresh: bool = False,
) -> EditorRun:
    """One run of the typists against the server at ``endpoints`` (found or started; with
    ``fresh``, always started here), its report written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = held_out_files()
    if not files:
        raise SystemExit("no held-out standard-library files found to type")
    tokenizer = CheckpointTokenizer(checkpoint_dir(model_repository))
    clipper = Clipper(
        tokenizer,
        model_context(model_repository),
        args.max_tokens,
        args.suffix_share,
        args.anchor_chars,
    )
    style = TypingStyle(pause_s=args.pause)
    typists, duration, every = args.typists, args.duration, args.progress_every
    started = time.time()
    with ExitStack() as stack:
        target = OpenAITarget if args.protocol == "openai" else TARGETS["grpc"].server
        server = stack.enter_context(target(endpoints, model_repository, out))
        if fresh and not _started_here(server):
            raise SystemExit(f"a server already answered at {endpoints.host}: not one of ours")
        if expect_caching is not None:
            check_caching(out / "tritonserver.log", expect_caching)
        if not server.model_ready(STREAM_MODEL):
            raise SystemExit(f"`{STREAM_MODEL}` is not ready at {endpoints.host}")
        sender = Sender(args.protocol, _address(args.protocol, server), args.max_tokens)
        try:
            mode = probe(sender.open, not args.no_suffix)
        except ProbeError as exc:
            raise SystemExit(f"cannot run the editor profile: {exc}") from None
        (log.warning if mode.refused else log.info)(mode.note)
        wait_for_drain(endpoints.metrics_url, 60.0)
        log.info(
            f"{typists} typists over {len(files)} held-out files for {duration:.0f}s via "
            f"{args.protocol}; context {clipper.context} tokens, {args.max_tokens} per completion"
        )
        before = read_snapshot(endpoints.metrics_url)
        typing = Typing(files, typists, sender, clipper, mode, args.seed, style)
        began = time.monotonic()
        typing.start(began + duration)
        label = f"editor {args.protocol}"
        while typing.join(every):
            if time.monotonic() - began >= duration + style.longest_step_s + 30:
                break  # a typist's last request is bounded by its pause: reported below
            log.info(progress_line(typing, label, time.monotonic() - began, duration))
        problems = list(typing.failures)
        busy = typing.join(0.0)
        if busy:
            problems.append(f"{busy} typist(s) still busy after the run's end")
        typing.stop.set()
        log.info(progress_line(typing, label, time.monotonic() - began, duration))
        log.info("typing over; waiting for the server to drain")
        drained, drain_s = wait_for_drain(endpoints.metrics_url, 120.0)
        engine: EngineFigures | None = None
        note = ""
        records, _ = typing.snapshot()
        try:
            deltas = snapshot_deltas(before, read_snapshot(endpoints.metrics_url))
            increases = {
                name: value
                for (name, model), value in deltas.values.items()
                if model == ENGINE_MODEL
            }
            engine = engine_figures(increases, records, exact_tokens=args.protocol == "grpc")
        except OSError as exc:
            note = str(exc)
        if drained is None or drained.running or drained.pending:
            problems.append(f"the server did not drain within {drain_s:.0f} s: {drained}")
        drill = None
        if args.drill:
            drill_clipper = Clipper(tokenizer, clipper.context, DRILL_TOKENS)
            prompts = drill_prompts(
                files, lambda text, at: drill_clipper.clip(text, at, False).prefix, args.drill
            )
            drill = _drill(args.protocol, _address(args.protocol, server), endpoints, prompts)
            log.info(
                f"abandonment drill: {drill.abandoned} of {drill.requests} abandoned at their "
                f"first piece; at most {drill.unread_per_abandoned} tokens generated after the "
                f"client left, per abandoned request (each: {drill.unread_each})"
            )
        after = _after_check(sender)
        if not after.startswith("answered"):
            problems.append(f"after the run: {after}")
        run = EditorRun(
            name=out.name,
            started=datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            seconds=round(time.time() - started, 1),
            command=command,
            protocol=args.protocol,
            settings={
                "typists": typists,
                "duration_s": duration,
                "max_tokens": args.max_tokens,
                "suffix_share": args.suffix_share,
                "anchor_chars": args.anchor_chars,
                "drill": args.drill,
                "context": clipper.context,
                "files": len(files),
                "seed": args.seed,
                "sampling": SAMPLING,
                "engine_note": note,
                "prefix_caching": "as configured" if expect_caching is None else expect_caching,
                **{k: v for k, v in asdict(style).items() if k != "pauses_per_file"},
            },
            suffix={**asdict(mode), "refused": mode.refused},
            figures=editor_figures(records, engine),
            after=after,
            problems=problems,
            machine=MachineInfo.here(),
            model=server.describe(),
            drill=drill,
        )
        paths = write_report(out, run, records)
    f = run.figures
    log.info(
        f"{f.requests} requests: {f.answered} answered, {f.abandoned} abandoned, {f.errors} "
        f"errors; first token p50 {f.first_token_ms.p50 or 0:.0f} ms p95 "
        f"{f.first_token_ms.p95 or 0:.0f} ms"
    )
    if mode.refused:
        log.warning(mode.note)
    log.info("report: " + ", ".join(p.name for p in paths) + f" in {out}")
    return run


def _drill(protocol: str, address: str, endpoints: Endpoints, prompts: list[str]) -> DrillFigures:
    """The abandonment drill (:mod:`loadtest.editor.drill`): one request at a time, each
    between two readings of the engine's counters, the second once the engine finished it."""
    sender = Sender(protocol, address, DRILL_TOKENS)
    outcomes = []
    for seed, prompt in enumerate(prompts):
        try:
            before = _engine_counts(endpoints.metrics_url)
        except OSError as exc:
            log.warning(f"the engine's counters could not be read for the drill: {exc}")
            before = None
        outcome = abandon_at_first_piece(sender.open(prompt, "", seed=seed))
        generated = None
        if before is not None:
            limit = 5.0 if outcome.outcome == ERROR else 60.0  # a refused one never got there
            generated = _tokens_once_finished(endpoints.metrics_url, before, limit)
        outcomes.append(replace(outcome, generated=generated))
    return drill_figures(outcomes, DRILL_TOKENS, sse=protocol == "openai")


def _engine_counts(metrics_url: str) -> tuple[float, float]:
    """The engine's finished sequences and generated tokens so far."""
    snapshot = read_snapshot(metrics_url)
    return (
        snapshot.value(names.ENGINE_REQUESTS, model=ENGINE_MODEL),
        snapshot.value(names.ENGINE_GENERATED_TOKENS, model=ENGINE_MODEL),
    )


def _tokens_once_finished(
    metrics_url: str, before: tuple[float, float], limit_s: float
) -> float | None:
    """The tokens generated since ``before``, read once the engine's finished-sequences
    counter has moved on (the engine counts a sequence's tokens as it finishes it, cancelled
    or not); None if it did not within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if _engine_counts(metrics_url)[0] > before[0]:
                return _engine_counts(metrics_url)[1] - before[1]
        time.sleep(0.05)
    return None


def _started_here(server: TritonTarget | OpenAITarget) -> bool:
    triton = server.triton if isinstance(server, OpenAITarget) else server
    return triton.started


def _after_check(sender: Sender) -> str:
    """One short prefix-only request, given 30 s: does the server answer normally now?"""
    exchange = sender.open("import os\n", "", seed=0)
    exchange.wait(time.monotonic() + 30.0)
    if exchange.finished:
        return f"answered a plain request in {1000 * (exchange.latency_s or 0):.0f} ms"
    if not exchange.over:
        exchange.abandon()
        return "NO ANSWER to a plain request within 30 s"
    return f"a plain request FAILED: {exchange.error}"
