"""The editor profile's command line: ``python -m loadtest.editor --help``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from loadtest.editor.drill import DRILL_REQUESTS, DRILL_TOKENS
from loadtest.editor.typist import TypingStyle
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY

PROTOCOLS = ("openai", "grpc")
ANCHOR_CHARS = 512  # see loadtest.editor.window: about a visit's typing, a fifth of a prefix


@dataclass(frozen=True)
class Preset:
    typists: int
    duration: float  # --no-compare
    progress_every: float
    half_duration: float  # each half of the comparison


DEFAULTS = Preset(4, 90.0, 10.0, 90.0)
# with the server's start and the drain, about a minute (the comparison: two short halves)
QUICK = Preset(2, 25.0, 5.0, 10.0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.editor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="openai", help="openai (SSE) or grpc")
    p.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefix cache on vs off, each on a server this run starts (default); "
        "--no-compare: one run against --host as it is configured",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1:8000",
        help="Triton's HTTP host:port (local), for --no-compare (the comparison starts its own)",
    )
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--typists", type=int, help=f"simulated typists ({DEFAULTS.typists})")
    p.add_argument(
        "--duration",
        type=float,
        help=f"seconds of typing ({DEFAULTS.duration:.0f}; "
        f"each half of the comparison: {DEFAULTS.half_duration:.0f})",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per completion (32)")
    p.add_argument(
        "--no-suffix", action="store_true", help="send prefixes only (default: with suffixes)"
    )
    p.add_argument("--suffix-share", type=float, default=0.25, help="of the prompt budget (0.25)")
    p.add_argument(
        "--anchor-chars",
        type=int,
        default=ANCHOR_CHARS,
        help="the prefix's left cut moves in steps of this many characters (at a line start), "
        "so that a prefix cache can reuse it; 0: the exact longest tail (%(default)s)",
    )
    p.add_argument(
        "--pause",
        type=_pair,
        default=TypingStyle().pause_s,
        help="a pause's shortest and longest seconds, MIN,MAX (%(default)s)",
    )
    p.add_argument(
        "--drill",
        type=int,
        default=DRILL_REQUESTS,
        help=f"after the typing, this many {DRILL_TOKENS}-token completions abandoned at their "
        "first piece, to measure tokens generated after a client left; 0: none (%(default)s)",
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


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Endpoints]:
    """The arguments, the preset's values filled in, and where Triton answers."""
    p = parser()
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    args.typists = args.typists or preset.typists
    args.duration = args.duration or (preset.half_duration if args.compare else preset.duration)
    args.progress_every = args.progress_every or preset.progress_every
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {args.host}")
    if args.typists < 1 or args.duration <= 0 or args.max_tokens < 1:
        p.error("--typists and --max-tokens must be >= 1 and --duration > 0")
    if args.anchor_chars < 0 or args.drill < 0:
        p.error("--anchor-chars and --drill must be >= 0")
    return args, endpoints
