"""``make soak``: a bounded load and fault test of the served ensemble on this machine.

    python -m loadtest.soak --host 127.0.0.1:8000 --duration 120

1. Finds a ready Triton at ``--host`` or starts one through the launcher
   (:mod:`loadtest.soak_server`); traffic only ever goes to 127.0.0.1.
2. Saturation: a short ramp of closed-loop unary clients (1, 2, 4, ...) until throughput stops
   rising; or ``--saturation N``.
3. The soak: twice that many clients for ``--duration`` seconds, each sending the mix
   (:mod:`loadtest.soak_cases`): valid unary (gRPC, HTTP) and streams, clients that vanish
   mid-stream and mid-request, invalid and hostile requests. Every request is accounted for
   (:class:`~loadtest.soak_results.Ledger`); the server's RSS is sampled throughout.
4. Drain: waits until the engine is idle, reads its running-sequences and KV-cache gauges.
5. The stub-kill drill, on a server the soak started only: SIGKILL the stub of the ``engine``
   model (the one engine, behind ``gptj`` and ``ensemble_stream``) and watch
   readiness, requests and the launcher for 60 s.

Writes ``loadtest/results/soak-<time>/`` (summary.json, report.md, soak.png, requests.csv,
rss.csv, the server log when it started one) and exits 1 when a check fails (a request left
unanswered, an invalid request not refused by name, the engine not idle after the drain), 2
when it could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, STREAM_MODEL
from loadtest.prompts import code_prompts
from loadtest.soak_cases import (
    DEFAULT_MIX,
    HOSTILE,
    INVALID,
    KINDS,
    OK,
    UNARY_GRPC,
    UNARY_HTTP,
    Schedule,
    parse_mix,
)
from loadtest.soak_clients import ClientParams, Rotation, Worker
from loadtest.soak_results import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    Ledger,
    SoakResult,
    accounting_checks,
    case_check,
    case_summaries,
    console_table,
    error_messages,
    kind_summaries,
    rss_flatness,
    total_summary,
    write_run,
)
from loadtest.soak_server import (
    EngineState,
    RssSampler,
    ServerHandle,
    close_server,
    engine_state,
    find_stub,
    http_status,
    model_context,
    open_server,
    wait_for_drain,
)
from loadtest.targets import Endpoints
from serving.paths import MODEL_REPOSITORY, REPO_ROOT

log = logging.getLogger("soak")
RESULTS = REPO_ROOT / "loadtest" / "results"
RAMP_LEVELS = (1, 2, 4, 8, 16, 32, 64)
DRILL_WINDOW_S = 60.0
DRILL_DEADLINE_S = 30.0  # a drill request with no answer by then is unanswered


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1:8000", help="Triton's HTTP host:port (local)")
    p.add_argument("--grpc-url", help="Triton's gRPC host:port (default: HTTP port + 1)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: HTTP port + 2)")
    p.add_argument("--duration", type=float, default=120.0, help="soak seconds at 2x saturation")
    p.add_argument("--saturation", type=int, help="clients at saturation (skips the ramp)")
    p.add_argument("--clients", type=int, help="soak clients (default: 2 x saturation)")
    p.add_argument("--ramp-step", type=float, default=8.0, help="seconds per ramp level")
    p.add_argument(
        "--ramp-gain",
        type=float,
        default=0.10,
        help="throughput must rise by this fraction for the ramp to go on (0.10)",
    )
    p.add_argument(
        "--ramp-patience",
        type=int,
        default=2,
        help="levels in a row without that rise before the ramp stops (2: one noisy level on "
        "a shared machine does not end it)",
    )
    p.add_argument("--max-clients", type=int, default=32, help="the ramp's last level (32)")
    p.add_argument(
        "--mix",
        default=",".join(f"{k}={w}" for k, w in DEFAULT_MIX.items()),
        help="kind=weight,... over " + ", ".join(KINDS),
    )
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per valid request")
    p.add_argument(
        "--long-tokens", type=int, default=256, help="tokens asked by clients that then vanish"
    )
    p.add_argument("--prompt-chars", type=int, default=600, help="longest code prompt")
    p.add_argument(
        "--deadline",
        type=float,
        default=180.0,
        help="seconds after which a request with no answer counts as unanswered (180; "
        "Triton's queue policy rejects at 120)",
    )
    p.add_argument("--warmup", type=float, help="soak seconds before RSS counts (duration/6)")
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument(
        "--rss-tolerance", type=float, default=0.10, help="RSS growth still called flat (0.10)"
    )
    p.add_argument("--strict-rss", action="store_true", help="fail (not warn) on RSS growth")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for idle")
    p.add_argument(
        "--no-drill", action="store_true", help="skip the stub-kill drill (own server only)"
    )
    p.add_argument("--progress-every", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (loadtest/results/soak-<time>)")
    p.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    return p


def parse_args(argv: list[str] | None = None) -> SoakSettings:
    p = parser()
    args = p.parse_args(argv)
    try:
        endpoints = Endpoints.from_host(args.host, args.grpc_url, args.metrics_url)
        mix = parse_mix(args.mix)
    except ValueError as exc:
        p.error(str(exc))
    if not endpoints.is_local:
        p.error(f"--host must be on this machine (127.0.0.1 or localhost), got {args.host}")
    for name in ("duration", "ramp_step", "deadline", "rss_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("saturation", "clients", "max_clients", "max_tokens", "long_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return SoakSettings(
        endpoints=endpoints,
        duration_s=args.duration,
        saturation=args.saturation,
        ramp_step_s=args.ramp_step,
        ramp_gain=args.ramp_gain,
        ramp_patience=max(1, args.ramp_patience),
        max_clients=args.max_clients,
        clients=args.clients,
        mix=mix,
        max_tokens=args.max_tokens,
        long_tokens=args.long_tokens,
        prompt_chars=args.prompt_chars,
        deadline_s=args.deadline,
        warmup_s=args.duration / 6 if args.warmup is None else args.warmup,
        rss_every_s=args.rss_every,
        rss_tolerance=args.rss_tolerance,
        strict_rss=args.strict_rss,
        drain_timeout_s=args.drain_timeout,
        drill=not args.no_drill,
        progress_every_s=args.progress_every,
        seed=args.seed,
        out=args.out or RESULTS / f"soak-{stamp}",
        model_repository=args.model_repository,
    )


# --- closed-loop clients -------------------------------------------------------------------


class Crowd:
    """Closed-loop client threads: client ``i`` keeps sending while ``i < active`` and the
    clock is before ``until``; each picks its next request from ``choose``."""

    def __init__(self, params: ClientParams, ledger: Ledger, seed: int, phase: str) -> None:
        self.params, self.ledger, self.seed, self.phase = params, ledger, seed, phase
        self.active = 0
        self.until = float("inf")
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.choose = lambda: (UNARY_GRPC, "", "")

    def grow(self, count: int) -> None:
        self.active = count
        while len(self.threads) < count:
            index = len(self.threads)
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True)
            thread.name = f"{self.phase}-client-{index}"
            self.threads.append(thread)
            thread.start()

    def _loop(self, index: int) -> None:
        worker = Worker(index, self.params, self.ledger, self.seed)
        try:
            while index < self.active and not self.stop.is_set() and time.monotonic() < self.until:
                kind, case, transport = self.choose()
                worker.run(kind, self.phase, case, transport)
        finally:
            worker.close()

    def finish(self, timeout: float) -> int:
        """Stop starting requests and wait up to ``timeout`` for those in flight; how many
        threads are still busy."""
        self.active = 0
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self.threads)


# --- the phases ----------------------------------------------------------------------------


def generated_tokens(metrics_url: str) -> float | None:
    from contract import metrics as names
    from loadtest.metrics import read_snapshot

    with contextlib.suppress(OSError, ValueError):
        return read_snapshot(metrics_url).value(names.ENGINE_GENERATED_TOKENS, model=ENGINE_MODEL)
    return None


def measure_level(settings: SoakSettings, ledger: Ledger, level: int) -> dict[str, Any]:
    """Throughput at one ramp level over a window of at least ``ramp_step`` seconds, longer
    (up to 4x) until ``level`` requests completed in it: a request counts when it ends, so a
    window shorter than the latency would measure nothing."""
    begin, tokens0 = ledger.now(), generated_tokens(settings.endpoints.metrics_url)
    shortest, longest = begin + settings.ramp_step_s, begin + 4 * settings.ramp_step_s
    while True:
        time.sleep(0.5)
        now = ledger.now()
        records, _ = ledger.snapshot()
        done = sum(
            r.phase == "ramp" and r.status == OK and begin <= r.started_s + (r.latency_s or 0)
            for r in records
        )
        if now >= longest or (now >= shortest and done >= max(2, level)):
            break
    tokens1 = generated_tokens(settings.endpoints.metrics_url)
    window = now - begin
    tokens = (tokens1 - tokens0) / window if tokens0 is not None and tokens1 is not None else 0.0
    return {
        "clients": level,
        "rps": done / window,
        "tokens_per_s": tokens,
        "window_s": round(window, 1),
        "done": done,
    }


def find_saturation(settings: SoakSettings, params: ClientParams, ledger: Ledger) -> dict[str, Any]:
    """The smallest client count whose throughput the next level does not beat by
    ``ramp_gain``: unary gRPC requests, each level measured by :func:`measure_level` after a
    quarter step for the new clients to settle."""
    if settings.saturation:
        return {"clients": settings.saturation, "steps": [], "note": "given (--saturation)"}
    crowd = Crowd(params, ledger, settings.seed, "ramp")
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    flat_levels = 0
    note = ""
    levels = [n for n in RAMP_LEVELS if n <= settings.max_clients]
    try:
        for level in levels:
            crowd.grow(level)
            time.sleep(settings.ramp_step_s / 4)  # the new clients settle
            step = measure_level(settings, ledger, level)
            steps.append(step)
            measure = "tokens_per_s" if step["tokens_per_s"] else "rps"
            log.info(
                f"ramp: {level:3d} clients  {step['rps']:6.2f} requests/s  "
                f"{step['tokens_per_s']:7.0f} tokens/s  ({step['done']} done in "
                f"{step['window_s']:.0f}s)"
            )
            if best is None or step[measure] > best[measure] * (1 + settings.ramp_gain):
                best, flat_levels = step, 0
                continue
            flat_levels += 1
            if flat_levels >= settings.ramp_patience:
                note = (
                    f"throughput stopped rising at {best['clients']} clients: "
                    f"{level} gave {step[measure]:.1f} {measure.replace('_', ' ')} vs "
                    f"{best[measure]:.1f} (needs +{settings.ramp_gain:.0%})"
                )
                break
        else:
            note = (
                f"throughput still rising at the last level ({levels[-1]}, --max-clients)"
                if flat_levels == 0
                else f"the ramp ended at --max-clients {levels[-1]}; best at {best['clients']}"
            )
    finally:
        crowd.finish(settings.deadline_s)
    assert best is not None
    log.info(f"saturation: {best['clients']} clients ({note})")
    return {"clients": best["clients"], "steps": steps, "note": note}


def progress(
    ledger: Ledger, sampler: RssSampler, clients: int, began: float, duration: float
) -> str:
    records, in_flight = ledger.snapshot()
    soak = [r for r in records if r.phase == "soak"]
    counts = {s: sum(r.status == s for r in soak) for s in ("ok", "rejected", "abandoned")}
    unanswered = sum(r.status == "unanswered" for r in soak)
    recent = sorted(
        r.latency_s
        for r in soak[-200:]
        if r.status == OK and r.kind in (UNARY_GRPC, UNARY_HTTP) and r.latency_s
    )
    p50 = f"{recent[len(recent) // 2]:.2f}s" if recent else "-"
    sample = sampler.latest()
    rss = f"{sample.rss_bytes / 2**30:.2f} GiB" if sample else "n/a"
    elapsed = time.monotonic() - began
    return (
        f"soak {elapsed:4.0f}/{duration:.0f}s  clients {clients}  sent {len(soak) + in_flight}  "
        f"ok {counts['ok']}  rejected {counts['rejected']}  abandoned {counts['abandoned']}  "
        f"unanswered {unanswered}  in flight {in_flight}  unary p50 {p50}  RSS {rss}"
    )


def run_soak(
    settings: SoakSettings,
    params: ClientParams,
    ledger: Ledger,
    sampler: RssSampler,
    clients: int,
) -> tuple[float, float, int]:
    """The mix at ``clients`` closed-loop clients for the duration; (begin, end) in ledger
    time and how many client threads were still stuck after the deadline."""
    schedule, rotation = Schedule(settings.mix), Rotation()
    choose_lock = threading.Lock()

    def choose() -> tuple[str, str, str]:
        with choose_lock:
            kind = schedule.next()
            if kind in (INVALID, HOSTILE):
                case, transport = rotation.next(kind)
                return kind, case, transport
            return kind, "", ""

    crowd = Crowd(params, ledger, settings.seed + 1, "soak")
    crowd.choose = choose
    began, begin = time.monotonic(), ledger.now()
    crowd.until = began + settings.duration_s
    sampler.phase = "soak"
    crowd.grow(clients)
    next_line = began + settings.progress_every_s
    try:
        while time.monotonic() < crowd.until:
            time.sleep(min(1.0, max(0.0, crowd.until - time.monotonic())))
            if time.monotonic() >= next_line:
                log.info(progress(ledger, sampler, clients, began, settings.duration_s))
                next_line += settings.progress_every_s
    except KeyboardInterrupt:
        log.warning("interrupted: stopping the clients (Ctrl-C again to abandon them)")
        crowd.stop.set()
    end = ledger.now()
    log.info(f"soak over; waiting up to {settings.deadline_s:.0f}s for requests in flight")
    stuck = crowd.finish(settings.deadline_s + 10)
    log.info(progress(ledger, sampler, clients, began, settings.duration_s))
    return begin, end, stuck


# --- the drill -----------------------------------------------------------------------------


def stub_kill_drill(
    settings: SoakSettings, handle: ServerHandle, params: ClientParams
) -> dict[str, Any]:
    """SIGKILL the stub of the engine model (the server's one engine) of a server this soak
    started, with requests in flight, and watch for 60 s: readiness, fresh requests, the
    launcher and tritonserver."""
    if not settings.drill:
        return {"done": False, "note": "skipped (--no-drill)"}
    if not handle.started or handle.launcher is None or handle.launcher.process is None:
        return {
            "done": False,
            "note": "skipped: the server was found running, not started by the soak (the drill "
            "never kills a server it did not start)",
        }
    server = handle.tritonserver()
    stub = find_stub(server) if server else None
    if stub is None:
        return {"done": False, "note": f"skipped: no {ENGINE_MODEL} python-backend stub found"}
    launcher = handle.launcher.process
    http = settings.endpoints.http_url
    urls = {
        "live": f"{http}/v2/health/live",
        "ready": f"{http}/v2/health/ready",
        f"{ENGINE_MODEL} ready": f"{http}/v2/models/{ENGINE_MODEL}/ready",
        f"{ENSEMBLE_MODEL} ready": f"{http}/v2/models/{ENSEMBLE_MODEL}/ready",
        f"{STREAM_MODEL} ready": f"{http}/v2/models/{STREAM_MODEL}/ready",
    }
    ledger = Ledger()
    threads: list[threading.Thread] = []
    params = replace(params, deadline_s=min(params.deadline_s, DRILL_DEADLINE_S))
    # the requests in flight at the kill ask for many tokens, so that they are still running
    long = replace(params, max_tokens=params.long_tokens)

    def send(kind: str, transport: str, index: int) -> None:
        worker = Worker(100 + index, long if index < 3 else params, ledger, settings.seed)
        try:
            worker.run(kind, "drill", "", transport)
        finally:
            worker.close()

    def launch(kind: str, transport: str) -> None:
        thread = threading.Thread(target=send, args=(kind, transport, len(threads)), daemon=True)
        threads.append(thread)
        thread.start()

    stub_info = {"pid": stub.pid, "cmdline": " ".join(stub.cmdline())[:300]}
    log.info(f"drill: requests in flight, then SIGKILL to the {ENGINE_MODEL} stub pid {stub.pid}")
    for kind, transport in ((UNARY_GRPC, "grpc"), (UNARY_HTTP, "http"), ("stream", "stream-grpc")):
        launch(kind, transport)
    time.sleep(1.0)
    killed, killed_at = time.monotonic(), datetime.now().isoformat(timespec="seconds")
    stub.send_signal(signal.SIGKILL)
    timeline: list[dict[str, Any]] = []
    last: dict[str, Any] = {}

    def note(what: str, value: Any) -> None:
        if last.get(what) != value:
            last[what] = value
            t = time.monotonic() - killed
            timeline.append({"t_s": round(t, 2), "what": what, "value": value})
            log.info(f"drill +{t:5.1f}s  {what}: {value}")

    probes = ((UNARY_GRPC, "grpc"), (UNARY_HTTP, "http"), ("stream", "stream-grpc"))
    next_probe, probe_index, launcher_gone = killed + 2.0, 0, None
    while time.monotonic() - killed < DRILL_WINDOW_S:
        for what, url in urls.items():
            note(what, http_status(url, timeout=1.0))
        code = launcher.poll()
        note("launcher", "running" if code is None else f"exited with code {code}")
        note("tritonserver", "running" if server.is_running() else "exited")
        new_stub = find_stub(server) if server.is_running() else None
        note(f"{ENGINE_MODEL} stub", f"pid {new_stub.pid}" if new_stub else "none")
        if code is not None and launcher_gone is None:
            launcher_gone = time.monotonic()
        if launcher_gone is not None and time.monotonic() - launcher_gone > 3.0:
            break
        if time.monotonic() >= next_probe and launcher_gone is None:
            launch(*probes[probe_index % len(probes)])
            probe_index += 1
            next_probe += 3.0
        time.sleep(0.5)
    for thread in threads:  # the last probe's deadline ends at most DRILL_DEADLINE_S from now
        thread.join(timeout=DRILL_DEADLINE_S + 5.0)
    ledger.close(f"no answer within {DRILL_DEADLINE_S:.0f} s")
    records, _ = ledger.snapshot()
    # the first three started before the kill; probes start 2 s and more after it
    in_flight = [asdict(r) for r in records if r.started_s < 1.5]
    probes_done = [asdict(r) for r in records if r.started_s >= 1.5]
    ready_false = next(
        (e["t_s"] for e in timeline if e["what"] == "ready" and e["value"] != "200"), None
    )
    stage_false = next(
        (
            e["t_s"]
            for e in timeline
            if e["what"] == f"{ENGINE_MODEL} ready" and e["value"] != "200"
        ),
        None,
    )
    launcher_code = launcher.poll()
    exited_at = next(
        (e["t_s"] for e in timeline if e["what"] == "launcher" and e["value"] != "running"), None
    )
    stubs = [e["value"] for e in timeline if e["what"] == f"{ENGINE_MODEL} stub"]
    restarted = any(v not in ("none", f"pid {stub.pid}") for v in stubs)
    failed = [r for r in (*in_flight, *probes_done) if r["status"] != OK]
    clear = [r for r in failed if r["category"] not in ("", "unclear")]
    summary = {
        "done": True,
        "note": f"SIGKILL to the {ENGINE_MODEL} stub of the server this soak started; watched "
        f"{min(DRILL_WINDOW_S, time.monotonic() - killed):.0f} s",
        "stub": stub_info,
        "killed_at": killed_at,
        "server_ready_turned_false_after_s": ready_false,
        "stage_ready_turned_false_after_s": stage_false,
        "launcher_exit": (
            f"code {launcher_code} after {exited_at:.1f} s"
            if launcher_code is not None and exited_at is not None
            else f"still running after {DRILL_WINDOW_S:.0f} s"
        ),
        "launcher_exit_code": launcher_code,
        "tritonserver_exit": last.get("tritonserver"),
        "stub_restarted": restarted,
        "requests": len(records),
        "requests_failed": len(failed),
        "requests_failed_clearly": len(clear),
        "timeline": timeline,
        "in_flight": in_flight,
        "probes": probes_done,
    }
    return summary


def drill_check(drill: dict[str, Any]) -> Check:
    if not drill.get("done"):
        return Check("stub-kill drill", SKIP, str(drill.get("note")))
    code = drill.get("launcher_exit_code")

    def turned(key: str) -> str:
        after = drill[key]
        return "200 throughout" if after is None else f"not 200 after {after:.1f} s"

    detail = (
        f"/v2/health/ready {turned('server_ready_turned_false_after_s')}, "
        f"/v2/models/{ENGINE_MODEL}/ready {turned('stage_ready_turned_false_after_s')}; "
        f"launcher {drill['launcher_exit']}; {drill['requests_failed']} of "
        f"{drill['requests']} requests failed, {drill['requests_failed_clearly']} with a clear "
        f"error; stub restarted: {drill['stub_restarted']}"
    )
    restarted_or_exited = code not in (None, 0) or drill["stub_restarted"]
    return Check("stub-kill drill", PASS if restarted_or_exited else WARN, detail)


# --- the run -------------------------------------------------------------------------------


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} cores (load average {load} at the start), {memory:.1f} GiB RAM"


def kv_check(before: EngineState | None, after: EngineState | None) -> Check:
    if after is None or after.kv_cache_bytes is None:
        return Check("KV cache back to idle", SKIP, "not exported (codegen_engine_kv_cache_bytes)")
    idle = before.kv_cache_bytes if before and before.kv_cache_bytes is not None else 0.0
    back = after.kv_cache_bytes <= idle * 1.01 + 2**20
    return Check(
        "KV cache back to idle",
        PASS if back else WARN,
        f"{after.kv_cache_bytes / 2**20:.1f} MiB after the drain vs {idle / 2**20:.1f} MiB idle",
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    settings = parse_args(argv)
    settings.out.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now().isoformat(timespec="seconds")
    wall = time.monotonic()
    log.info(f"soak: results in {settings.out}")
    try:
        handle = open_server(settings.endpoints, settings.model_repository, settings.out)
    except SystemExit as exc:
        log.error(f"soak cannot run: {exc}")
        return 2
    log.info(f"server {handle.description}")
    ledger = Ledger()
    sampler = RssSampler(handle, ledger.now, settings.rss_every_s).start()
    phases: list[tuple[str, float, float]] = []
    drill: dict[str, Any] = {}
    try:
        prompts = tuple(code_prompts(300, settings.seed, max_chars=settings.prompt_chars))
        params = ClientParams(
            endpoints=settings.endpoints,
            prompts=prompts,
            max_tokens=settings.max_tokens,
            long_tokens=settings.long_tokens,
            deadline_s=settings.deadline_s,
            context=model_context(settings.model_repository),
        )
        idle_state = _engine(settings)
        sampler.phase = "ramp"
        t0 = ledger.now()
        saturation = find_saturation(settings, params, ledger)
        if saturation["steps"]:
            phases.append(("ramp", t0, ledger.now()))
        clients = settings.clients or 2 * saturation["clients"]
        log.info(f"soak: {clients} clients for {settings.duration_s:.0f}s")
        before = _engine(settings)
        begin, end, stuck = run_soak(settings, params, ledger, sampler, clients)
        unanswered_left = ledger.close(
            f"still in flight {settings.deadline_s:.0f}s after the soak ended"
        )
        phases.append(("soak", begin, ledger.now()))
        ready_after = http_status(f"{settings.endpoints.http_url}/v2/health/ready")
        sampler.phase = "drain"
        t_drain = ledger.now()
        after, drain_s = wait_for_drain(settings.endpoints.metrics_url, settings.drain_timeout_s)
        phases.append(("drain", t_drain, ledger.now()))
        records, _ = ledger.snapshot()
        soak_records = [r for r in records if r.phase == "soak"]
        warm = [
            s.rss_bytes
            for s in sampler.samples
            if s.phase == "soak" and begin + settings.warmup_s <= s.t_s <= end
        ]
        flatness = rss_flatness(warm, settings.rss_tolerance) if sampler.available else None
        t_drill = ledger.now()
        sampler.phase = "drill"
        drill = stub_kill_drill(settings, handle, params)
        if drill.get("done"):
            phases.append(("drill", t_drill, ledger.now()))
    finally:
        sampler.stop()
        # a drilled server has requests that never end: Triton's own exit waits for them
        launcher_code = close_server(handle, timeout=20.0 if drill.get("done") else None)
    kinds = kind_summaries(soak_records)
    total = total_summary(kinds)
    cases = case_summaries(soak_records)
    abandoned = total.abandoned
    cancelled = (
        after.cancelled - before.cancelled
        if after and before and after.cancelled is not None and before.cancelled is not None
        else None
    )
    checks = [
        *accounting_checks(total, kinds),
        case_check(cases, INVALID),
        case_check(cases, HOSTILE),
        Check(
            "server ready after the soak",
            PASS if ready_after == "200" else FAIL,
            f"/v2/health/ready answered {ready_after}",
        ),
        Check(
            "engine idle after the drain",
            PASS if after and after.running == 0 and not after.pending else FAIL,
            f"running sequences {after.running if after else '?'}, pending requests "
            f"{after.pending if after else '?'} after {drain_s:.1f}s",
        ),
        kv_check(idle_state, after),
    ]
    if flatness is None:
        checks.append(Check("RSS flat after warm-up", SKIP, "server process not found"))
    else:
        growing = FAIL if settings.strict_rss else WARN
        status = SKIP if flatness.flat is None else PASS if flatness.flat else growing
        checks.append(Check("RSS flat after warm-up", status, flatness.note))
    checks.append(drill_check(drill))
    result = SoakResult(
        settings={
            "host": settings.endpoints.host,
            "duration_s": settings.duration_s,
            "clients": clients,
            "mix": settings.mix,
            "max_tokens": settings.max_tokens,
            "long_tokens": settings.long_tokens,
            "deadline_s": settings.deadline_s,
            "warmup_s": settings.warmup_s,
            "rss_every_s": settings.rss_every_s,
            "rss_tolerance": settings.rss_tolerance,
            "seed": settings.seed,
            "machine": machine(),
            "stuck_client_threads": stuck,
            "unanswered_at_close": unanswered_left,
        },
        server={
            "description": handle.description,
            "started_by_soak": handle.started,
            "launcher_exit_code_at_stop": launcher_code,
            **handle.info,
        },
        saturation=saturation,
        kinds=kinds,
        total=total,
        cases=cases,
        errors=error_messages(soak_records),
        rss=flatness,
        rss_note="RSS not measured: tritonserver's process not found on this machine",
        drain={
            "ready_after_soak": ready_after,
            "drain_s": round(drain_s, 1),
            "running_sequences_after": after.running if after else None,
            "pending_requests_after": after.pending if after else None,
        },
        engine={
            "idle_before": asdict(idle_state) if idle_state else None,
            "after_drain": asdict(after) if after else None,
            "kv_cache_bytes": "not exported"
            if not after or after.kv_cache_bytes is None
            else after.kv_cache_bytes,
            "engine_cancelled_during_soak": cancelled,
            "clients_abandoned_during_soak": abandoned,
        },
        drill=drill,
        checks=checks,
        started_at=started_at,
        wall_s=time.monotonic() - wall,
    )
    paths = write_run(settings.out, result, records, sampler.samples, phases)
    print(console_table(result), flush=True)
    print(f"\nwritten: {', '.join(p.name for p in paths)} in {settings.out}", flush=True)
    if result.failed:
        failed = ", ".join(c.name for c in checks if c.status == FAIL)
        print(
            f"SOAK FAILED ({failed}): see {settings.out / 'report.md'} for the requests and "
            "error texts behind it",
            flush=True,
        )
        return 1
    print("soak passed", flush=True)
    return 0


def _engine(settings: SoakSettings) -> EngineState | None:
    with contextlib.suppress(OSError, ValueError):
        return engine_state(settings.endpoints.metrics_url)
    return None


if __name__ == "__main__":
    sys.exit(main())
