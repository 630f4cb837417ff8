"""The editor profile's comparisons and targets.

- Prefix cache on vs off (the default): each system a Triton the profile starts itself, from a
  copy of the model repository whose engine config sets ``prefix_caching``
  (:func:`cache_repository`; the checkpoint is linked, not copied), the setting confirmed by the
  engine's own log line (:func:`check_caching`): an engine that does not say it honours the
  parameter (the torch backend has no prefix cache) is refused rather than compared.
- The project vs llama.cpp's ``llama-server`` (``--peer llama``) on the same weights.

:func:`evaluate` turns the systems' figures into the targets, each PASS, FAIL or NOT MEASURED
(never a pass by default). Pure apart from the files it reads and writes.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from contract.tensors import ENGINE_MODEL
from serving.paths import checkpoint_dir

ON, OFF, PROJECT, LLAMA, SINGLE = "cache-on", "cache-off", "project", "llama.cpp", "as configured"
PASS, FAIL, NOT_MEASURED = "PASS", "FAIL", "NOT MEASURED"
TTFT_RATIO = 1 / 3  # answered first-token p50 with the cache on, at most this share of off
WASTE_PER_ABANDONED = 2.0  # tokens generated after the client left, per abandoned request
ONE_LINE_P50_MS, ONE_LINE_P95_MS, FIRST_TOKEN_P50_MS = 250.0, 600.0, 100.0
PEER_RATIO = 1.0  # the project's one-line p50, at most this times llama.cpp's
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


def _at_most(name: str, goal: str, value: float | None, limit: float, unit: str) -> Target:
    if value is None:
        return Target(name, goal, "no answered request", NOT_MEASURED)
    return Target(name, goal, f"{value:.0f}{unit}", PASS if value <= limit else FAIL)


def evaluate(
    figures: dict[str, dict], drills: dict[str, dict], afters: dict[str, str], one_line: bool
) -> list[Target]:
    """The targets from each system's figures (:func:`loadtest.editor.figures.system_figures`),
    its drill's and its after-check's; the project is the first system."""
    project = figures[next(iter(figures))]
    ours = [s for s in figures if s != LLAMA]
    targets = []
    if one_line:
        targets += [
            _at_most("one-line p50", f"<= {ONE_LINE_P50_MS:.0f} ms (answered, the project)",
                     project["latency p50 ms"], ONE_LINE_P50_MS, " ms"),
            _at_most("one-line p95", f"<= {ONE_LINE_P95_MS:.0f} ms (answered, the project)",
                     project["latency p95 ms"], ONE_LINE_P95_MS, " ms"),
        ]  # fmt: skip
    else:
        targets.append(Target("one-line", "one-line p50 / p95", "--no-one-line", NOT_MEASURED))
    targets.append(_at_most("first token p50", f"<= {FIRST_TOKEN_P50_MS:.0f} ms (the project)",
                            project["first token p50 ms"], FIRST_TOKEN_P50_MS, " ms"))  # fmt: skip
    if ON in figures and OFF in figures:
        targets.append(_ratio_target("first token, cache on / off", "first token p50",
                                     figures[ON], figures[OFF], TTFT_RATIO))  # fmt: skip
    if LLAMA in figures:
        targets.append(_ratio_target("one-line p50, project / llama.cpp", "latency p50",
                                     project, figures[LLAMA], PEER_RATIO))  # fmt: skip
    targets += [_waste(figures, drills, ours), _past_stop(figures, ours)]
    errors = {s: f["errors"] + drills.get(s, {}).get("errors", 0) for s, f in figures.items()}
    measured = ", ".join(f"{s} {n}" for s, n in errors.items()) + " (typists and drill)"
    targets.append(Target("errors", "0 errors", measured, FAIL if any(errors.values()) else PASS))
    ok = all(a.startswith("answered") for a in afters.values()) and bool(afters)
    measured = "; ".join(f"{s}: {a}" for s, a in afters.items())
    targets.append(Target("after the run", "the server answers a plain completion", measured,
                          PASS if ok else FAIL))  # fmt: skip
    return targets


def _ratio_target(name: str, figure: str, a: dict, b: dict, limit: float) -> Target:
    x, y = a[f"{figure} ms"], b[f"{figure} ms"]
    goal = f"{figure}: at most {limit:.2f} x"
    if x is None or y is None:
        return Target(name, goal, "no answered request on one side", NOT_MEASURED)
    verdict = PASS if x <= y * limit else FAIL
    return Target(name, goal, f"{x:.0f} ms / {y:.0f} ms = {x / y if y else float('inf'):.2f}",
                  verdict)  # fmt: skip


def _combine(verdicts: list[str]) -> str:
    if not verdicts:
        return NOT_MEASURED
    return FAIL if FAIL in verdicts else NOT_MEASURED if NOT_MEASURED in verdicts else PASS


def _waste(figures: dict[str, dict], drills: dict[str, dict], systems: list[str]) -> Target:
    goal = (
        f"<= {WASTE_PER_ABANDONED:g} tokens generated per abandoned request after its client "
        "left, the typists' and the drill's, each project system (tokens no reader got: an "
        "upper bound)"
    )
    parts, verdicts = [], []
    for system in systems:
        sources = [("typists", figures[system]["... per abandoned request (at most)"],
                    figures[system]["abandoned"])]  # fmt: skip
        if system in drills:
            drill = drills[system]
            sources.append(("drill", drill["unread_per_abandoned"], drill["abandoned"]))
        for source, per, abandoned in sources:
            if not abandoned:
                parts.append(f"{system} {source}: none abandoned")
            elif per is None:
                parts.append(f"{system} {source}: counters unread")
                verdicts.append(NOT_MEASURED)
            else:
                parts.append(f"{system} {source}: {per:.2f} over {abandoned} abandoned")
                verdicts.append(PASS if per <= WASTE_PER_ABANDONED else FAIL)
    return Target("abandoned requests", goal, "; ".join(parts), _combine(verdicts))


def _past_stop(figures: dict[str, dict], systems: list[str]) -> Target:
    goal = "0 tokens generated past a one-line, n_indent or time-budget stop (engine counters)"
    counts = {s: figures[s]["tokens generated past a stop"] for s in systems}
    stops = {s: figures[s]["editor stops"] for s in systems}
    if any(v is None for v in counts.values()) or not any(stops.values()):
        return Target("past a stop", goal, f"stops {stops}", NOT_MEASURED)
    measured = "; ".join(f"{s}: {counts[s]:.0f} past {stops[s]:.0f} stops" for s in systems)
    return Target("past a stop", goal, measured, FAIL if any(counts.values()) else PASS)
