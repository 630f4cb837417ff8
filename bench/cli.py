"""``make bench`` / ``python -m bench [--quick] [--only kernels,single] [--device cuda]``: the
whole comparison in one run, written to ``bench/results/<timestamp>/`` (results.md, .json,
chart.png, the servers' logs) after each section; every table printed at the end."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from bench import report
from bench.beams import run_beams
from bench.format import machine, machine_label, render_text
from bench.kernels import run_kernels
from bench.models import DEFAULT_CHECKPOINT, resolve_models
from bench.peer import run_peer
from bench.prefix import checkpoints, run_prefix, run_served_prefix
from bench.settings import SECTIONS, Plan, make_plan
from bench.traffic import TRAFFIC_SECTIONS, run_traffic
from engine import in_passing_thread
from reporting.machine import load_average

RESULTS = Path(__file__).resolve().parent / "results"
PLAN_OPTIONS = ("quick", "only", "device", "models", "dtypes", "systems", "backends", "lengths")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="shrink everything (~14 min with SmolLM2-135M)")
    add("--only", help=f"comma-separated subset of {','.join(SECTIONS)}")
    add("--device", default="cpu", help="cpu or cuda (engine, transformers)")
    add("--models", help="default,350m (quick: default only)")
    add("--dtypes", help="float32,bfloat16,int8")
    add("--systems", help="engine,openvino,transformers (static batches)")
    add("--backends", help="torch,openvino (arrivals, mixed, single)")
    add("--lengths", help="output lengths for arrivals (8,32,128,512)")
    add("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the default model's folder")
    add("--llama-parallel", type=int, help="llama-server slots (16: one per client at the most)")
    return parser.parse_args(argv)


def run_sections(
    plan: Plan,
    args: argparse.Namespace,
    models: list[Any],
    results: dict[str, Any],
    out: Path,
    log: Any,
    save: Any,
) -> None:
    """Each chosen section in turn, ``results`` saved after each."""
    default = next((m for m in models if m.key == "default"), None)
    if "kernels" in plan.sections:
        kernel_models = [m for m in models if m.key in plan.models]
        results["kernels"] = run_kernels(
            plan, kernel_models, log, on_rows=lambda rows: (results.update(kernels=rows), save())
        )
    if any(s in plan.sections for s in TRAFFIC_SECTIONS):
        run_traffic(plan, default, results, out, log, save)
    if "prefix" in plan.sections:
        results["prefix"] = run_prefix(plan.models, args.checkpoint, plan.prefix_repeats, 16, log)
        save()
        paths = checkpoints(plan.models, args.checkpoint, log)
        results["prefix_served"] = run_served_prefix(paths, plan.prefix_repeats, out, log)
        save()
    if "beams" in plan.sections:
        results["beams"] = run_beams(plan, default, log)
        save()
    if "llama" in plan.sections:
        results["llama"] = run_peer(
            args.checkpoint, plan.peer_half_window_s, out, log, args.llama_parallel
        )


def main(argv: list[str] | None = None) -> int:
    args, started, clock = parse_args(argv), datetime.now(), time.perf_counter()

    def elapsed() -> str:
        seconds = round(time.perf_counter() - clock)
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def log(message: str) -> None:
        print(f"[bench {elapsed()}] {message}", flush=True)

    try:
        plan = make_plan(checkpoint=args.checkpoint, **{n: getattr(args, n) for n in PLAN_OPTIONS})
        if plan.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no GPU")
        names = plan.models if "kernels" in plan.sections else ()
        if {*TRAFFIC_SECTIONS, "beams"} & set(plan.sections) and "default" not in names:
            names = ("default", *names)
        # building a model runs torch: in a thread that ends (engine/threads.py)
        models = in_passing_thread(lambda: resolve_models(names, args.checkpoint, log))
    except (ValueError, FileNotFoundError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    out = RESULTS / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    info = machine(plan.device)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "machine": info,
        "machine_label": machine_label(info),
        "plan": plan.to_dict(),
        "models": [
            {"name": m.name, "description": m.description, "path": str(m.path)} for m in models
        ],
        "notes": ["quick run: fewer batches, tokens and seconds; numbers are rough"]
        if plan.quick
        else [],
        "load_start": load_average(),
    }

    def save() -> None:
        results.update(elapsed=elapsed(), load_end=load_average())
        report.write_all(out, results)

    log(f"{'quick' if plan.quick else 'full'} run: {', '.join(plan.sections)} -> {out}")
    log(f"machine: {results['machine_label']}; load average {results['load_start']}")
    failed = True
    try:
        run_sections(plan, args, models, results, out, log, save)
        failed = False
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        results["notes"].append("interrupted before the end")
    except Exception:  # keep what was measured; the traceback says what went wrong
        traceback.print_exc()
        results["notes"].append("stopped by an error (see the terminal)")
    save()
    for table in report.all_tables(results):
        print(render_text(table), flush=True)
    log(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'chart.png'}")
    return 1 if failed else 0
