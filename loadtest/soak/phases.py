"""The soak's load phases: closed-loop client threads (:class:`Crowd`), the saturation ramp,
and the soak at twice saturation with its progress lines."""

import contextlib
import logging
import threading
import time
from typing import Any

from contract.tensors import ENGINE_MODEL
from loadtest.soak.cases import (
    HOSTILE,
    INVALID,
    OK,
    UNARY_GRPC,
    UNARY_HTTP,
    Schedule,
)
from loadtest.soak.clients import ClientParams, Rotation, Worker
from loadtest.soak.results import (
    Ledger,
)
from loadtest.soak.server import (
    RssSampler,
)
from loadtest.soak.settings import SoakSettings

log = logging.getLogger("soak")
RAMP_LEVELS = (1, 2, 4, 8, 16, 32, 64)


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
    from reporting.triton import read_snapshot

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


def lone_request_s(settings: SoakSettings, params: ClientParams) -> float | None:
    """How long one valid unary request takes alone on the idle server (its own ledger):
    the machine's speed, which the stall check scales its bound to (loadtest.soak.stall)."""
    worker = Worker(10_000, params, Ledger(), settings.seed)
    try:
        record = worker.run(UNARY_GRPC, "reference")
    finally:
        worker.close()
    return record.latency_s if record.status == OK else None


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
