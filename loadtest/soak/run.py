"""``make soak`` (docs/soak.md): Triton found or started on 127.0.0.1, the phases as the stages
of a Locust load shape, the stub-kill drill on a server it started; every request a row of the
event table the checks are drawn from. Exits 1 when a check fails, 2 when it could not run."""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import gevent

# Locust patches the process with gevent on import; that must precede anything that loads ssl
# (the project's modules below do, through urllib.request and requests).
import locust  # noqa: F401
from locust.env import Environment

from contract import metrics as names
from contract.prompts import code_prompts
from contract.tensors import ENGINE_MODEL
from loadtest.soak import cases as c
from loadtest.soak import checks, users
from loadtest.soak.drill import Sampler, drill_check, http_status, stub_kill_drill
from loadtest.soak.plan import DRAIN, SOAK, SoakPlan
from loadtest.soak.report import console_table, failed, write_run
from loadtest.soak.send import Client, ClientParams, Requests
from reporting import triton
from reporting.events import EventLog
from reporting.machine import describe
from reporting.triton import Endpoints, engine_state, model_context, open_triton, read_snapshot
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

log = logging.getLogger("soak")
Settings = argparse.Namespace
DRAIN_S = 120.0  # the drain's longest wait for the engine to be idle


def _above(kind: type, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a ``kind`` above 0 (or 0 and above, with ``zero``)."""

    def parse(text: str) -> float:
        if (value := kind(text)) < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero else '> 0'}, got {text}")
        return value

    return parse


SECONDS, COUNT, ZERO_OK = _above(float), _above(int), _above(float, zero=True)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every default in the help, but for flags and options whose help says it in words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        plain = action.default is None or isinstance(action.default, bool)
        return action.help if plain else super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.soak",
        formatter_class=_Help,
        description="make soak: a bounded load and fault test of the "
        "served ensemble on this machine (docs/soak.md).",
    )
    add = p.add_argument
    add("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    add("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    add("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    add("--duration", type=SECONDS, default=120.0, help="soak seconds at 2x saturation")
    add("--saturation", type=COUNT, help="clients at saturation (skips the ramp)")
    add("--clients", type=COUNT, help="soak clients (default: 2 x saturation)")
    add("--ramp-step", type=SECONDS, default=8.0, help="seconds per ramp level")
    add("--ramp-gain", type=ZERO_OK, default=0.10, help="rise in throughput that goes on ramping")
    add(
        "--ramp-patience",
        type=COUNT,
        default=2,
        help="levels in a row without that rise that "
        "stop the ramp (2: one noisy level on a shared machine does not)",
    )
    add("--max-clients", type=COUNT, default=32, help="the ramp's last level")
    add("--max-tokens", type=COUNT, default=32, help="tokens per valid request")
    add("--long-tokens", type=COUNT, default=256, help="tokens asked by clients that then vanish")
    add("--prompt-chars", type=COUNT, default=600, help="longest code prompt")
    add(
        "--deadline",
        type=SECONDS,
        default=180.0,
        help="seconds without an answer that make a "
        "request unanswered (Triton's queue policy rejects at 120)",
    )
    add("--warmup", type=ZERO_OK, help="soak seconds before RSS counts (default: duration/6)")
    add("--rss-every", type=SECONDS, default=2.0, help="seconds between RSS and engine samples")
    add("--rss-tolerance", type=ZERO_OK, default=0.10, help="RSS growth still called flat")
    add(
        "--editor-duration",
        type=ZERO_OK,
        default=60.0,
        help="seconds of typists through the "
        "OpenAI API, each request abandoned at the next keystroke (0 skips it)",
    )
    add("--editor-typists", type=COUNT, default=4, help="typists of the editor phase")
    add("--editor-max-tokens", type=COUNT, default=64, help="tokens per editor completion")
    add(
        "--max-stall",
        type=SECONDS,
        default=5.0,
        help="longest seconds with requests in flight "
        "and none answered or streaming before the stall check fails",
    )
    add(
        "--mix",
        default=",".join(f"{k}={w}" for k, w in c.DEFAULT_MIX.items()),
        help="kind=weight,... over " + ", ".join(c.KINDS),
    )
    add("--strict-rss", action="store_true", help="fail (not warn) on RSS growth")
    add("--no-drill", dest="drill", action="store_false", help="skip the stub-kill drill")
    add("--out", type=Path, help="run folder (default: loadtest/results/soak-<time>)")
    add("--model-repository", type=Path, default=MODEL_REPOSITORY)
    s = p.parse_args(argv)
    try:
        s.endpoints = Endpoints.from_host(s.host, s.grpc_url, s.metrics_url)
        s.mix = c.parse_mix(s.mix)
    except ValueError as exc:
        p.error(str(exc))
    if not s.endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {s.host}")
    s.warmup = s.duration / 6 if s.warmup is None else s.warmup
    s.out = s.out or REPO_ROOT / "loadtest" / "results" / f"soak-{datetime.now():%Y%m%d-%H%M%S}"
    s.seed = 0  # the prompts, the mix's choices and the typists' walks: the same every run
    return s


class Soak:
    """One run: the server, the event table, the Locust environment, and what each phase
    found (``found``: the drain, the editor phase, what was left unanswered)."""

    def __init__(self, s: Settings, handle: Any) -> None:
        self.s, self.origin = s, time.time()
        self.events = EventLog(profile="soak", system=handle.description)
        self.sampler = Sampler(handle, lambda: time.time() - self.origin, s.rss_every)
        prompts = tuple(code_prompts(300, s.seed, max_chars=s.prompt_chars))
        self.params = ClientParams(
            s.endpoints,
            prompts,
            s.max_tokens,
            s.long_tokens,
            s.deadline,
            model_context(s.model_repository),
        )
        self.env = Environment(
            user_classes=[users.SoakUser, users.SoakTypist], stop_timeout=s.deadline + 10
        )
        self.events.attach(self.env)
        self.requests = Requests(self.env.events)
        self.found: dict[str, Any] = {
            "editor": {"done": False, "note": "not reached"},
            "unanswered_at_close": 0,
        }

    def _tokens(self) -> float | None:
        """The engine's generated-token counter (None: not exported): the ramp's measure."""
        with contextlib.suppress(OSError, ValueError):
            snapshot = read_snapshot(self.s.endpoints.metrics_url)
            return snapshot.value(names.ENGINE_GENERATED_TOKENS, model=ENGINE_MODEL)
        return None

    def run_shape(self) -> SoakPlan:
        """The shape's stages in turn (ramp, soak, editor and drain), a progress line each."""
        s, runner = self.s, self.env.create_local_runner()
        answered = self.requests.ended  # the ramp's measure: requests answered since t
        plan = SoakPlan(
            s.duration,
            lambda t: sum(r["status"] == c.OK and r["ended"] >= t for r in answered),
            self._tokens,
            s.saturation,
            s.clients,
            s.ramp_step,
            s.ramp_gain,
            s.ramp_patience,
            s.max_clients,
        )
        self.requests.window = lambda: plan.stage or ""
        users.SoakUser.prepare(self.params, self.requests, plan, s.mix, s.seed)
        self.env.shape_class = users.SoakShape(plan, time.time)
        runner.start_shape()
        stage = ""
        while not (plan.stages and plan.stage is None):
            if plan.stage != stage and plan.stage:
                stage = self.sampler.phase = plan.stage
                self.events.stamp(window=stage)  # the typists' rows; the mix names its own
                ends = self.events.frame()["outcome"].value_counts().to_dict()
                log.info(
                    f"stage: {stage} ({runner.user_count} users now); so far: sent "
                    f"{self.requests.sent}, in flight {len(self.requests.in_flight)}, "
                    f"ended {ends}"
                )
            if stage == c.EDITOR and c.EDITOR not in plan.ended:
                self._editor(runner)
                plan.finish(c.EDITOR, time.time())
            elif stage == DRAIN and DRAIN not in plan.ended:
                self.found["ready_after"] = http_status(f"{s.endpoints.http_url}/v2/health/ready")
                self.found["drain"] = triton.wait_for_drain(s.endpoints.metrics_url, DRAIN_S)
                plan.finish(DRAIN, time.time())
            gevent.sleep(0.5)
        runner.quit()
        self.locust_files = users.write_locust_reports(self.env, s.out)
        return plan

    def _editor(self, runner: Any) -> None:
        """The editor phase, once every soak user has ended its request (or the deadline
        passed: what is still in flight then is unanswered)."""
        deadline = time.monotonic() + self.s.deadline + 10
        while runner.user_count and time.monotonic() < deadline:
            gevent.sleep(0.5)
        self.found["stuck_users"] = runner.user_count
        left = self.requests.close(f"still in flight {self.s.deadline:.0f}s after the soak ended")
        editor = users.editor_phase(self.s, runner)
        left += self.requests.close("still in flight after the editor phase ended")
        self.found.update(editor=editor, unanswered_at_close=left)

    def stalls(self, plan: SoakPlan, frame: Any, lone_s: float | None) -> list[checks.Stall]:
        windows = {name: (b - self.origin, e - self.origin) for name, b, e in plan.stages}
        if SOAK not in windows:
            return []
        phases = [(SOAK, windows[SOAK], lone_s)]
        if (editor := self.found["editor"]).get("done"):
            window = tuple(t - self.origin for t in editor["window"])
            phases.append((c.EDITOR, window, editor.get("lone_first_token_s")))
        found = [
            checks.longest_stall(
                name, frame[frame["window"] == name], *window, self.s.max_stall, lone
            )
            for name, window, lone in phases
        ]
        return [
            replace(st, engine=self.sampler.during(st.at_s, st.until_s))
            if st.at_s is not None and st.until_s is not None
            else st
            for st in found
        ]

    def rss_samples(self, plan: SoakPlan) -> list[int] | None:
        """The server's RSS through the soak phase after the warm-up (None: not found)."""
        if self.sampler.root is None:
            return None
        soak = next(((b, e) for n, b, e in plan.stages if n == SOAK), (0.0, 0.0))
        first, last = soak[0] - self.origin + self.s.warmup, soak[1] - self.origin
        return [
            x["rss_bytes"]
            for x in self.sampler.samples
            if x["phase"] == SOAK and x["rss_bytes"] and first <= x["t_s"] <= last
        ]


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
    soak, drill, idle = Soak(s, handle), {}, None
    soak.sampler.start()
    try:
        with contextlib.suppress(OSError, ValueError):
            idle = engine_state(s.endpoints.metrics_url)
        # one valid request alone on the idle server: the speed the stall bound scales to
        client, began = Client(10_000, soak.params, Requests(None), s.seed), time.perf_counter()
        lone_s = time.perf_counter() - began if client.run(c.UNARY_GRPC).status == c.OK else None
        client.close()
        log.info(f"one valid request alone takes {lone_s or 0:.2f} s on this machine now")
        plan = soak.run_shape()
        soak.sampler.phase = "drill"
        drill = stub_kill_drill(s, handle, soak.params, Requests(soak.env.events, "drill"))
    finally:
        soak.sampler.stop()
        # a drilled server has requests that never end: Triton's own exit waits for them
        launcher_code = handle.close(timeout=20.0 if drill.get("done") else None)
    frame = checks.soak_rows(soak.events.frame())
    frame.to_csv(s.out / "events.csv", index=False)
    rows = checks.measured(frame)
    after, drain_s = soak.found.get("drain", (None, 0.0))
    table, cases, editor = checks.kinds(rows), checks.cases(rows), soak.found["editor"]
    if editor.get("done"):
        editor["figures"] = checks.editor_figures(rows[rows["kind"] == c.EDITOR])
    ready = soak.found.get("ready_after", "not measured")
    mixed = int(((frame["window"] != "drill") & (frame["kind"] != c.EDITOR)).sum())  # the mix's
    stalls = soak.stalls(plan, rows, lone_s)
    found = [
        *checks.accounting_checks(table, soak.requests.sent, mixed),
        checks.case_check(cases, c.INVALID),
        checks.case_check(cases, c.HOSTILE),
        *checks.server_checks(ready, idle, after, drain_s),
        checks.editor_check(editor),
        checks.stall_check(stalls, s.max_stall),
        checks.rss_check(soak.rss_samples(plan), s.rss_tolerance, s.strict_rss),
        drill_check(drill),
    ]
    total, m = table.iloc[-1], describe()
    cancelled = (
        after.cancelled - idle.cancelled
        if after and idle and None not in (after.cancelled, idle.cancelled)
        else None
    )
    result = {
        "started_at": started_at,
        "wall_s": time.monotonic() - wall,
        "settings": {
            **vars(s),
            "clients": plan.soak_clients,
            "machine": f"{m['cores']} cores (load average {m['load_average']} at the "
            f"start), {m['memory_gib']} GiB RAM, {m['cpu']}, flags "
            f"{' '.join(m['cpu_flags']) or 'none'}",
            "stuck_users": soak.found.get("stuck_users"),
            "unanswered_at_close": soak.found["unanswered_at_close"],
        },
        "server": {
            "description": handle.description,
            "started_by_soak": handle.started,
            "launcher_exit_code_at_stop": launcher_code,
            **handle.info(),
        },
        "saturation": plan.summary(),
        "total": {
            "rejected": int(total["rejected_n"]),
            **{k: int(total[k]) for k in ("sent", "ok", "abandoned", "unanswered")},
        },
        "drain": {
            "ready_after_soak": ready,
            "drain_s": round(drain_s, 1),
            "idle_before": idle and asdict(idle),
            "after_drain": after and asdict(after),
            "engine_cancelled_during_soak": cancelled,
            "clients_abandoned_during_soak": int(total["abandoned"]),
        },
        "drill": drill,
        "editor": editor,
        "stalls": stalls,
        "checks": found,
    }
    phases = [(n, b - soak.origin, e - soak.origin) for n, b, e in plan.stages if e is not None]
    paths = write_run(s.out, result, frame, soak.sampler.samples, phases)
    print(console_table(result, frame), flush=True)
    written = ", ".join(p.name for p in [s.out / "events.csv", *soak.locust_files, *paths])
    print(f"\nwritten: {written} in {s.out}", flush=True)
    if failed(result):
        print(
            f"SOAK FAILED ({', '.join(failed(result))}): see {s.out / 'report.md'} for the "
            "requests and error texts behind it",
            flush=True,
        )
        return 1
    print("soak passed", flush=True)
    return 0
