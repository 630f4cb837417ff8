"""The editor profile's comparison: the same typists with the engine's prefix cache on and off.

Each half runs on a Triton the profile starts itself, from a copy of the model repository whose
engine config sets ``prefix_caching`` (:func:`cache_repository`; the checkpoint is linked, not
copied), and the engine's own log line must confirm the setting (:func:`check_caching`): an
engine that does not say it honours the parameter (the torch backend has no prefix cache) is
refused rather than compared. :func:`evaluate` turns the two runs into the targets, each PASS,
FAIL or NOT MEASURED (never a pass by default); :func:`write_comparison` writes
``comparison.md`` and ``comparison.json`` beside the two halves' own run folders.

Pure apart from the files it reads and writes: the tests feed it runs and config text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.editor.drill import DRILL_TOKENS
from loadtest.editor.report import EditorRun
from reporting.machine import CPU_FLAGS
from reporting.tables import number, percent
from serving.paths import checkpoint_dir

ON, OFF = "cache-on", "cache-off"
HALVES = ((ON, True), (OFF, False))
PASS, FAIL, NOT_MEASURED = "PASS", "FAIL", "NOT MEASURED"
TTFT_RATIO = 1 / 3  # answered first-token p50 with the cache on, at most this share of off
WASTE_PER_ABANDONED = 2.0  # tokens generated after the client left, per abandoned request
CACHING = re.compile(r'(key:\s*"prefix_caching"\s*value:\s*\{\s*string_value:\s*")([^"]*)(")')
ENGINE_SAYS = re.compile(r"prefix cache (on|off)")


def set_caching(config: str, caching: bool) -> str:
    """The engine's config.pbtxt text with ``prefix_caching`` set; refused when the parameter is
    not there exactly once (a config the comparison cannot steer)."""
    found = CACHING.findall(config)
    if len(found) != 1:
        raise ValueError(
            f"the engine config has {len(found)} prefix_caching parameters (expected one): the "
            "comparison cannot turn the prefix cache on and off"
        )
    return CACHING.sub(lambda m: m[1] + ("true" if caching else "false") + m[3], config)


def cache_repository(source: Path, dest: Path, caching: bool) -> Path:
    """A copy of the model repository ``source`` at ``dest`` (replaced) with the engine's
    ``prefix_caching`` set; the checkpoint is a link to the original."""
    source = Path(source).resolve()
    checkpoint = checkpoint_dir(source)
    if not (checkpoint / "config.json").exists():
        raise SystemExit(f"no model at {checkpoint}: run `make model` first")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("checkpoint", "__pycache__"))
    checkpoint_dir(dest).symlink_to(checkpoint, target_is_directory=True)
    config = dest / ENGINE_MODEL / "config.pbtxt"
    config.write_text(set_caching(config.read_text(), caching))
    return dest


def check_caching(log_file: Path, expected: bool) -> None:
    """The engine logs "prefix cache on|off" as it loads: the half must run the setting it
    names, and an engine that says nothing about it cannot be compared."""
    said = ENGINE_SAYS.findall(log_file.read_text(errors="replace")) if log_file.exists() else []
    want = "on" if expected else "off"
    if not said:
        raise SystemExit(
            f"the engine did not log whether its prefix cache is on ({log_file}): only the "
            "openvino backend has one (backend auto on CPU); cannot compare cache on and off"
        )
    if said[-1] != want:
        raise SystemExit(f"the engine says its prefix cache is {said[-1]}, expected {want}")


@dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    verdict: str  # PASS, FAIL, NOT MEASURED


def evaluate(on: EditorRun, off: EditorRun) -> list[Target]:
    """The profile's targets from its two halves."""
    return [_ttft(on, off), _waste(on, off), _errors(on, off), _after(on, off)]


def _ttft(on: EditorRun, off: EditorRun) -> Target:
    a, b = on.figures.first_token_ms.p50, off.figures.first_token_ms.p50
    goal = f"answered first-token p50 with the cache on <= {TTFT_RATIO:.2f} x with it off"
    if a is None or b is None:
        which = " and ".join(h for h, v in ((ON, a), (OFF, b)) if v is None)
        return Target("first token", goal, f"no answered request in {which}", NOT_MEASURED)
    ratio = a / b if b else float("inf")
    verdict = PASS if a <= b * TTFT_RATIO else FAIL
    return Target("first token", goal, f"{a:.0f} ms / {b:.0f} ms = {ratio:.2f}", verdict)


