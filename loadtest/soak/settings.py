"""The soak's command line and the typed :class:`SoakSettings` every phase reads."""

import argparse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from loadtest.soak.cases import DEFAULT_MIX, KINDS, parse_mix
from reporting.triton import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

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
    max_stall_s: float = 5.0  # see loadtest.soak.checks


# (flag, type, default, help); a positive number unless said otherwise
OPTIONS: tuple[tuple[str, type, object, str], ...] = (
    ("--duration", float, 120.0, "soak seconds at 2x saturation"),
    ("--saturation", int, None, "clients at saturation (skips the ramp)"),
    ("--clients", int, None, "soak clients (default: 2 x saturation)"),
    ("--ramp-step", float, 8.0, "seconds per ramp level"),
    ("--ramp-gain", float, 0.10, "throughput must rise by this fraction for the ramp to go on"),
    ("--ramp-patience", int, 2, "levels in a row without that rise before the ramp stops (2: "
     "one noisy level on a shared machine does not end it)"),
    ("--max-clients", int, 32, "the ramp's last level"),
    ("--max-tokens", int, 32, "tokens per valid request"),
    ("--long-tokens", int, 256, "tokens asked by clients that then vanish"),
    ("--prompt-chars", int, 600, "longest code prompt"),
    ("--deadline", float, 180.0, "seconds after which a request with no answer counts as "
     "unanswered (Triton's queue policy rejects at 120)"),
    ("--warmup", float, None, "soak seconds before RSS counts (duration/6)"),
    ("--rss-every", float, 2.0, "seconds between RSS and engine samples"),
    ("--rss-tolerance", float, 0.10, "RSS growth still called flat"),
    ("--drain-timeout", float, 120.0, "seconds to wait for idle"),
    ("--editor-duration", float, 60.0, "seconds of the editor phase: typists streaming through "
     "the OpenAI API, each request abandoned at the next keystroke (0 skips it)"),
    ("--editor-typists", int, 4, "typists of the editor phase"),
    ("--editor-max-tokens", int, 64, "tokens per editor completion"),
    ("--max-stall", float, 5.0, "longest seconds with requests in flight and none answered or "
     "streaming before the stall check fails (see loadtest/soak/checks.py)"),
    ("--progress-every", float, 10.0, "seconds between progress lines"),
)  # fmt: skip
MAY_BE_ZERO = ("editor_duration", "ramp_gain", "rss_tolerance", "drain_timeout", "warmup")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak", description=DESCRIPTION)
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    for flag, kind, default, text in OPTIONS:
        p.add_argument(flag, type=kind, default=default,
                       help=text + ("" if default is None else f" ({default})"))  # fmt: skip
    mix = ",".join(f"{k}={w}" for k, w in DEFAULT_MIX.items())
    p.add_argument("--mix", default=mix, help="kind=weight,... over " + ", ".join(KINDS))
    p.add_argument("--strict-rss", action="store_true", help="fail (not warn) on RSS growth")
    p.add_argument("--no-drill", action="store_true", help="skip the stub-kill drill")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/soak-<time>)")
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    return p


def parse_args(argv: list[str] | None = None) -> SoakSettings:
    p = parser()
    a = p.parse_args(argv)
    try:
        endpoints = Endpoints.from_host(a.host, a.grpc_url, a.metrics_url)
        mix = parse_mix(a.mix)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {a.host}")
    for flag, *_ in OPTIONS:
        name = flag[2:].replace("-", "_")
        value = getattr(a, name)
        if value is not None and (value < 0 if name in MAY_BE_ZERO else value <= 0):
            p.error(f"{flag} must be {'>= 0' if name in MAY_BE_ZERO else '> 0'}")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return SoakSettings(
        endpoints=endpoints, duration_s=a.duration, saturation=a.saturation,
        ramp_step_s=a.ramp_step, ramp_gain=a.ramp_gain, ramp_patience=a.ramp_patience,
        max_clients=a.max_clients, clients=a.clients, mix=mix, max_tokens=a.max_tokens,
        long_tokens=a.long_tokens, prompt_chars=a.prompt_chars, deadline_s=a.deadline,
        warmup_s=a.duration / 6 if a.warmup is None else a.warmup, rss_every_s=a.rss_every,
        rss_tolerance=a.rss_tolerance, strict_rss=a.strict_rss,
        drain_timeout_s=a.drain_timeout, drill=not a.no_drill,
        progress_every_s=a.progress_every, seed=a.seed,
        out=a.out or RESULTS / f"soak-{stamp}", model_repository=a.model_repository,
        editor_duration_s=a.editor_duration, editor_typists=a.editor_typists,
        editor_max_tokens=a.editor_max_tokens, max_stall_s=a.max_stall,
    )  # fmt: skip
