"""The command line of ``python -m loadtest.sweep`` (``make loadtest``). The sizes suit a 2-core
machine and the default model (about 10 minutes for four lengths, docs/loadtest.md); ``--quick``
is a smoke run of about a minute. A flag given explicitly wins over either."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from loadtest.targets import TARGETS
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

RESULTS = REPO_ROOT / "loadtest" / "results"
# flag: its help, the full sweep's value, --quick's. 16 users keep the engine's running batch near
# 16 for long outputs, where 2 cores level off.
SIZES = {
    "lengths": ("output lengths", (8, 32, 128, 512), (8, 32)),
    "users": ("concurrent users", 16, 4),
    "duration": ("measured seconds per length", 100.0, 6.0),
    "warmup": ("warm-up seconds per length", 12.0, 3.0),
    "stream_users": ("streaming users, 0 = none", 2, 1),
    "stream_duration": ("streaming phase seconds", 10.0, 3.0),
}
DEFAULTS = {name: full for name, (_, full, _) in SIZES.items()}
QUICK = {name: quick for name, (_, _, quick) in SIZES.items()}


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"output lengths must be positive integers: {text!r}")
    return lengths


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else f"{value:g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with the preset filled in, ``endpoints``, ``target`` and ``out`` added."""
    p = argparse.ArgumentParser(
        prog="python -m loadtest.sweep",
        description="make loadtest: a Locust sweep over output lengths against the ensemble.",
    )
    for name, (text, full, _) in SIZES.items():  # None unless given, so that --quick can fill
        kind = _lengths if name == "lengths" else type(full)
        p.add_argument("--" + name.replace("_", "-"), type=kind, help=f"{text} ({_shown(full)})")
    protocols = "; ".join(f"{t.protocol}: {t.description}" for t in TARGETS.values())
    p.add_argument("--protocol", choices=tuple(TARGETS), default="http", help=protocols)
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--prompts", type=int, default=300, help="distinct code prompts")
    p.add_argument("--prompt-seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/<time>-<protocol>)")
    p.add_argument("--prometheus", default="auto", help="auto, off or a URL (docs/loadtest.md)")
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    quick = ", ".join(f"{name} {_shown(value)}" for name, value in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"a short run: {quick}")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
    except ValueError as exc:
        p.error(str(exc))
    args.target = TARGETS[args.protocol]
    args.out = args.out or RESULTS / f"{datetime.now():%Y%m%d-%H%M%S}-{args.protocol}"
    return args