def _waste(on: EditorRun, off: EditorRun) -> Target:
    goal = (
        f"<= {WASTE_PER_ABANDONED:g} tokens generated per abandoned request after its client "
        "left, in each half: the typists' abandoned requests and the abandonment drill's "
        "(measured: tokens generated that no reader got, an upper bound)"
    )
    parts, verdicts = [], []
    for label, run in ((ON, on), (OFF, off)):
        for source, per, abandoned in _waste_sources(run):
            if abandoned == 0:
                parts.append(f"{label} {source}: none abandoned")
            elif per is None:
                parts.append(f"{label} {source}: engine counters unread")
                verdicts.append(NOT_MEASURED)
            else:
                parts.append(f"{label} {source}: {per:.2f} over {abandoned} abandoned")
                verdicts.append(PASS if per <= WASTE_PER_ABANDONED else FAIL)
    if not verdicts:
        verdict = NOT_MEASURED
    elif FAIL in verdicts:
        verdict = FAIL
    else:
        verdict = NOT_MEASURED if NOT_MEASURED in verdicts else PASS
    return Target("abandoned requests", goal, "; ".join(parts), verdict)


def _waste_sources(run: EditorRun) -> list[tuple[str, float | None, int]]:
    """(source, unread tokens per abandoned request or None, abandoned requests)."""
    f, e, d = run.figures, run.figures.engine, run.drill
    sources = [("typists", None if e is None else e.wasted_per_abandoned, f.abandoned)]
    if d is not None:
        sources.append(("drill", d.unread_per_abandoned, d.abandoned))
    return sources


def _errors(on: EditorRun, off: EditorRun) -> Target:
    a, b = (r.figures.errors + (r.drill.errors if r.drill else 0) for r in (on, off))
    measured = f"{ON} {a}, {OFF} {b} (typists and drill)"
    return Target("errors", "0 errors", measured, PASS if a + b == 0 else FAIL)


def _after(on: EditorRun, off: EditorRun) -> Target:
    ok = all(run.after.startswith("answered") for run in (on, off))
    measured = f"{ON}: {on.after}; {OFF}: {off.after}"
    return Target(
        "after the run", "the server answers a plain completion", measured, PASS if ok else FAIL
    )


Row = tuple[str, Callable[[EditorRun], float | None], int]  # label, figure, digits


def _engine(get: Callable) -> Callable[[EditorRun], float | None]:
    return lambda run: None if run.figures.engine is None else get(run.figures.engine)


def _each(statistic: Callable) -> Callable[[EditorRun], float | None]:
    """A statistic of the drill's unread tokens per abandoned request, where there are any."""
    return lambda run: (
        float(statistic(run.drill.unread_each)) if run.drill and run.drill.unread_each else None
    )


ROWS: list[Row] = [
    ("requests", lambda r: r.figures.requests, 0),
    ("answered", lambda r: r.figures.answered, 0),
    ("abandoned", lambda r: r.figures.abandoned, 0),
    ("abandoned share", lambda r: r.figures.abandoned_share, -1),
    ("errors", lambda r: r.figures.errors, 0),
    ("first token p50 ms (answered)", lambda r: r.figures.first_token_ms.p50, 0),
    ("first token p95 ms (answered)", lambda r: r.figures.first_token_ms.p95, 0),
    ("latency p50 ms (answered)", lambda r: r.figures.latency_ms.p50, 0),
    ("latency p95 ms (answered)", lambda r: r.figures.latency_ms.p95, 0),
    ("prompt tokens sent / request (client)", lambda r: r.figures.prompt_tokens_sent, 0),
    ("engine sequences", _engine(lambda e: e.sequences), 0),
    ("of them cancelled", _engine(lambda e: e.cancelled), 0),
    ("prompt tokens received / sequence", _engine(lambda e: e.prompt_tokens_per_request), 0),
    ("prompt tokens from the prefix cache (at most)", _engine(lambda e: e.reused_tokens), 0),
    ("prefix-cache reuse share (at most)", _engine(lambda e: e.reuse_share), -1),
    ("tokens generated", _engine(lambda e: e.generated_tokens), 0),
    ("generated for abandoned requests, unread (at most)", _engine(lambda e: e.wasted_tokens), 0),
    ("... per abandoned request (at most)", _engine(lambda e: e.wasted_per_abandoned), 2),
    ("drill: abandoned at the first piece", lambda r: r.drill and r.drill.abandoned, 0),
    ("drill: generated after the client left, per abandoned (at most)",
     lambda r: r.drill and r.drill.unread_per_abandoned, 2),
    ("drill: the most for one request (at most)", _each(max), 0),
    ("drill: the median request (at most)", _each(np.median), 1),
]  # fmt: skip


def _cell(value: float | None, digits: int) -> str:
    return percent(value, 1) if digits < 0 else number(value, digits)


