"""``make soak``: a bounded load and fault test of the served ensemble on this machine.

    python -m loadtest.soak --host 127.0.0.1:8000 --duration 120

1. Finds a ready Triton at ``--host`` or starts one through the launcher
   (:mod:`loadtest.soak.server`); traffic only ever goes to 127.0.0.1.
2. Saturation: a short ramp of closed-loop unary clients (1, 2, 4, ...) until throughput stops
   rising; or ``--saturation N``.
3. The soak: twice that many clients for ``--duration`` seconds, each sending the mix
   (:mod:`loadtest.soak.cases`): valid unary (gRPC, HTTP) and streams, clients that vanish
   mid-stream and mid-request, invalid and hostile requests. Every request is accounted for
   (:class:`~loadtest.soak.results.Ledger`); the server's RSS is sampled throughout.
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

import contextlib
import logging
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any

from contract.prompts import code_prompts
from loadtest.soak.cases import (
    HOSTILE,
    INVALID,
)
from loadtest.soak.clients import ClientParams
from loadtest.soak.drill import drill_check, stub_kill_drill
from loadtest.soak.editor_phase import editor_check, run_editor_phase
from loadtest.soak.phases import find_saturation, lone_request_s, run_soak
from loadtest.soak.report import console_table, write_run
from loadtest.soak.results import (
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
    error_messages,
    kind_summaries,
    total_summary,
)
from loadtest.soak.server import RssSampler, http_status, rss_flatness
from loadtest.soak.settings import SoakSettings, parse_args
from loadtest.soak.stall import EngineSampler, explain, longest_stall, stall_check
from reporting.machine import describe
from reporting.triton import EngineState, engine_state, model_context, open_triton, wait_for_drain

# --- the run -------------------------------------------------------------------------------

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
    return Check(
        "KV cache back to idle",
        PASS if back else WARN,
        f"{after.kv_cache_bytes / 2**20:.1f} MiB after the drain vs {idle / 2**20:.1f} MiB idle",
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per HTTP request
    settings = parse_args(argv)
    settings.out.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now().isoformat(timespec="seconds")
    wall = time.monotonic()
    log.info(f"soak: results in {settings.out}")
    try:
        handle = open_triton(
            settings.endpoints, settings.model_repository, settings.out / "tritonserver.log"
        )
    except SystemExit as exc:
        log.error(f"soak cannot run: {exc}")
        return 2
    log.info(f"server {handle.description}")
    ledger = Ledger()
    sampler = RssSampler(handle, ledger.now, settings.rss_every_s).start()
    engine_sampler = EngineSampler(settings.endpoints.metrics_url, ledger.now).start()
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
        lone_s = lone_request_s(settings, params)
        log.info(f"one valid request alone takes {lone_s or 0:.2f} s on this machine now")
        begin, end, stuck = run_soak(settings, params, ledger, sampler, clients)
        unanswered_left = ledger.close(
            f"still in flight {settings.deadline_s:.0f}s after the soak ended"
        )
        phases.append(("soak", begin, ledger.now()))
        editor_begin, editor_end, editor = run_editor_phase(settings, ledger, sampler)
        editor_left = ledger.close("still in flight after the editor phase ended")
        if editor.get("done"):
            phases.append(("editor", editor_begin, ledger.now()))
        ready_after = http_status(f"{settings.endpoints.http_url}/v2/health/ready")
        sampler.phase = "drain"
        t_drain = ledger.now()
        after, drain_s = wait_for_drain(settings.endpoints.metrics_url, settings.drain_timeout_s)
        phases.append(("drain", t_drain, ledger.now()))
        records, _ = ledger.snapshot()
        soak_records = [r for r in records if r.phase in ("soak", "editor")]
        bound = settings.max_stall_s
        soak_phase = [r for r in records if r.phase == "soak"]
        stalls = [longest_stall("soak", soak_phase, begin, end, bound, lone_s)]
        if editor.get("done"):
            editor_records = [r for r in records if r.phase == "editor"]
            stalls.append(
                longest_stall(
                    "editor",
                    editor_records,
                    editor_begin,
                    editor_end,
                    bound,
                    editor.get("lone_first_token_s"),
                )
            )
        warm = [
            s.rss_bytes
            for s in sampler.samples
            if s.phase == "soak" and begin + settings.warmup_s <= s.t_s <= end
        ]
        stalls = [explain(stall, engine_sampler) for stall in stalls]
        flatness = rss_flatness(warm, settings.rss_tolerance) if sampler.available else None
        t_drill = ledger.now()
        sampler.phase = "drill"
        drill = stub_kill_drill(settings, handle, params)
        if drill.get("done"):
            phases.append(("drill", t_drill, ledger.now()))
    finally:
        sampler.stop()
        engine_sampler.stop()
        # a drilled server has requests that never end: Triton's own exit waits for them
        launcher_code = handle.close(timeout=20.0 if drill.get("done") else None)
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
        editor_check(editor),
        stall_check(stalls, settings.max_stall_s),
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
            "unanswered_at_close": unanswered_left + editor_left,
            "max_stall_s": settings.max_stall_s,
        },
        server={
            "description": handle.description,
            "started_by_soak": handle.started,
            "launcher_exit_code_at_stop": launcher_code,
            **handle.info(),
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
        editor=editor,
        stalls=stalls,
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
