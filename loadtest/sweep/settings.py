"""The command line of ``python -m loadtest.sweep`` (``make loadtest``) and the typed
:class:`Settings` it gives every other module.

The defaults (:data:`DEFAULTS`) are sized for a 2-core machine and the default model (about 10
minutes for four lengths, see docs/loadtest.md); ``--quick`` switches to :data:`QUICK`, a smoke
run of about a minute. A flag given explicitly wins over either.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path

from loadtest.targets import TARGETS, Target
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

DESCRIPTION = "make loadtest: a Locust sweep over output lengths against the served ensemble."
RESULTS = REPO_ROOT / "loadtest" / "results"


@dataclass(frozen=True)
class Preset:
    """The sizes of a sweep that ``--quick`` switches together."""

    lengths: tuple[int, ...]
    users: int
    duration: float  # measured seconds per length
    warmup: float
    stream_users: int
    stream_duration: float
    progress_every: float  # seconds between progress lines


# 16 users keep the engine's running batch near 16 for long outputs, where 2 cores level off.
DEFAULTS = Preset((8, 32, 128, 512), 16, 100.0, 12.0, 2, 10.0, 10.0)
QUICK = Preset((8, 32), 4, 6.0, 3.0, 1, 3.0, 2.0)


@dataclass(frozen=True)
class Settings(Preset):
    """One sweep's settings, as given on the command line with the preset filled in."""

    protocol: str
    endpoints: Endpoints
    prompts: int
    prompt_seed: int
    out: Path  # the run folder
    prometheus: str  # auto, off or a URL (loadtest.targets.prometheus_for)
    model_repository: Path
    drain_timeout: float = 180.0

    @property
    def target(self) -> Target:
        return TARGETS[self.protocol]


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"output lengths must be positive integers: {text!r}")
    return lengths


PRESET_HELP = {
    "lengths": "output lengths", "users": "concurrent users",
    "duration": "measured seconds per length", "warmup": "warm-up seconds per length",
    "stream_users": "streaming users, 0 = none", "stream_duration": "streaming phase seconds",
    "progress_every": "seconds between progress lines",
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    """The flags; the preset's are None unless given, so that --quick can fill them."""
    p = argparse.ArgumentParser(prog="python -m loadtest.sweep", description=DESCRIPTION)
    for f in fields(Preset):
        default = getattr(DEFAULTS, f.name)
        kind = _lengths if f.name == "lengths" else type(default)
        shown = ",".join(map(str, default)) if f.name == "lengths" else f"{default:g}"
        flag = "--" + f.name.replace("_", "-")
        p.add_argument(flag, type=kind, help=f"{PRESET_HELP[f.name]} ({shown})")
    p.add_argument(
        "--protocol",
        choices=tuple(TARGETS),
        default="http",
        help="; ".join(f"{t.protocol}: {t.description}" for t in TARGETS.values()),
    )
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--prompts", type=int, default=300, help="distinct code prompts")
    p.add_argument("--prompt-seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/<time>-<protocol>)")
    p.add_argument(
        "--prometheus",
        default="auto",
        help="where Triton's figures come from: auto, $PROMETHEUS_URL or http://127.0.0.1:9090 "
        "if one runs there scraping this Triton (make prometheus), else one started for the run "
        "(when `prometheus` is on PATH), else its metrics port; off: the metrics port; or a "
        "Prometheus URL",
    )
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    p.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    return p


def parse_args(argv: list[str] | None = None) -> Settings:
    p = parser()
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    sizes = {
        f.name: getattr(preset, f.name) if getattr(args, f.name) is None else getattr(args, f.name)
        for f in fields(Preset)
    }
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
    except ValueError as exc:
        p.error(str(exc))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Settings(
        **sizes,
        protocol=args.protocol,
        endpoints=endpoints,
        prompts=args.prompts,
        prompt_seed=args.prompt_seed,
        out=args.out or RESULTS / f"{stamp}-{args.protocol}",
        prometheus=args.prometheus,
        model_repository=args.model_repository,
    )
