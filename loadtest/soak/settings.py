"""The soak's command line: :func:`parse_args` gives the namespace every phase reads, with the
endpoints, the warm-up's default, the mix and the run folder filled in."""

import argparse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from loadtest.soak.cases import DEFAULT_MIX, KINDS, parse_mix
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

Settings = argparse.Namespace


def _above(kind: type, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a ``kind`` above 0 (or 0 and above, with ``zero``)."""

    def parse(text: str) -> float:
        if (value := kind(text)) < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero else '> 0'}, got {text}")
        return value

    return parse


SECONDS, COUNT, ZERO_OK = _above(float), _above(int), _above(float, zero=True)


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.soak", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="make soak: a bounded load and fault test of the served ensemble on this "
        "machine (docs/soak.md).",
    )  # fmt: skip
    add = p.add_argument
    # fmt: off
    add("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    add("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    add("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    add("--duration", type=SECONDS, default=120.0, help="soak seconds at 2x saturation")
    add("--saturation", type=COUNT, help="clients at saturation (skips the ramp)")
    add("--clients", type=COUNT, help="soak clients (default: 2 x saturation)")
    add("--ramp-step", type=SECONDS, default=8.0, help="seconds per ramp level")
    add("--ramp-gain", type=ZERO_OK, default=0.10,
        help="throughput must rise by this fraction for the ramp to go on")
    add("--ramp-patience", type=COUNT, default=2, help="levels in a row without that rise "
        "before the ramp stops (2: one noisy level on a shared machine does not end it)")
    add("--max-clients", type=COUNT, default=32, help="the ramp's last level")
    add("--max-tokens", type=COUNT, default=32, help="tokens per valid request")
    add("--long-tokens", type=COUNT, default=256, help="tokens asked by clients that then vanish")
    add("--prompt-chars", type=COUNT, default=600, help="longest code prompt")
    add("--deadline", type=SECONDS, default=180.0, help="seconds after which a request with no "
        "answer counts as unanswered (Triton's queue policy rejects at 120)")
    add("--warmup", type=ZERO_OK, help="soak seconds before RSS counts (default: duration/6)")
    add("--rss-every", type=SECONDS, default=2.0, help="seconds between RSS and engine samples")
    add("--rss-tolerance", type=ZERO_OK, default=0.10, help="RSS growth still called flat")
    add("--editor-duration", type=ZERO_OK, default=60.0, help="seconds of the editor phase: "
        "typists streaming through the OpenAI API, each request abandoned at the next "
        "keystroke (0 skips it)")
    add("--editor-typists", type=COUNT, default=4)
    add("--editor-max-tokens", type=COUNT, default=64, help="tokens per editor completion")
    add("--max-stall", type=SECONDS, default=5.0, help="longest seconds with requests in flight "
        "and none answered or streaming before the stall check fails")
    add("--mix", default=",".join(f"{k}={w}" for k, w in DEFAULT_MIX.items()),
        help="kind=weight,... over " + ", ".join(KINDS))
    add("--strict-rss", action="store_true", help="fail (not warn) on RSS growth")
    add("--no-drill", dest="drill", action="store_false", help="skip the stub-kill drill")
    add("--out", type=Path, help="run folder (default: loadtest/results/soak-<time>)")
    add("--model-repository", type=Path, default=MODEL_REPOSITORY)
    # fmt: on
    s = p.parse_args(argv)
    try:
        s.endpoints = Endpoints.from_host(s.host, s.grpc_url, s.metrics_url)
        s.mix = parse_mix(s.mix)
    except ValueError as exc:
        p.error(str(exc))
    if not s.endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {s.host}")
    s.warmup = s.duration / 6 if s.warmup is None else s.warmup
    s.out = s.out or REPO_ROOT / "loadtest" / "results" / f"soak-{datetime.now():%Y%m%d-%H%M%S}"
    s.seed = 0  # the prompts, the mix's choices and the typists' walks: the same every run
    return s
