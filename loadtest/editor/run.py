"""``make loadtest PROFILE=editor``: simulated typists against the served model, one run.

    python -m loadtest.editor --protocol openai --host 127.0.0.1:8000 [--quick]

In order: find or start Triton (and, for ``openai``, the API in front of it) as the sweep does
(:mod:`loadtest.targets`); the held-out files (:mod:`contract.corpus`) and the checkpoint's
tokenizer and context; the suffix probe (:mod:`loadtest.editor.suffix`); the typists
(:mod:`loadtest.editor.drive`) between two readings of the engine's counters, the second after
the server drained; one plain request to see that the server answers normally after the run;
the report (:mod:`loadtest.editor.report`). Traffic only goes to this machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from contract.corpus import held_out_files
from contract.tensors import ENGINE_MODEL, STREAM_MODEL
from loadtest.editor.drive import Typing, progress_line
from loadtest.editor.figures import EngineFigures, editor_figures, engine_figures
from loadtest.editor.protocols import SAMPLING, Sender
from loadtest.editor.report import EditorRun, write_report
from loadtest.editor.suffix import ProbeError, probe
from loadtest.editor.typist import TypingStyle
from loadtest.editor.window import CheckpointTokenizer, Clipper
from loadtest.machine import machine_info
from loadtest.metrics import read_snapshot, snapshot_deltas
from loadtest.soak.server import model_context, wait_for_drain
from loadtest.targets import TARGETS, Endpoints, OpenAITarget, TritonTarget
from serving.paths import MODEL_REPOSITORY, REPO_ROOT, checkpoint_dir

log = logging.getLogger("loadtest.editor")
RESULTS = REPO_ROOT / "loadtest" / "results"
PROTOCOLS = ("openai", "grpc")


@dataclass(frozen=True)
class Preset:
    typists: int
    duration: float
    progress_every: float


DEFAULTS = Preset(4, 90.0, 10.0)
QUICK = Preset(2, 25.0, 5.0)  # with the server's start and the drain, about a minute


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.editor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="openai", help="openai (SSE) or grpc")
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--typists", type=int, help=f"simulated typists ({DEFAULTS.typists})")
    p.add_argument("--duration", type=float, help=f"seconds of typing ({DEFAULTS.duration:.0f})")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per completion (32)")
    p.add_argument(
        "--no-suffix", action="store_true", help="send prefixes only (default: with suffixes)"
    )
    p.add_argument("--suffix-share", type=float, default=0.25, help="of the prompt budget (0.25)")
    p.add_argument(
        "--pause",
        type=_pair,
        default=TypingStyle().pause_s,
        help="a pause's shortest and longest seconds, MIN,MAX (%(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    p.add_argument("--progress-every", type=float, help="seconds between progress lines")
    p.add_argument(
        "--out", type=Path, help="run folder (loadtest/results/<time>-editor-<protocol>)"
    )
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    return p


def _pair(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"expected 0 < MIN <= MAX, got {text!r}")
    return low, high


def _console() -> None:
    logger = logging.getLogger("loadtest")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[loadtest] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _address(protocol: str, server: TritonTarget | OpenAITarget) -> str:
    if protocol == "grpc":
        return server.endpoints.grpc
    return server.users_url.removeprefix("http://")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    typists = args.typists or preset.typists
    duration = args.duration or preset.duration
    every = args.progress_every or preset.progress_every
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {args.host}")
    if typists < 1 or duration <= 0 or args.max_tokens < 1:
        p.error("--typists and --max-tokens must be >= 1 and --duration > 0")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"{stamp}-editor-{args.protocol}"
    out.mkdir(parents=True, exist_ok=True)
    _console()
    log.info(f"run folder {out}")
    files = held_out_files()
    if not files:
        raise SystemExit("no held-out standard-library files found to type")
    checkpoint = checkpoint_dir(args.model_repository)
    clipper = Clipper(
        CheckpointTokenizer(checkpoint),
        model_context(args.model_repository),
        args.max_tokens,
        args.suffix_share,
    )
    style = TypingStyle(pause_s=args.pause)
    started = time.time()
    with ExitStack() as stack:
        target = OpenAITarget if args.protocol == "openai" else TARGETS["grpc"].server
        server = stack.enter_context(target(endpoints, args.model_repository, out))
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
        after = _after_check(sender)
        if not after.startswith("answered"):
            problems.append(f"after the run: {after}")
        run = EditorRun(
            name=out.name,
            started=datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            seconds=round(time.time() - started, 1),
            command=" ".join(["python -m loadtest.editor", *(argv or sys.argv[1:])]),
            protocol=args.protocol,
            settings={
                "typists": typists,
                "duration_s": duration,
                "max_tokens": args.max_tokens,
                "suffix_share": args.suffix_share,
                "context": clipper.context,
                "files": len(files),
                "seed": args.seed,
                "sampling": SAMPLING,
                "engine_note": note,
                **{k: v for k, v in asdict(style).items() if k != "pauses_per_file"},
            },
            suffix={**asdict(mode), "refused": mode.refused},
            figures=editor_figures(records, engine),
            after=after,
            problems=problems,
            machine=machine_info(),
            model=server.describe(),
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
    for problem in problems:
        log.error(f"problem: {problem}")
    return 1 if problems else 0


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
