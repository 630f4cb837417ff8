"""The editor profile's command line: simulated typists against two systems in mirrored
windows, or one (docs/editor-load.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.editor.drill import DRILL_TOKENS
from loadtest.editor.typist import TypingStyle
from loadtest.editor.window import ANCHOR_CHARS
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY

# typists, seconds of typing (--no-compare; in a comparison each system's)
DEFAULTS, QUICK = (4, 90.0, 90.0), (2, 25.0, 20.0)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Endpoints]:
    """The arguments, the preset's values filled in, and where Triton answers."""
    p = argparse.ArgumentParser(
        "python -m loadtest.editor",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add, flag = p.add_argument, argparse.BooleanOptionalAction
    add("--protocol", choices=("openai", "grpc"), default="openai", help="OpenAI SSE or gRPC")
    add(
        "--compare",
        action=flag,
        default=True,
        help="two servers this run starts: the prefix "
        "cache on and off, or the project and --peer; --no-compare: the server at --host",
    )
    add("--peer", choices=("llama",), help="llama.cpp's llama-server (make llama-server)")
    add("--one-line", action=flag, default=True, help="every request stops at its first newline")
    add("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port, for --no-compare")
    add("--grpc-url", help="Triton's gRPC host:port (none: HTTP port + 1)")
    add("--metrics-url", help="Triton's metrics URL (none: HTTP port + 2)")
    add("--no-suffix", action="store_true", help="send prefixes only")
    add(
        "--pause",
        type=lambda t: tuple(map(float, t.split(","))),
        default=TypingStyle().pause_s,
        metavar="MIN,MAX",
        help="seconds",
    )
    add("--windows", type=int, default=2, help="windows per system, mirrored: A B B A")
    add("--warm-up", type=float, default=0.0, help="seconds typed on each system first, uncounted")
    add("--prompt-tokens", type=int, default=1024, help="prefix + suffix at most (Continue's cap)")
    add("--peer-threads", type=int, help="llama-server's --threads (none: every core)")
    add("--peer-slots", type=int, help="llama-server's --parallel (none: one per typist)")
    add("--max-tokens", type=int, default=32, help="tokens per completion")
    add(
        "--anchor-chars",
        type=int,
        default=ANCHOR_CHARS,
        help="the prefix's cut moves in steps of this "
        "many characters, at a line start, so a prefix cache can reuse it; 0: the exact tail",
    )
    add(
        "--drill",
        type=int,
        default=8,
        help=f"{DRILL_TOKENS}-token completions left at their first piece, per system",
    )
    add(
        "--resend",
        type=int,
        default=8,
        help="prompts read one at a time, each then resent 3 characters on, per system",
    )
    add("--seed", type=int, default=0, help="the typists' schedules and the sampling")
    add("--typists", type=int, help=f"{DEFAULTS[0]}; --quick {QUICK[0]}")
    add(
        "--duration",
        type=float,
        help=f"seconds typed per system: {DEFAULTS[2]:.0f}, alone "
        f"{DEFAULTS[1]:.0f}; --quick {QUICK[2]:.0f}, alone {QUICK[1]:.0f}",
    )
    add("--quick", action="store_true", help="a short run: the quick presets")
    add("--out", type=Path, help="run folder (loadtest/results/<time>-editor-...)")
    add("--model-repository", type=Path, default=MODEL_REPOSITORY)
    args = p.parse_args(argv)
    typists, single_s, half_s = QUICK if args.quick else DEFAULTS
    args.typists = args.typists or typists
    args.duration = args.duration or (half_s if args.compare else single_s)
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {args.host}")
    if min(args.typists, args.max_tokens, args.windows) < 1 or args.duration <= 0:
        p.error("--typists, --max-tokens and --windows must be >= 1 and --duration > 0")
    if min(args.anchor_chars, args.drill, args.resend) < 0 or args.prompt_tokens < 16:
        p.error("--anchor-chars, --drill and --resend must be >= 0, --prompt-tokens >= 16")
    if len(args.pause) != 2 or not 0 < args.pause[0] <= args.pause[1]:
        p.error(f"--pause must be MIN,MAX seconds, 0 < MIN <= MAX, got {args.pause}")
    if args.peer and (not args.compare or args.protocol != "openai"):
        p.error("--peer compares over --protocol openai, and needs the comparison")
    args.no_suffix |= bool(args.peer)  # llama.cpp's /v1/completions ignores a suffix silently
    return args, endpoints


def mirrored(labels: list[str], windows: int) -> list[str]:
    """A B B A A B ...: each system first as often as last, so drift falls on both."""
    return [s for turn in range(windows) for s in (labels if turn % 2 == 0 else labels[::-1])]
