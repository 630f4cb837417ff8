"""The soak's Locust side: :class:`SoakUser` (a closed-loop client sending the mix),
:class:`SoakShape` (the plan as a load shape) and :func:`editor_phase` (the editor profile's
typists, :class:`SoakTypist`, through the OpenAI API). It imports Locust, which patches the
process with gevent: only the run imports it, never the tests' process."""

from __future__ import annotations

import csv
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
from locust import LoadTestShape, User, constant, task
from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from contract.corpus import held_out_files
from loadtest.api_process import ApiProcess
from loadtest.editor.protocols import Sender
from loadtest.editor.suffix import probe
from loadtest.editor.systems import triton_system
from loadtest.editor.typist import TypingStyle, Typist, Visit
from loadtest.editor.users import EditorTypist, Walk
from loadtest.editor.window import (
    ANCHOR_CHARS,
    CHUNK_TOKENS,
    EDITOR_PROMPT_TOKENS,
    MARGIN_TOKENS,
    CheckpointTokenizer,
    Clipper,
    neighbour_chunks,
)
from loadtest.soak.cases import HOSTILE, INVALID, UNARY_GRPC, rotation, schedule
from loadtest.soak.plan import RAMP, SoakPlan
from loadtest.soak.send import Client, ClientParams, Requests
from reporting.triton import model_context
from serving.paths import checkpoint_dir

log = logging.getLogger("soak")
# Pauses shorter than the editor profile's typist makes (0.4-2.5 s), so that a good share of the
# requests is abandoned before or during its stream, which is the traffic this phase is for.
SOAK_STYLE = TypingStyle(pause_s=(0.1, 1.0))


class SoakUser(User):
    """A closed-loop client, one request after another: in the ramp valid unary gRPC requests,
    in the soak the mix in its proportions. :meth:`prepare` sets what the users share."""

    wait_time = constant(0)

    @classmethod
    def prepare(
        cls,
        params: ClientParams,
        requests: Requests,
        plan: SoakPlan,
        mix: dict[str, int],
        seed: int,
    ) -> None:
        cls.params, cls.requests, cls.plan, cls.seed = params, requests, plan, seed
        cls.kinds, cls.numbers = schedule(mix), itertools.count()
        cls.rotations = {kind: rotation(kind) for kind in (INVALID, HOSTILE)}

    def on_start(self) -> None:
        self.client = Client(next(self.numbers), self.params, self.requests, self.seed)

    def on_stop(self) -> None:
        self.client.close()

    @task
    def send(self) -> None:
        kind = UNARY_GRPC if self.plan.stage == RAMP else next(self.kinds)
        raw = next(self.rotations[kind]) if kind in self.rotations else ()
        self.client.run(kind, *raw)


class SoakTypist(EditorTypist):
    """A typist of ``make loadtest PROFILE=editor`` that also sends other files' chunks, as an
    editor does; :func:`editor_phase` sets its attributes."""

    files: Sequence[Path]

    def context_chunks(self, visit: Visit) -> Sequence[dict]:
        return neighbour_chunks(self.files, visit.path)


class SoakShape(LoadTestShape):
    """The plan's stages as Locust's load shape (every user spawned at once)."""

    def __init__(self, plan: SoakPlan, clock: Callable[[], float]) -> None:
        super().__init__()
        self.plan, self.clock = plan, clock

    def tick(self) -> tuple[int, float, list[type[User]]] | None:
        step = self.plan.tick(self.clock())
        return None if step is None else (step[0], 100, [SoakUser])  # all at once, up or down


