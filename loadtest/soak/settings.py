"""The soak's command line and the typed :class:`SoakSettings` every phase reads."""

import argparse
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from loadtest.soak.cases import (
    DEFAULT_MIX,
    KINDS,
    parse_mix,
)
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

log = logging.getLogger("soak")
RESULTS = REPO_ROOT / "loadtest" / "results"
DESCRIPTION = "make soak: a bounded load and fault test of the served ensemble on this machine."


@dataclass(frozen=True)
class SoakSettings:
    endpoints: Endpoints
    duration_s: float
    saturation: int | None  # None: measure it with the ramp
    ramp_step_s: float
    ramp_gain: float  # a level must beat the best so far by this much to count as rising
    ramp_patience: int  # levels in a row that do not rise before the ramp stops
    max_clients: int
    clients: int | None  # soak clients; None: 2 x saturation
    mix: dict[str, int]
    max_tokens: int
    long_tokens: int
    prompt_chars: int
    deadline_s: float
    warmup_s: float
    rss_every_s: float
    rss_tolerance: float
    strict_rss: bool
    drain_timeout_s: float
    drill: bool
    progress_every_s: float
    seed: int
    out: Path
    model_repository: Path
    editor_duration_s: float = 60.0  # 0: no editor phase
    editor_typists: int = 4
    editor_max_tokens: int = 64
    max_stall_s: float = 5.0  # see loadtest.soak.stall


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak", description=DESCRIPTION)
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--duration", type=float, default=120.0, help="soak seconds at 2x saturation")
    p.add_argument("--saturation", type=int, help="clients at saturation (skips the ramp)")
    p.add_argument("--clients", type=int, help="soak clients (default: 2 x saturation)")
    p.add_argument("--ramp-step", type=float, default=8.0, help="seconds per ramp level")
    p.add_argument(
        "--ramp-gain",
        type=float,
        default=0.10,
        help="throughput must rise by this fraction for the ramp to go on (0.10)",
    )
    patience = "levels in a row without that rise before the ramp stops (2: one noisy level "
    p.add_argument("--ramp-patience", type=int, default=2,
                   help=patience + "on a shared machine does not end it)")  # fmt: skip
    p.add_argument("--max-clients", type=int, default=32, help="the ramp's last level (32)")
    p.add_argument(
        "--mix",
        default=",".join(f"{k}={w}" for k, w in DEFAULT_MIX.items()),
        help="kind=weight,... over " + ", ".join(KINDS),
    )
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per valid request")
    p.add_argument(
        "--long-tokens", type=int, default=256, help="tokens asked by clients that then vanish"
    )
    p.add_argument("--prompt-chars", type=int, default=600, help="longest code prompt")
    p.add_argument(
        "--deadline",
        type=float,
        default=180.0,
        help="seconds after which a request with no answer counts as unanswered (180; "
        "Triton's queue policy rejects at 120)",
    )
    p.add_argument("--warmup", type=float, help="soak seconds before RSS counts (duration/6)")
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument(
        "--rss-tolerance", type=float, default=0.10, help="RSS growth still called flat (0.10)"
    )
    p.add_argument("--strict-rss", action="store_true", help="fail (not warn) on RSS growth")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for idle")
    p.add_argument(
        "--no-drill", action="store_true", help="skip the stub-kill drill (own server only)"
    )
    p.add_argument(
        "--editor-duration",
        type=float,
        default=60.0,
        help="seconds of the editor phase: typists streaming through the OpenAI API, each "
        "request abandoned at the next keystroke (60; 0 skips it)",
    )
    p.add_argument("--editor-typists", type=int, default=4, help="typists of the editor phase")
    p.add_argument(
        "--editor-max-tokens", type=int, default=64, help="tokens per editor completion (64)"
    )
    p.add_argument(
        "--max-stall",
        type=float,
        default=5.0,
        help="longest seconds with requests in flight and none answered or streaming before "
        "the stall check fails (5: see loadtest/soak/stall.py)",
    )
    p.add_argument("--progress-every", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/soak-<time>)")
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    return p


def parse_args(argv: list[str] | None = None) -> SoakSettings:
    p = parser()
    args = p.parse_args(argv)
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
        mix = parse_mix(args.mix)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {args.host}")
    if args.editor_duration < 0:
        p.error("--editor-duration must be >= 0")
    for name in ("duration", "ramp_step", "deadline", "rss_every", "max_stall"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in (
        "saturation",
        "clients",
        "max_clients",
        "max_tokens",
        "long_tokens",
        "editor_typists",
        "editor_max_tokens",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return SoakSettings(
        endpoints=endpoints,
        duration_s=args.duration,
        saturation=args.saturation,
        ramp_step_s=args.ramp_step,
        ramp_gain=args.ramp_gain,
        ramp_patience=max(1, args.ramp_patience),
        max_clients=args.max_clients,
        clients=args.clients,
        mix=mix,
        max_tokens=args.max_tokens,
        long_tokens=args.long_tokens,
        prompt_chars=args.prompt_chars,
        deadline_s=args.deadline,
        warmup_s=args.duration / 6 if args.warmup is None else args.warmup,
        rss_every_s=args.rss_every,
        rss_tolerance=args.rss_tolerance,
        strict_rss=args.strict_rss,
        drain_timeout_s=args.drain_timeout,
        drill=not args.no_drill,
        progress_every_s=args.progress_every,
        seed=args.seed,
        out=args.out or RESULTS / f"soak-{stamp}",
        model_repository=args.model_repository,
        editor_duration_s=args.editor_duration,
        editor_typists=args.editor_typists,
        editor_max_tokens=args.editor_max_tokens,
        max_stall_s=args.max_stall,
    )