@dataclass(frozen=True)
class Comparison:
    name: str  # the run folder's
    on: EditorRun
    off: EditorRun
    load: dict[str, tuple[float, float]]  # half: 1-minute load average before, after
    flags: list[str]
    finished: str
    targets: list[Target] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", evaluate(self.on, self.off))

    @property
    def all_pass(self) -> bool:
        return all(t.verdict == PASS for t in self.targets)

    def table(self) -> list[dict[str, object]]:
        rows = []
        for label, get, digits in ROWS:
            a, b = get(self.on), get(self.off)
            ratio = a / b if a is not None and b else None
            rows.append(
                {
                    "figure": label,
                    ON: a,
                    OFF: b,
                    "on / off": ratio,
                    "text": (_cell(a, digits), _cell(b, digits), number(ratio, 2)),
                }
            )
        return rows


def render(c: Comparison) -> str:
    s, m = c.on.settings, c.on.machine
    verdicts = [t.verdict for t in c.targets]
    lines = [
        f"# Editor traffic, prefix cache on vs off: {c.name}",
        "",
        f"Finished {c.finished}. Command: `{c.on.command}`",
        "",
        "## Targets",
        "",
        f"{verdicts.count(PASS)} of {len(verdicts)} PASS.",
        "",
        "| target | goal | measured | verdict |",
        "|---|---|---|---|",
        *(f"| {t.name} | {t.goal} | {t.measured} | **{t.verdict}** |" for t in c.targets),
        "",
        "## Side by side",
        "",
        f"| figure | {ON} | {OFF} | on / off |",
        "|---|---:|---:|---:|",
        *(f"| {r['figure']} | {' | '.join(r['text'])} |" for r in c.table()),  # type: ignore[arg-type]
        "",
        "Answered: the whole completion arrived before the typist's next keystroke; first token "
        "and latency are of those. Tokens generated for abandoned requests: the engine's "
        "generated tokens minus those that reached a reader (an answered request's whole "
        "completion, an abandoned one's pieces read before it left), so it counts every token "
        "generated after the client left plus any generated before but still in transit: an "
        "upper bound of the tokens generated after the client left"
        + (
            " (over SSE a piece read counts as one token: looser still)."
            if c.on.protocol == "openai"
            else "."
        )
        + " Prefix-cache reuse: "
        f"`{names.ENGINE_PROMPT_TOKENS_REUSED}` over `{names.ENGINE_PROMPT_TOKENS}` (every "
        "prompt the engine admitted, whole); the backend's own index of cached blocks, which "
        "the pipeline may have evicted: an upper bound.",
        "",
        "## Settings",
        "",
        f"- Both halves: {s['typists']} typists, {s['duration_s']:.0f} s of typing each, over "
        f"{c.on.protocol}, seed {s['seed']}, {s['max_tokens']} tokens per completion, pauses "
        f"{s['pause_s'][0]}-{s['pause_s'][1]} s, context {s['context']} tokens, suffix "
        f"{'sent' if c.on.suffix['send'] else 'NOT SENT'} (up to {s['suffix_share']:.0%} of "
        f"the prompt budget), prefix cut anchored in steps of {s.get('anchor_chars', 0)} "
        "characters (0: the exact longest tail; see loadtest/editor/window.py), sampling "
        f"{s['sampling']}; then the abandonment drill, {s.get('drill', 0)} completions of "
        f"{DRILL_TOKENS} tokens abandoned at their first piece (loadtest/editor/drill.py).",
        f"- Each half on a Triton this run started from a copy of the model repository with "
        f"`prefix_caching` true ({ON}) or false ({OFF}), confirmed by the engine's log; "
        "run folders `cache-on/` and `cache-off/` hold each half's report.",
        f"- Machine: {m.cpu}, {m.cores} cores, {m.memory_gib} GiB; CPU flags: "
        f"{', '.join(c.flags) or 'none of ' + ', '.join(CPU_FLAGS)}; {m.os}.",
        "- 1-minute load average (before -> after each half): "
        + "; ".join(f"{h} {a:.2f} -> {b:.2f}" for h, (a, b) in c.load.items())
        + f". Above {m.cores} the halves shared the CPU with other work, and timings suffer.",
    ]
    problems = [f"- {h}: {p}" for h, r in ((ON, c.on), (OFF, c.off)) for p in r.problems]
    if problems:
        lines += ["", "## Problems", "", *problems]
    return "\n".join(lines) + "\n"


def write_comparison(out: Path, c: Comparison) -> list[Path]:
    md, js = out / "comparison.md", out / "comparison.json"
    md.write_text(render(c))
    data = {
        "targets": [dataclasses.asdict(t) for t in c.targets],
        "all_pass": c.all_pass,
        "table": [{k: v for k, v in row.items() if k != "text"} for row in c.table()],
        "load_average": c.load,
        "cpu_flags": c.flags,
        "settings": c.on.settings,
        "protocol": c.on.protocol,
        "problems": {ON: c.on.problems, OFF: c.off.problems},
    }
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return [md, js]
