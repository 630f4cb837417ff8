"""The editor profile's command line: ``python -m loadtest.editor --help``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.editor.drill import DRILL_REQUESTS, DRILL_TOKENS
from loadtest.editor.typist import TypingStyle
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY

PROTOCOLS = ("openai", "grpc")
ANCHOR_CHARS = 512  # see loadtest.editor.window: about a visit's typing, a fifth of a prefix
PROMPT_TOKENS = 1024  # Continue's prompt cap: editors send a window, not the whole file
T_MAX_PREDICT_MS = 1000  # llama.vim's budget for its follow-up requests


@dataclass(frozen=True)
class Preset:
    typists: int
    duration: float  # --no-compare
    progress_every: float
    half_duration: float  # each system's typing in a comparison (over its windows)


DEFAULTS = Preset(4, 90.0, 10.0, 90.0)
# with the server's start and the drain, about a minute (the comparison: two short halves)
QUICK = Preset(2, 25.0, 5.0, 20.0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.editor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="openai", help="openai (SSE) or grpc")
    p.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="two systems, each on a server this run starts: prefix cache on vs off "
        "(default), or the project vs --peer; --no-compare: one run against --host as it is "
        "configured",
    )
    p.add_argument(
        "--peer",
        choices=("llama",),
        help="compare the project (prefix cache on) with llama.cpp's llama-server on the GGUF "
        "the checkpoint was made from (`make llama-server` builds it)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=2,
        help="windows per system, in mirrored order A B B A (%(default)s); --duration is "
        "each system's total",
    )
    p.add_argument(
        "--warm-up",
        type=float,
        default=0.0,
        help="seconds of typing on each system before the windows, not counted (%(default)s)",
    )
    p.add_argument(
        "--one-line",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every request stops at its first newline (single_line; llama.cpp: stop \\n)",
    )
    p.add_argument(
        "--t-max-predict-ms",
        type=int,
        default=T_MAX_PREDICT_MS,
        help="the time-budget stop both servers take; 0: none (%(default)s)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT_TOKENS,
        help="prefix + suffix tokens at most, within the context (%(default)s)",
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
    p.add_argument(
        "--resend",
        type=int,
        default=8,
        help="after the typing, this many prompts sent and read to their end, one at a time, "
        "each followed by the same prompt 3 characters on (the warm path); 0: none (%(default)s)",
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
    if args.anchor_chars < 0 or args.drill < 0 or args.t_max_predict_ms < 0:
        p.error("--anchor-chars, --drill and --t-max-predict-ms must be >= 0")
    if args.windows < 1 or args.prompt_tokens < 16:
        p.error("--windows must be >= 1 and --prompt-tokens >= 16")
    if args.peer and (not args.compare or args.protocol != "openai"):
        p.error("--peer compares over --protocol openai, and needs the comparison")
    if args.peer and not args.no_suffix:
        args.no_suffix = True  # llama.cpp's /v1/completions would ignore a suffix silently
    return args, endpoints


def mirrored(labels: Sequence[str], windows: int) -> list[str]:
    """The systems' order over ``windows`` windows each: A B B A A B ... (each system first
    as often as last, so drift over the run falls on both)."""
    order: list[str] = []
    for turn in range(windows):
        order += list(labels) if turn % 2 == 0 else list(reversed(labels))
    return order
