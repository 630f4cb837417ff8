"""``make soak``: a bounded load and fault test of the served ensemble on this machine, on Locust.

    python -m loadtest.soak --host 127.0.0.1:8000 --duration 120

1. Finds a ready Triton at ``--host`` or starts one through the launcher; traffic only ever
   goes to 127.0.0.1.
2. The phases are the stages of a Locust load shape (:mod:`loadtest.soak.plan`): a ramp of
   closed-loop unary clients (1, 2, 4, ...) until throughput stops rising (or
   ``--saturation N``); the soak, twice that many :class:`~loadtest.soak.users.SoakUser` s for
   ``--duration`` seconds, each sending the mix (:mod:`loadtest.soak.cases`): valid unary and
   streams, clients that vanish mid-stream (closing it) and mid-request, invalid and hostile
   requests; the editor phase (typists through the OpenAI API); the drain, until the engine is
   idle. Every request is a Locust request event, one row of the event table
   (:class:`reporting.events.EventLog`, ``events.csv``) the report is built from.
3. The stub-kill drill, on a server the soak started only: SIGKILL the stub of the ``engine``
   model and watch readiness, requests and the launcher for 60 s.

Writes ``loadtest/results/soak-<time>/`` (events.csv, summary.json, report.md, soak.png,
samples.csv, the server log when it started one) and exits 1 when a check fails, 2 when it
could not run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import gevent

# Locust patches the process with gevent on import; that must precede anything that loads ssl
# (the project's modules below do, through urllib.request and requests).
import locust  # noqa: F401
from locust.env import Environment

from contract import metrics as names
from contract.prompts import code_prompts
from contract.tensors import ENGINE_MODEL
from loadtest.soak import checks
from loadtest.soak.cases import HOSTILE, INVALID, OK, UNARY_GRPC
from loadtest.soak.checks import FAIL, PASS, SKIP, WARN, Check
from loadtest.soak.drill import drill_check, stub_kill_drill
from loadtest.soak.editor_phase import editor_check, run_editor_phase
from loadtest.soak.plan import DRAIN, EDITOR, SOAK, SoakPlan
from loadtest.soak.report import console_table, failed, measured, write_run
from loadtest.soak.send import Client, ClientParams, Requests
from loadtest.soak.server import Sampler, http_status
from loadtest.soak.settings import SoakSettings, parse_args
from loadtest.soak.users import Mix, SoakShape, SoakUser, write_locust_reports
from reporting.events import EventLog
from reporting.machine import describe
from reporting.triton import (
    EngineState,
    engine_state,
    model_context,
    open_triton,
    read_snapshot,
    wait_for_drain,
)

log = logging.getLogger("soak")


def machine() -> str:
    m = describe()
    return (
        f"{m['cores']} cores (load average {m['load_average']} at the start), "
        f"{m['memory_gib']} GiB RAM, {m['cpu']}, flags {' '.join(m['cpu_flags']) or 'none'}"
    )


def kv_check(before: EngineState | None, after: EngineState | None) -> Check:
    if after is None or after.kv_cache_bytes is None:
        return Check("KV cache back to idle", SKIP, "not exported (codegen_engine_kv_cache_bytes)")
    idle = before.kv_cache_bytes if before and before.kv_cache_bytes is not None else 0.0
    back = after.kv_cache_bytes <= idle * 1.01 + 2**20
    return Check("KV cache back to idle", PASS if back else WARN,
                 f"{after.kv_cache_bytes / 2**20:.1f} MiB after the drain vs "
                 f"{idle / 2**20:.1f} MiB idle")  # fmt: skip


def _engine(settings: SoakSettings) -> EngineState | None:
    with contextlib.suppress(OSError, ValueError):
        return engine_state(settings.endpoints.metrics_url)
    return None


def _tokens(metrics_url: str) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        return read_snapshot(metrics_url).value(names.ENGINE_GENERATED_TOKENS, model=ENGINE_MODEL)
    return None


SILENT = SimpleNamespace(request=SimpleNamespace(fire=lambda **_: None))  # keeps no row


def lone_request_s(params: ClientParams, seed: int) -> float | None:
    """One valid unary request alone on the idle server (no row of the table): the machine's
    speed, which the stall check scales its bound to."""
    client, began = Client(10_000, params, Requests(SILENT), seed), time.perf_counter()
    try:
        outcome = client.run(UNARY_GRPC)
    finally:
        client.close()
    return time.perf_counter() - began if outcome.status == OK else None


class Soak:
    """One run: the server, the event table, the Locust environment, and what each phase
    found (``found``: the drain, the editor phase, what was left unanswered)."""

    def __init__(self, settings: SoakSettings, handle: Any) -> None:
        self.settings, self.handle = settings, handle
        self.origin = time.time()
        self.events = EventLog(profile="soak", system=handle.description)
        self.sampler = Sampler(handle, lambda: time.time() - self.origin, settings.rss_every_s)
        prompts = tuple(code_prompts(300, settings.seed, max_chars=settings.prompt_chars))
        self.params = ClientParams(settings.endpoints, prompts, settings.max_tokens,
                                   settings.long_tokens, settings.deadline_s,
                                   model_context(settings.model_repository))  # fmt: skip
        self.answered: list[float] = []  # when each request was answered: the ramp's measure
        self.found: dict[str, Any] = {"editor": {"done": False, "note": "not reached"},
                                      "unanswered_at_close": 0}  # fmt: skip

    def run_shape(self) -> tuple[SoakPlan, Requests]:
        """The shape's stages in turn: ramp, soak, editor and drain."""
        s = self.settings
        env = Environment(user_classes=[SoakUser], stop_timeout=s.deadline_s + 10)
        self.events.attach(env)
        env.events.request.add_listener(self._answered)
        plan = SoakPlan(s.duration_s, lambda t: sum(e >= t for e in self.answered),
                        lambda: _tokens(s.endpoints.metrics_url), s.saturation, s.clients,
                        s.ramp_step_s, s.ramp_gain, s.ramp_patience, s.max_clients)  # fmt: skip
        self.env, requests = env, Requests(env.events)
        requests.window = lambda: plan.stage or ""
        SoakUser.mix = Mix(self.params, requests, plan, s.mix, s.seed)
        env.shape_class = SoakShape(plan, time.time)
        runner = env.create_local_runner()
        runner.start_shape()
        stage, next_line = "", time.monotonic() + s.progress_every_s
        while not (plan.stages and plan.stage is None):
            if plan.stage != stage and plan.stage:
                stage = self.sampler.phase = plan.stage
                log.info(f"stage: {stage} ({runner.user_count} users now)")
            if stage == EDITOR and EDITOR not in plan.ended:
                self._editor(runner, requests)
                plan.finish(EDITOR, time.time())
            elif stage == DRAIN and DRAIN not in plan.ended:
                url = s.endpoints.http_url
                self.found["ready_after"] = http_status(f"{url}/v2/health/ready")
                self.found["drain"] = wait_for_drain(s.endpoints.metrics_url, s.drain_timeout_s)
                plan.finish(DRAIN, time.time())
            elif time.monotonic() >= next_line:
                log.info(f"{stage} {self.progress(runner.user_count, requests)}")
                next_line += s.progress_every_s
            gevent.sleep(0.5)
        runner.quit()
        self.locust_files = write_locust_reports(env, s.out)
        return plan, requests

    def _answered(self, context: dict[str, Any] | None = None, **_: Any) -> None:
        if context and context.get("status") == OK:
            self.answered.append(time.time())

    def _editor(self, runner: Any, requests: Requests) -> None:
        """The editor phase, once every soak user has ended its request (or the deadline
        passed: what is still in flight then is unanswered)."""
        s, deadline = self.settings, time.monotonic() + self.settings.deadline_s + 10
        while runner.user_count and time.monotonic() < deadline:
            gevent.sleep(0.5)
        self.found["stuck_users"] = runner.user_count
        left = requests.close(f"still in flight {s.deadline_s:.0f}s after the soak ended")
        begin, end, editor = run_editor_phase(s, requests, self.sampler)
        left += requests.close("still in flight after the editor phase ended")
        self.found.update(editor=editor, unanswered_at_close=left,
                          editor_window=(begin - self.origin, end - self.origin))  # fmt: skip

    def progress(self, users: int, requests: Requests) -> str:
        frame = self.events.frame()
        count = {k: int((frame["status"] == k).sum()) if "status" in frame else 0
                 for k in ("ok", "rejected", "abandoned", "unanswered")}  # fmt: skip
        return (
            f"users {users}  sent {requests.sent}  ok {count['ok']}  rejected "
            f"{count['rejected']}  abandoned {count['abandoned']}  unanswered "
            f"{count['unanswered']}  in flight {len(requests.in_flight)}  RSS "
            f"{self.sampler.latest_rss()}"
        )

    def stalls(self, plan: SoakPlan, lone_s: float | None) -> list[checks.Stall]:
        frame, bound = checks.soak_rows(self.events.frame()), self.settings.max_stall_s
        windows = {name: (b - self.origin, e - self.origin) for name, b, e in plan.stages}
        if SOAK not in windows:
            return []
        found = [checks.longest_stall(SOAK, frame[frame["window"] == SOAK], *windows[SOAK],
                                      bound, lone_s)]  # fmt: skip
        editor = self.found["editor"]
        if editor.get("done"):
            rows = frame[frame["window"] == EDITOR]
            found.append(checks.longest_stall(EDITOR, rows, *self.found["editor_window"], bound,
                                              editor.get("lone_first_token_s")))  # fmt: skip
        return [
            replace(st, engine=self.sampler.during(st.at_s, st.until_s))
            if st.at_s is not None and st.until_s is not None
            else st
            for st in found
        ]

    def flatness(self, plan: SoakPlan) -> checks.Flatness | None:
        if not self.sampler.available:
            return None
        soak = next(((b, e) for n, b, e in plan.stages if n == SOAK), (0.0, 0.0))
        first, last = soak[0] - self.origin + self.settings.warmup_s, soak[1] - self.origin
        warm = [x.rss_bytes for x in self.sampler.samples
                if x.phase == SOAK and x.rss_bytes and first <= x.t_s <= last]  # fmt: skip
        return checks.rss_flatness(warm, self.settings.rss_tolerance)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per HTTP request
    s = parse_args(argv)
    s.out.mkdir(parents=True, exist_ok=True)
    started_at, wall = datetime.now().isoformat(timespec="seconds"), time.monotonic()
    log.info(f"soak: results in {s.out}")
    try:
        handle = open_triton(s.endpoints, s.model_repository, s.out / "tritonserver.log")
    except SystemExit as exc:
        log.error(f"soak cannot run: {exc}")
        return 2
    log.info(f"server {handle.description}")
    soak = Soak(s, handle)
    soak.sampler.start()
    drill: dict[str, Any] = {}
    try:
        idle = _engine(s)
        lone_s = lone_request_s(soak.params, s.seed)
        log.info(f"one valid request alone takes {lone_s or 0:.2f} s on this machine now")
        plan, requests = soak.run_shape()
        soak.sampler.phase = "drill"
        drill_requests = Requests(soak.env.events)
        drill_requests.window = "drill"
        drill = stub_kill_drill(s, handle, soak.params, drill_requests)
    finally:
        soak.sampler.stop()
        # a drilled server has requests that never end: Triton's own exit waits for them
        launcher_code = handle.close(timeout=20.0 if drill.get("done") else None)
    soak.events.save(s.out / "events.csv")
    frame = soak.events.frame()
    rows = measured(frame)
    after, drain_s = soak.found.get("drain", (None, 0.0))
    table, cases = checks.kinds(rows), checks.cases(rows)
    stalls, flatness = soak.stalls(plan, lone_s), soak.flatness(plan)
    ready = soak.found.get("ready_after", "not measured")
    found = [
        *checks.accounting_checks(table, requests.sent, int((frame["window"] != "drill").sum())),
        checks.case_check(cases, INVALID),
        checks.case_check(cases, HOSTILE),
        Check("server ready after the soak", PASS if ready == "200" else FAIL,
              f"/v2/health/ready answered {ready}"),
        Check("engine idle after the drain",
              PASS if after and after.running == 0 and not after.pending else FAIL,
              f"running sequences {after.running if after else '?'}, pending requests "
              f"{after.pending if after else '?'} after {drain_s:.1f}s"),
        kv_check(idle, after),
        editor_check(soak.found["editor"]),
        checks.stall_check(stalls, s.max_stall_s),
    ]  # fmt: skip
    if flatness is None:
        found.append(Check("RSS flat after warm-up", SKIP, "server process not found"))
    else:
        growing = FAIL if s.strict_rss else WARN
        status = SKIP if flatness.flat is None else PASS if flatness.flat else growing
        found.append(Check("RSS flat after warm-up", status, flatness.note))
    found.append(drill_check(drill))
    cancelled = (
        after.cancelled - idle.cancelled
        if after and idle and after.cancelled is not None and idle.cancelled is not None
        else None
    )
    total = table.iloc[-1]
    result = {
        "started_at": started_at,
        "wall_s": time.monotonic() - wall,
        "settings": {
            "host": s.endpoints.host, "duration_s": s.duration_s, "clients": plan.soak_clients,
            "mix": s.mix, "max_tokens": s.max_tokens, "long_tokens": s.long_tokens,
            "deadline_s": s.deadline_s, "warmup_s": s.warmup_s, "rss_every_s": s.rss_every_s,
            "rss_tolerance": s.rss_tolerance, "seed": s.seed, "machine": machine(),
            "stuck_users": soak.found.get("stuck_users"),
            "unanswered_at_close": soak.found["unanswered_at_close"],
            "max_stall_s": s.max_stall_s,
        },
        "server": {"description": handle.description, "started_by_soak": handle.started,
                   "launcher_exit_code_at_stop": launcher_code, **handle.info()},
        "saturation": plan.summary(),
        "total": {"sent": int(total["sent"]), "ok": int(total["ok"]),
                  "rejected": int(total["rejected_n"]), "abandoned": int(total["abandoned"]),
                  "unanswered": int(total["unanswered"])},
        "rss": flatness,
        "rss_note": "RSS not measured: tritonserver's process not found on this machine",
        "drain": {"ready_after_soak": ready, "drain_s": round(drain_s, 1),
                  "running_sequences_after": after.running if after else None,
                  "pending_requests_after": after.pending if after else None},
        "engine": {"idle_before": asdict(idle) if idle else None,
                   "after_drain": asdict(after) if after else None,
                   "kv_cache_bytes": "not exported" if not after or after.kv_cache_bytes is None
                   else after.kv_cache_bytes,
                   "engine_cancelled_during_soak": cancelled,
                   "clients_abandoned_during_soak": int(total["abandoned"])},
        "drill": drill,
        "editor": soak.found["editor"],
        "stalls": stalls,
        "checks": found,
    }  # fmt: skip
    phases = [(n, b - soak.origin, e - soak.origin) for n, b, e in plan.stages if e is not None]
    paths = write_run(s.out, result, frame, soak.sampler.samples, phases)
    print(console_table(result, frame), flush=True)
    names_ = ", ".join(p.name for p in [s.out / "events.csv", *soak.locust_files, *paths])
    print(f"\nwritten: {names_} in {s.out}", flush=True)
    if failed(result):
        print(f"SOAK FAILED ({', '.join(failed(result))}): see {s.out / 'report.md'} for the "
              "requests and error texts behind it", flush=True)  # fmt: skip
        return 1
    print("soak passed", flush=True)
    return 0