def editor_phase(s: Any, runner: Any) -> dict[str, Any]:
    """The OpenAI API started in front of the soak's Triton, the suffix probed, one
    editor-sized request alone (the stall check's reference), then the typists on ``runner``;
    what the report says of the phase besides their rows."""
    if s.editor_duration <= 0:
        return {"done": False, "note": "skipped (--editor-duration 0)"}
    served = checkpoint_dir(s.model_repository)
    # an editor's prompt: 1,024 tokens in all, chunks included (the API drops a chunk that
    # would go over, and counts it in usage); the file's window is anchored, so that the
    # engine's prefix cache reuses it from keystroke to keystroke, as with a cache-aware editor
    budget = EDITOR_PROMPT_TOKENS + s.editor_max_tokens
    api = ApiProcess(
        s.endpoints.grpc, s.out / "openai_api.log", checkpoint=served, context_tokens=budget
    )
    files = held_out_files()
    try:
        try:
            context = min(model_context(s.model_repository), budget + MARGIN_TOKENS)
            tokenizer = CheckpointTokenizer(served)
            clipper = Clipper(
                tokenizer, context - CHUNK_TOKENS, s.editor_max_tokens, anchor_chars=ANCHOR_CHARS
            )
            api.start().wait_ready()
            sender = Sender("openai", api.url.removeprefix("http://"), s.editor_max_tokens)
            mode = probe(sender.open, True)
        except (OSError, TimeoutError, RuntimeError, ValueError) as exc:  # a failed check
            return {"done": False, "error": f"{type(exc).__name__}: {exc}"}
        (log.warning if mode.refused else log.info)(f"editor phase: {mode.note}")
        visit = next(Typist(0, files, s.seed).visits())  # alone: the stall bound's reference
        w = clipper.clip(visit.text, visit.pause.cursor, mode.send, visit.pause.suffix_at)
        alone = sender.open(w.prefix, w.suffix, s.seed, 0, neighbour_chunks(files, visit.path))
        if not alone.wait(time.monotonic() + 120.0):
            alone.abandon()
        log.info(
            f"editor phase: an editor-sized request alone: first token "
            f"{alone.first_token_s or 0:.2f} s"
        )
        failures: list[str] = []
        runner.environment.events.user_error.add_listener(
            lambda user_instance, exception, tb: failures.append(
                f"typist {getattr(user_instance, 'index', '?')}: {exception!r}"
            )
        )
        began, begin = time.monotonic(), time.time()
        walks = {
            i: Walk(Typist(i, files, s.seed, SOAK_STYLE).visits()) for i in range(s.editor_typists)
        }
        system = triton_system("soak", sender, s.endpoints.metrics_url, [])
        SoakTypist.system, SoakTypist.walks, SoakTypist.files = system, walks, files
        SoakTypist.windows = SimpleNamespace(clipper=clipper, with_suffix=mode.send, one_line=False)
        SoakTypist.until, SoakTypist.origin = began + s.editor_duration, began
        SoakTypist.numbers = itertools.count()
        log.info(
            f"editor phase: {s.editor_typists} typists through the API for "
            f"{s.editor_duration:.0f}s, prompts up to {clipper.budget} tokens of the file "
            f"and chunks of other files, {budget - s.editor_max_tokens} in all"
        )
        runner.start(s.editor_typists, spawn_rate=100, user_classes=[SoakTypist])
        hard_end = began + s.editor_duration + SOAK_STYLE.longest_step_s + 30
        while (runner.user_count or time.monotonic() < began + 1) and time.monotonic() < hard_end:
            gevent.sleep(0.5)
    finally:
        api.stop()
    return {
        "done": True,
        "typists": s.editor_typists,
        "duration_s": s.editor_duration,
        "max_tokens": s.editor_max_tokens,
        "prompt_budget_tokens": budget - s.editor_max_tokens,
        "file_budget_tokens": clipper.budget,
        "lone_first_token_s": alone.first_token_s,
        "suffix": asdict(mode),
        "stuck_typists": runner.user_count,
        "typist_failures": failures,
        "window": (begin, time.time()),
    }


def write_locust_reports(environment: Any, out: Path) -> list[Path]:
    """Locust's own reports of the run: its request and failure tables and its HTML page."""
    tables = StatsCSV(environment, PERCENTILES_TO_REPORT)
    paths = [out / "locust_stats.csv", out / "locust_failures.csv", out / "locust.html"]
    for path, write in zip(paths, (tables.requests_csv, tables.failures_csv), strict=False):
        with path.open("w", newline="") as handle:
            write(csv.writer(handle))
    paths[2].write_text(get_html_report(environment, show_download_link=False))
    return paths
