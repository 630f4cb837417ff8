"""The editor profile's targets from the systems' figures: each PASS, FAIL or NOT MEASURED,
never a pass by default (docs/editor-load.md has the table)."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.editor.systems import LLAMA, OFF, ON

PASS, FAIL, NOT_MEASURED = "PASS", "FAIL", "NOT MEASURED"
TTFT_RATIO = 1 / 3  # answered first-token p50 with the cache on, at most this share of off
WASTE_PER_ABANDONED = 2.0  # tokens generated after the client left, per abandoned request
ONE_LINE_P50_MS, ONE_LINE_P95_MS, FIRST_TOKEN_P50_MS = 250.0, 600.0, 100.0
PEER_RATIO = 1.0  # the project's one-line p50, at most this times llama.cpp's


@dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    verdict: str  # PASS, FAIL, NOT MEASURED


def _at_most(name: str, figure: str, value: float | None, limit: float) -> Target:
    goal = f"<= {limit:.0f} ms ({figure})"
    if value is None:
        return Target(name, goal, "no answered request", NOT_MEASURED)
    return Target(name, goal, f"{value:.0f} ms", PASS if value <= limit else FAIL)


def _ratio(name: str, figure: str, a: dict, b: dict, limit: float) -> Target:
    x, y, goal = a[f"{figure} ms"], b[f"{figure} ms"], f"{figure}: at most {limit:.2f} x"
    if x is None or y is None:
        return Target(name, goal, "no answered request on one side", NOT_MEASURED)
    measured = f"{x:.0f} ms / {y:.0f} ms = {x / y if y else float('inf'):.2f}"
    return Target(name, goal, measured, PASS if x <= y * limit else FAIL)


def evaluate(
    figures: dict[str, dict], drills: dict[str, dict], afters: dict[str, str], one_line: bool
) -> list[Target]:
    """The targets from each system's figures (:func:`loadtest.editor.figures.system_figures`),
    its drill's and its after-check's; the project is the first system."""
    project, ours = figures[next(iter(figures))], [s for s in figures if s != LLAMA]
    targets = [Target("one-line", "one-line p50 / p95", "--no-one-line", NOT_MEASURED)]
    if one_line:
        targets = [_at_most(f"one-line {p}", "answered, the project", project[f"latency {p} ms"],
                            limit) for p, limit in (("p50", ONE_LINE_P50_MS),
                                                    ("p95", ONE_LINE_P95_MS))]  # fmt: skip
    targets.append(_at_most("first token p50", "the project", project["first token p50 ms"],
                            FIRST_TOKEN_P50_MS))  # fmt: skip
    if ON in figures and OFF in figures:
        targets.append(_ratio("first token, cache on / off", "first token p50", figures[ON],
                              figures[OFF], TTFT_RATIO))  # fmt: skip
    if LLAMA in figures:
        targets.append(_ratio("one-line p50, project / llama.cpp", "latency p50", project,
                              figures[LLAMA], PEER_RATIO))  # fmt: skip
    parts, verdicts = [], []  # tokens after abandonment: the typists' and the drill's
    for system in ours:
        f, d = figures[system], drills.get(system)
        sources = [("typists", f["... per abandoned request (at most)"], f["abandoned"])]
        sources += [("drill", d["unread_per_abandoned"], d["abandoned"])] if d else []
        for source, per, abandoned in sources:
            if not abandoned:
                parts.append(f"{system} {source}: none abandoned")
            elif per is None:
                parts.append(f"{system} {source}: counters unread")
                verdicts.append(NOT_MEASURED)
            else:
                parts.append(f"{system} {source}: {per:.2f} over {abandoned} abandoned")
                verdicts.append(PASS if per <= WASTE_PER_ABANDONED else FAIL)
    worst = next((v for v in (FAIL, NOT_MEASURED) if v in verdicts), PASS)  # none: NOT MEASURED
    targets.append(Target("abandoned requests", f"<= {WASTE_PER_ABANDONED:g} tokens generated per "
                          "abandoned request after its client left, the typists' and the drill's, "
                          "each project system (tokens no reader got: an upper bound)",
                          "; ".join(parts), worst if verdicts else NOT_MEASURED))  # fmt: skip
    goal = "0 tokens generated past a one-line, n_indent or time-budget stop (engine counters)"
    counts = {s: figures[s]["tokens generated past a stop"] for s in ours}
    stops = {s: figures[s]["editor stops"] for s in ours}
    if any(v is None for v in counts.values()) or not any(stops.values()):
        targets.append(Target("past a stop", goal, f"stops {stops}", NOT_MEASURED))
    else:
        measured = "; ".join(f"{s}: {counts[s]:.0f} past {stops[s]:.0f} stops" for s in ours)
        targets.append(Target("past a stop", goal, measured,
                              FAIL if any(counts.values()) else PASS))  # fmt: skip
    errors = {s: f["errors"] + drills.get(s, {}).get("errors", 0) for s, f in figures.items()}
    measured = ", ".join(f"{s} {n}" for s, n in errors.items()) + " (typists and drill)"
    targets.append(Target("errors", "0 errors", measured, FAIL if any(errors.values()) else PASS))
    ok = all(a.startswith("answered") for a in afters.values()) and bool(afters)
    measured = "; ".join(f"{s}: {a}" for s, a in afters.items())
    targets.append(Target("after the run", "the server answers a plain completion", measured,
                          PASS if ok else FAIL))  # fmt: skip
    return targets
