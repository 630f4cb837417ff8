"""``make bench`` / ``python -m bench``: the whole comparison in one run, with progress.

    python -m bench                      # full run, ~10-15 minutes on 2 cores
    python -m bench --quick              # everything shrunk: ~14 minutes with SmolLM2-135M
    python -m bench --only kernels,single --device cuda

Writes ``bench/results/<timestamp>/`` (results.md, results.json, chart.png, the server's log)
and prints each section's table as soon as it is measured.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from bench import report
from bench.beams import run_beams
from bench.format import machine, machine_label
from bench.kernels import run_kernels
from bench.models import DEFAULT_CHECKPOINT, resolve_models
from bench.peer import run_peer
from bench.prefix import checkpoints, run_prefix
from bench.served_prefix import run_served_prefix
from bench.settings import SECTIONS, make_plan
from bench.traffic import TRAFFIC_SECTIONS, run_traffic
from engine import in_passing_thread
from reporting.llama_server import checkpoint_gguf
from reporting.machine import load_average

RESULTS = Path(__file__).resolve().parent / "results"


class Log:
    """Progress lines stamped with the run's elapsed time."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def elapsed(self) -> str:
        seconds = round(time.perf_counter() - self.started)
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def __call__(self, message: str) -> None:
        print(f"[bench {self.elapsed()}] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="shrink everything (~14 min with SmolLM2-135M)"
    )
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (engine, transformers, ct2)")
    parser.add_argument("--models", help="default,350m (quick: default only)")
    parser.add_argument("--dtypes", help="float32,bfloat16,int8")
    parser.add_argument("--systems", help="engine,openvino,transformers,ct2 (static batches)")
    parser.add_argument("--backends", help="torch,openvino (arrivals, mixed, single)")
    parser.add_argument("--clients", type=int, help="closed-loop clients for arrivals (16)")
    parser.add_argument("--lengths", help="output lengths for arrivals (8,32,128,512)")
    parser.add_argument("--no-served", action="store_true", help="bare engine only, no Triton")
    parser.add_argument(
        "--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the default model's folder"
    )
    parser.add_argument(
        "--llama-parallel",
        type=int,
        help="llama section: llama-server slots (16: one per client at the most clients)",
    )
    parser.add_argument("--out", type=Path, help="results folder (bench/results/<timestamp>)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = make_plan(
            quick=args.quick,
            only=args.only,
            device=args.device,
            models=args.models,
            dtypes=args.dtypes,
            systems=args.systems,
            backends=args.backends,
            clients=args.clients,
            lengths=args.lengths,
            served=not args.no_served,
        )
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if plan.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    if "llama" in plan.sections:  # the peer needs the GGUF the checkpoint was made from
        try:
            checkpoint_gguf(args.checkpoint)
        except FileNotFoundError as exc:
            if args.only:
                print(f"bench: {exc}", file=sys.stderr)
                return 2
            plan = replace(plan, sections=tuple(s for s in plan.sections if s != "llama"))
    log = Log()
    started = datetime.now()
    out = args.out or RESULTS / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    machine_info = machine(plan.device)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info,
        "machine_label": machine_label(machine_info),
        "plan": plan.to_dict(),
        "models": [],
        "notes": [],
        "load_start": load_average(),
    }
    if plan.quick:
        results["notes"].append("quick run: fewer batches, tokens and seconds; numbers are rough")

    def save() -> None:
        results["elapsed"] = log.elapsed()
        results["load_end"] = load_average()
        report.write_all(out, results)

    log(f"{'quick' if plan.quick else 'full'} run: {', '.join(plan.sections)} -> {out}")
    log(f"machine: {results['machine_label']}; load average {results['load_start']}")
    traffic = [s for s in plan.sections if s in TRAFFIC_SECTIONS]
    names = tuple(plan.models) if "kernels" in plan.sections else ()
    if (traffic or "beams" in plan.sections) and "default" not in names:
        names = ("default", *names)
    try:
        # building a model runs torch: in a thread that ends (engine/threads.py)
        models = in_passing_thread(lambda: resolve_models(names, args.checkpoint, log))
    except FileNotFoundError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    results["models"] = [
        {"name": m.name, "description": m.description, "path": str(m.path)} for m in models
    ]
    failed = False
    try:
        if "kernels" in plan.sections:
            kernel_models = [m for m in models if m.key in plan.models]
            results["kernels"] = run_kernels(
                plan,
                kernel_models,
                log,
                on_rows=lambda rows: (results.update(kernels=rows), save()),
            )
            save()
            for table in report.kernel_tables(results):
                print(report.render_text(table), flush=True)
        if traffic:
            default = next(m for m in models if m.key == "default")
            run_traffic(plan, default, results, out, log, save)
        if "prefix" in plan.sections:
            repeats = plan.prefix_repeats
            results["prefix"] = run_prefix(list(plan.models), args.checkpoint, repeats, 16, log)
            save()
            if plan.served and plan.served_prefix:
                paths = checkpoints(list(plan.models), args.checkpoint, log)
                results["prefix_served"] = run_served_prefix(paths, repeats, out, log)
                save()
        if "beams" in plan.sections:
            default = next(m for m in models if m.key == "default")
            results["beams"] = run_beams(plan, default, log)
            save()
        if "llama" in plan.sections:
            results["llama"] = run_peer(
                args.checkpoint, plan.peer_half_window_s, out, log, args.llama_parallel
            )
            save()
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        results["notes"].append("interrupted before the end")
        failed = True
    except Exception:  # keep what was measured; the traceback says what went wrong
        traceback.print_exc()
        results["notes"].append("stopped by an error (see the terminal)")
        failed = True
    save()
    for table in report.all_tables(results):
        if not table[0].startswith(("Static batches", "Engine:")):  # printed above
            print(report.render_text(table), flush=True)
    log(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'chart.png'}")
    return 1 if failed else 0
