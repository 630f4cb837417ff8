"""``make loadtest PROFILE=editor``: simulated typists (Locust users) against two systems in
mirrored windows, or one (:mod:`loadtest.editor.settings`; docs/editor-load.md describes a run).

Exit status: 0, every target met (a single run: clean); 1, a problem (a typist stuck, no drain,
no answer after the run); 3, the run was clean but missed a target.
"""

from __future__ import annotations

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
from loadtest.editor.drill import (
    CHAT_DRILL,
    DRILL_TOKENS,
    after_check,
    points,
    run_chat_drill,
    run_drill,
    run_resend,
)
from loadtest.editor.protocols import SAMPLING
from loadtest.editor.report import PASS, evaluate, system_figures, write_report
from loadtest.editor.settings import mirrored, parse_args
from loadtest.editor.suffix import ProbeError, probe
from loadtest.editor.systems import T_MAX_PREDICT_MS, open_systems
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
    if args.compare and http_ready(f"{endpoints.http_url}/v2/health/ready"):
        log.info(f"the server at {endpoints.host} is left alone: the comparison starts its own")
    with tempfile.TemporaryDirectory(prefix="editor-compare-") as copies, ExitStack() as stack:
        systems, servers = open_systems(args, endpoints, out, Path(copies), stack)
        started, files = time.time(), held_out_files()
        tokenizer = CheckpointTokenizer(checkpoint_dir(args.model_repository))
        context = model_context(args.model_repository)
        budget = min(context, args.prompt_tokens + args.max_tokens + MARGIN_TOKENS)
        clipper = Clipper(tokenizer, budget, args.max_tokens, anchor_chars=args.anchor_chars)
        try:
            mode = probe(next(iter(systems.values())).sender.open, not args.no_suffix)
        except ProbeError as exc:
            raise SystemExit(f"cannot run the editor profile: {exc}") from None
        (log.warning if mode.refused else log.info)(mode.note)
        events, style = EventLog(profile="editor"), TypingStyle(pause_s=args.pause)
        windows = Windows(
            files, args.typists, clipper, mode.send, style, args.seed, args.one_line, events
        )
        order, window_s = mirrored(list(systems), args.windows), args.duration / args.windows
        log.info(
            f"{args.typists} typists over {len(files)} files, windows of {window_s:.0f} s: "
            f"{', '.join(order)}; prompts up to {clipper.budget} tokens"
        )
        load, rows, problems = {label: (os.getloadavg()[0], 0.0) for label in systems}, [], []
        warm_ups = [(-n, label, args.warm_up) for n, label in enumerate(systems, 1)]  # not counted
        for number, label, seconds in (warm_ups if args.warm_up else []) + [
            (n, label, window_s) for n, label in enumerate(order)
        ]:
            row = windows.run(systems[label], number, seconds, problems)
            if number >= 0:
                rows.append(row)
                load[label] = (load[label][0], os.getloadavg()[0])
        drill_clipper = Clipper(tokenizer, budget, DRILL_TOKENS)
        prompts = [
            drill_clipper.clip(text, at, False).prefix  # up to the middle line
            for text, at in points(files, 0.5, args.drill)
        ]
        pairs = [
            (clipper.clip(text, at, False).prefix, clipper.clip(text, at + 3, False).prefix)
            for text, at in points(files, 0.75, args.resend, 4)
        ]
        drills, afters = {}, {}
        for label, system in systems.items():
            run_resend(system, pairs, events)
            if args.drill:
                drills[label] = d = run_drill(system, prompts)
                log.info(f"drill, {label}: {d['unread_per_abandoned']} tokens after leaving, each")
                if (chat := run_chat_drill(system, prompts)) is not None:
                    drills[f"{label} {CHAT_DRILL}"] = chat
                    per = chat["unread_per_abandoned"]
                    log.info(f"drill, {label} {CHAT_DRILL}: {per} tokens after leaving, each")
            afters[label] = after_check(system.sender)
    frame, table = events.frame(), pd.DataFrame(rows)
    frame = frame[~(pd.to_numeric(frame["window"], errors="coerce") < 0)]  # warm-ups: not counted
    figures = system_figures(frame, table)
    targets = evaluate(figures, drills, afters, args.one_line)
    problems += [f"{s}: after: {a}" for s, a in afters.items() if not a.startswith("answered")]
    command = " ".join(["python -m loadtest.editor", *(sys.argv[1:] if argv is None else argv)])
    write_report(
        out,
        frame,
        table,
        {
            "name": out.name,
            "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "seconds": round(time.time() - started, 1),
            "command": command,
            "protocol": args.protocol,
            "settings": {
                **vars(args),
                "window_s": window_s,
                "order": order,
                "context": context,
                "prompt_tokens": clipper.budget,
                "files": len(files),
                "sampling": SAMPLING,
                "resend": len(pairs),
                "t_max_predict_ms": T_MAX_PREDICT_MS,
            },
            "suffix": vars(mode),
            "figures": figures,
            "drills": drills,
            "afters": afters,
            "targets": targets,
            "problems": problems,
            "machine": describe(),
            "servers": servers,
            "load": load,
        },
    )
    for line in (
        [f"target: {t.verdict} {t.name}: {t.measured}" for t in targets]
        + [f"problem: {p}" for p in problems]
        + [f"report: {out / 'report.md'}"]
    ):
        log.info(line)
    passed = all(t.verdict == PASS for t in targets) or not args.compare
    return 1 if problems else 0 if passed else TARGETS_MISSED
