"""``make loadtest PROFILE=editor``: simulated typists (Locust users) against two systems in
mirrored windows, or one (:mod:`loadtest.editor.settings`; docs/editor-load.md describes a run).

Exit status: 0, every target met (a single run: clean); 1, a problem (a typist stuck, no drain,
no answer after the run); 3, the run was clean but missed a target.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import pandas as pd

# isort: off
# the typists' module imports Locust, which monkey-patches the process with gevent: first
from loadtest.editor.users import Windows

# isort: on
from contract.corpus import held_out_files
from loadtest import console
from loadtest.editor.drill import DRILL_TOKENS, drill_prompts, resend_points, run_drill, run_resend
from loadtest.editor.figures import PASS, evaluate, system_figures
from loadtest.editor.protocols import SAMPLING, Sender
from loadtest.editor.report import write_report
from loadtest.editor.settings import mirrored, parse_args
from loadtest.editor.suffix import ProbeError, probe
from loadtest.editor.systems import T_MAX_PREDICT_MS, System, open_systems
from loadtest.editor.typist import TypingStyle
from loadtest.editor.window import MARGIN_TOKENS, CheckpointTokenizer, Clipper
from reporting.events import EventLog
from reporting.machine import describe
from reporting.triton import model_context
from serving.paths import REPO_ROOT, checkpoint_dir
from serving.process import http_ready

log = logging.getLogger("loadtest.editor")
TARGETS_MISSED = 3  # exit status: the run was clean but missed a target


def main(argv: list[str] | None = None) -> int:
    args, endpoints = parse_args(argv)
    kind = f"vs-{args.peer}" if args.peer else "compare" if args.compare else args.protocol
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / "loadtest" / "results" / f"{stamp}-editor-{kind}"
    out.mkdir(parents=True, exist_ok=True)
    console()
    log.info(f"run folder {out}")
    command = " ".join(["python -m loadtest.editor", *(argv if argv is not None else sys.argv[1:])])
    if args.compare and http_ready(f"{endpoints.http_url}/v2/health/ready"):
        log.info(f"the server at {endpoints.host} is left alone: the comparison starts its own")
    with tempfile.TemporaryDirectory(prefix="editor-compare-") as copies, ExitStack() as stack:
        systems, servers = open_systems(args, endpoints, out, Path(copies), stack)
        run = _type(args, systems, servers, out, command)
    for target in run["targets"]:
        log.info(f"target: {target.verdict} {target.name}: {target.measured}")
    for problem in run["problems"]:
        log.error(f"problem: {problem}")
    log.info(f"report: {out / 'report.md'}")
    if run["problems"]:
        return 1
    passed = all(t.verdict == PASS for t in run["targets"])
    return 0 if passed or not args.compare else TARGETS_MISSED


def _type(args: argparse.Namespace, systems: dict[str, System], servers: dict[str, str],
          out: Path, command: str) -> dict:  # fmt: skip
    """Probe, the windows, the drills and the after-checks; the report written."""
    started, files = time.time(), held_out_files()
    if not files:
        raise SystemExit("no held-out standard-library files found to type")
    tokenizer = CheckpointTokenizer(checkpoint_dir(args.model_repository))
    context = model_context(args.model_repository)
    budget = min(context, args.prompt_tokens + args.max_tokens + MARGIN_TOKENS)
    clipper = Clipper(tokenizer, budget, args.max_tokens, args.suffix_share, args.anchor_chars)
    try:
        mode = probe(next(iter(systems.values())).sender.open, not args.no_suffix)
    except ProbeError as exc:
        raise SystemExit(f"cannot run the editor profile: {exc}") from None
    (log.warning if mode.refused else log.info)(mode.note)
    style, events = TypingStyle(pause_s=args.pause), EventLog(profile="editor")
    windows = Windows(files, args.typists, clipper, mode.send, style, args.seed, args.one_line,
                      events)  # fmt: skip
    order, window_s, problems = mirrored(list(systems), args.windows), args.duration, []
    window_s /= args.windows
    load = {label: (os.getloadavg()[0], 0.0) for label in systems}
    log.info(f"{args.typists} typists over {len(files)} files, windows of {window_s:.0f} s: "
             f"{', '.join(order)}; prompts up to {clipper.budget} tokens")  # fmt: skip
    for number, label in enumerate(systems, start=1) if args.warm_up else ():
        log.info(f"warming {label} up for {args.warm_up:.0f} s (not counted)")
        windows.run(systems[label], -number, args.warm_up, problems)  # numbered below zero
    rows = []
    for number, label in enumerate(order):
        rows.append(windows.run(systems[label], number, window_s, problems))
        load[label] = (load[label][0], os.getloadavg()[0])
    drill_clipper = Clipper(tokenizer, budget, DRILL_TOKENS)
    prompts = drill_prompts(files, lambda t, i: drill_clipper.clip(t, i, False).prefix, args.drill)
    pairs = [(clipper.clip(text, at, False).prefix, clipper.clip(text, at + 3, False).prefix)
             for text, at in resend_points(files, args.resend)]  # fmt: skip
    drills, afters = {}, {}
    for label, system in systems.items():
        run_resend(system, pairs, events)
        if args.drill:
            drills[label] = run_drill(system, prompts)
            log.info(f"abandonment drill, {label}: {drills[label]['unread_per_abandoned']} "
                     "tokens after the client left per abandoned request (at most)")  # fmt: skip
        afters[label] = after_check(system.sender)
    frame, table = events.frame(), pd.DataFrame(rows)
    frame = frame[~(pd.to_numeric(frame["window"], errors="coerce") < 0)]  # warm-ups: not counted
    figures = system_figures(frame, table)
    settings = {**vars(args), "window_s": window_s, "order": order, "context": context,
                "prompt_tokens": clipper.budget, "files": len(files), "sampling": SAMPLING,
                "resend": len(pairs), "t_max_predict_ms": T_MAX_PREDICT_MS}  # fmt: skip
    run = {
        "name": out.name, "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1), "command": command,
        "protocol": args.protocol, "settings": settings, "suffix": vars(mode), "figures": figures,
        "drills": drills, "afters": afters,
        "targets": evaluate(figures, drills, afters, args.one_line),
        "problems": problems + [f"{s}: after: {a}" for s, a in afters.items()
                                if not a.startswith("answered")],
        "machine": describe(), "servers": servers, "load": load,
    }  # fmt: skip
    frame.to_csv(out / "events.csv", index=False)
    write_report(out, run, frame, table)
    return run


def after_check(sender: Sender) -> str:
    """One short prefix-only request, given 30 s: does the server answer normally now?"""
    exchange = sender.open("import os\n", "", seed=0)
    exchange.wait(time.monotonic() + 30.0)
    if exchange.finished:
        return f"answered a plain request in {1000 * (exchange.latency_s or 0):.0f} ms"
    if not exchange.over:
        exchange.abandon()
        return "NO ANSWER to a plain request within 30 s"
    return f"a plain request FAILED: {exchange.error}"
