"""The editor profile's command line: simulated typists against two systems in mirrored windows
(docs/editor-load.md)."""

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


NUMBERS: list[tuple[str, type, object, str]] = [  # flag, type, default, help
    ("--windows", int, 2, "windows per system, in mirrored order A B B A; --duration is each "
     "system's total"),
    ("--warm-up", float, 0.0, "seconds of typing on each system before the windows, not counted"),
    ("--t-max-predict-ms", int, T_MAX_PREDICT_MS, "the time-budget stop of both servers; 0: off"),
    ("--prompt-tokens", int, PROMPT_TOKENS, "prefix + suffix tokens at most, within the context"),
    ("--peer-threads", int, None, "llama-server's --threads (default: every core, as the engine)"),
    ("--peer-slots", int, None, "llama-server's --parallel (default: one per typist)"),
    ("--max-tokens", int, 32, "tokens per completion"),
    ("--suffix-share", float, 0.25, "of the prompt budget"),
    ("--anchor-chars", int, ANCHOR_CHARS, "the prefix's left cut moves in steps of this many "
     "characters (at a line start), so that a prefix cache can reuse it; 0: the exact tail"),
    ("--drill", int, DRILL_REQUESTS, f"after the typing, this many {DRILL_TOKENS}-token "
     "completions abandoned at their first piece, on each system; 0: none"),
    ("--resend", int, 8, "after the typing, this many prompts read to their end one at a time, "
     "each followed by the same prompt 3 characters on (the warm path); 0: none"),
    ("--seed", int, 0, "the typists' schedules and the sampling"),
    ("--typists", int, None, f"simulated typists (the preset's: {DEFAULTS.typists})"),
    ("--duration", float, None, f"seconds of typing (the preset's: {DEFAULTS.duration:.0f}; in a "
     f"comparison, each system's: {DEFAULTS.half_duration:.0f})"),
    ("--progress-every", float, None, "seconds between progress lines"),
]  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.editor", description=__doc__)
    p.add_argument("--protocol", choices=PROTOCOLS, default="openai", help="openai (SSE) or grpc")
    p.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="two systems, each on a server this run starts: prefix cache on vs off "
        "(default), or the project vs --peer; --no-compare: the server at --host",
    )
    p.add_argument(
        "--peer",
        choices=("llama",),
        help="the project (cache on) against llama.cpp's "
        "llama-server on the GGUF the checkpoint was made from (make llama-server)",
    )
    p.add_argument(
        "--one-line",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every request stops at its first newline (llama.cpp: stop \\n)",
    )
    p.add_argument(
        "--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local), for --no-compare"
    )
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--no-suffix", action="store_true", help="send prefixes only")
    p.add_argument(
        "--pause",
        type=_pair,
        default=TypingStyle().pause_s,
        help="a pause's shortest and longest seconds, MIN,MAX (%(default)s)",
    )
    for flag, kind, default, text in NUMBERS:
        p.add_argument(flag, type=kind, default=default, help=f"{text} (%(default)s)")
    p.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/<time>-editor-...)")
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    return p  # fmt: skip


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
