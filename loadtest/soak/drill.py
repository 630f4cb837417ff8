"""The server under the soak: its RSS and the engine's gauges, sampled through the run
(:class:`Sampler`), and the stub-kill drill, whose requests are greenlets of the soak's Locust
process, each a Locust request event."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import gevent
import httpx
import psutil

from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, STREAM_MODEL
from loadtest.soak.cases import OK, STREAM, UNARY_GRPC, UNARY_HTTP
from loadtest.soak.checks import PASS, SKIP, WARN, Check
from loadtest.soak.send import Client, ClientParams, Requests
from reporting.triton import ServedTriton, read_snapshot
from serving.watchdog import model_stubs

log = logging.getLogger("soak")
SAMPLE_COLUMNS = ("t_s", "phase", "rss_bytes", "processes", "steps", "running", "pending")
ENGINE_GAUGES = (names.ENGINE_STEPS, names.ENGINE_RUNNING, names.PENDING_REQUEST_COUNT)
WINDOW_S = 60.0
DEADLINE_S = 30.0  # a drill request with no answer by then is unanswered
PROBES = ((UNARY_GRPC, "grpc"), (UNARY_HTTP, "http"), (STREAM, "stream-grpc"))


def tritonserver(served: ServedTriton) -> psutil.Process | None:
    """tritonserver's process: the launcher's child when the soak started it, else the one
    serving this HTTP port."""
    launcher, flag = served.launcher, f"--http-port={served.endpoints.ports.http}"
    with contextlib.suppress(psutil.Error):
        if launcher is not None and launcher.process is not None:
            candidates = psutil.Process(launcher.process.pid).children(recursive=True)
        else:
            candidates = [
                p for p in psutil.process_iter(["cmdline"]) if flag in (p.info["cmdline"] or [])
            ]
        return next((p for p in candidates if p.name() == "tritonserver"), None)
    return None


def find_stub(server: psutil.Process) -> psutil.Process | None:
    """The python-backend stub serving the engine model."""
    with contextlib.suppress(psutil.Error):
        stubs = model_stubs(server.pid)
        return next((psutil.Process(p) for p, m in stubs.items() if m == ENGINE_MODEL), None)
    return None


class Sampler:
    """Every ``every`` seconds, the RSS of tritonserver and its stubs, summed, for the flatness
    check, and the engine's steps and queues, to tell a stall apart (stepping with sequences
    running: busy; not stepping with requests pending: wedged), labelled with the phase."""

    def __init__(self, served: ServedTriton, clock: Callable[[], float], every: float) -> None:
        self.served, self.clock, self.every = served, clock, every
        self.samples: list[dict[str, Any]] = []
        self.phase = "start"
        self.root: psutil.Process | None = None

    def start(self) -> None:
        self.root, self.greenlet = tritonserver(self.served), gevent.spawn(self._run)

    def stop(self) -> None:
        self.greenlet.kill()

    def _run(self) -> None:
        while True:
            rss, count = None, 0
            with contextlib.suppress(psutil.Error):
                tree = [self.root, *self.root.children(recursive=True)] if self.root else []
                rss, count = sum(p.memory_info().rss for p in tree) or None, len(tree)
            engine: list[float | None] = [None, None, None]
            with contextlib.suppress(OSError, ValueError):
                snapshot = read_snapshot(self.served.endpoints.metrics_url, timeout=2.0)
                engine = [snapshot.value(n) for n in ENGINE_GAUGES]
            values = (round(self.clock(), 2), self.phase, rss, count, *engine)
            self.samples.append(dict(zip(SAMPLE_COLUMNS, values, strict=True)))
            gevent.sleep(self.every)

    def during(self, begin: float, end: float) -> str:
        """What the engine did between ``begin`` and ``end`` (run time), in a phrase."""
        inside = [s for s in self.samples if begin <= s["t_s"] <= end and s["steps"] is not None]
        if len(inside) < 2:
            return ""
        a, b = inside[0], inside[-1]
        running, pending = (max(s[k] or 0 for s in inside) for k in ("running", "pending"))
        return (
            f"{b['steps'] - a['steps']:.0f} steps in {b['t_s'] - a['t_s']:.0f} s, up to "
            f"{running:.0f} sequences running and {pending:.0f} requests pending in "
            "Triton"
        )


def http_status(url: str, timeout: float = 2.0) -> str:
    """A readiness endpoint's answer as text: "200", "400 <body>", or "no answer (...)"."""
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"no answer ({exc})"
    body = "" if response.status_code == 200 else response.text.strip()
    return f"{response.status_code} {body}".strip()


def stub_kill_drill(
    s: Any, handle: ServedTriton, params: ClientParams, requests: Requests
) -> dict[str, Any]:
    """SIGKILL the engine model's stub (the server's one engine) with three long requests in
    flight, then for 60 s poll readiness, the launcher and tritonserver, and send a fresh
    request every 3 s. Never on a server the soak did not start."""
    if not s.drill:
        return {"done": False, "note": "skipped (--no-drill)"}
    if not handle.started or handle.launcher.process is None:
        return {
            "done": False,
            "note": "skipped: the server was found running, not started by "
            "the soak (the drill never kills a server it did not start)",
        }
    server = tritonserver(handle)
    if (stub := find_stub(server) if server else None) is None:
        return {"done": False, "note": f"skipped: no {ENGINE_MODEL} python-backend stub found"}
    launcher, http = handle.launcher.process, s.endpoints.http_url
    urls = {
        "live": f"{http}/v2/health/live",
        "ready": f"{http}/v2/health/ready",
        **{
            f"{m} ready": f"{http}/v2/models/{m}/ready"
            for m in (ENGINE_MODEL, ENSEMBLE_MODEL, STREAM_MODEL)
        },
    }
    params = replace(params, deadline_s=min(params.deadline_s, DEADLINE_S))
    long = replace(params, max_tokens=params.long_tokens)  # still running at the kill
    sent: list[gevent.Greenlet] = []

    def send(kind: str, transport: str) -> None:
        client = Client(100 + len(sent), long if len(sent) < 3 else params, requests, s.seed)
        sent.append(gevent.spawn(lambda: (client.run(kind, "", transport), client.close())))

    log.info(f"drill: requests in flight, then SIGKILL to the {ENGINE_MODEL} stub pid {stub.pid}")
    stub_info = {"pid": stub.pid, "cmdline": " ".join(stub.cmdline())[:300]}
    for probe in PROBES:
        send(*probe)
    gevent.sleep(1.0)
    killed, killed_at, killed_wall = time.monotonic(), datetime.now(), time.time()
    stub.send_signal(signal.SIGKILL)
    timeline: list[dict[str, Any]] = []
    last: dict[str, Any] = {}

    def note(what: str, value: Any) -> None:
        if last.get(what) != value:
            last[what], t = value, time.monotonic() - killed
            timeline.append({"t_s": round(t, 2), "what": what, "value": value})
            log.info(f"drill +{t:5.1f}s  {what}: {value}")

    next_probe, launcher_gone = killed + 2.0, None
    while time.monotonic() - killed < WINDOW_S:
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
            send(*PROBES[(len(sent) - 3) % len(PROBES)])
            next_probe += 3.0
        gevent.sleep(0.5)
    gevent.joinall(sent, timeout=DEADLINE_S + 5.0)  # the last probe's deadline at most
    requests.close(f"no answer within {DEADLINE_S:.0f} s")
    unwell: dict[str, float] = {}  # when each thing first stopped being 200 or running
    for e in timeline:
        if e["value"] not in ("200", "running"):
            unwell.setdefault(e["what"], e["t_s"])
    code, exited_at = launcher.poll(), unwell.get("launcher")
    stubs = {e["value"] for e in timeline if e["what"] == f"{ENGINE_MODEL} stub"}
    failed = [r for r in requests.ended if r["status"] != OK]
    return {
        "done": True,
        "stub": stub_info,
        "killed_at": killed_at.isoformat(timespec="seconds"),
        "note": f"SIGKILL to the {ENGINE_MODEL} stub of the server this soak started; watched "
        f"{min(WINDOW_S, time.monotonic() - killed):.0f} s",
        "server_ready_turned_false_after_s": unwell.get("ready"),
        "stage_ready_turned_false_after_s": unwell.get(f"{ENGINE_MODEL} ready"),
        "launcher_exit": f"code {code} after {exited_at:.1f} s"
        if code is not None and exited_at is not None
        else f"still running after {WINDOW_S:.0f} s",
        "launcher_exit_code": code,
        "tritonserver_exit": last.get("tritonserver"),
        "stub_restarted": bool(stubs - {"none", f"pid {stub.pid}"}),
        "requests": len(requests.ended),
        "requests_failed": len(failed),
        "requests_failed_clearly": sum(r["category"] not in ("", "unclear") for r in failed),
        "timeline": timeline,  # the first three started before the kill, the probes after it
        "in_flight": [r for r in requests.ended if r["started"] < killed_wall],
    }


def drill_check(drill: dict[str, Any]) -> Check:
    """Passes when the launcher exits non-zero or the stub comes back; else a warning."""
    if not drill.get("done"):
        return Check("stub-kill drill", SKIP, str(drill.get("note")))

    def turned(key: str) -> str:
        return "200 throughout" if drill[key] is None else f"not 200 after {drill[key]:.1f} s"

    detail = (
        f"/v2/health/ready {turned('server_ready_turned_false_after_s')}, "
        f"/v2/models/{ENGINE_MODEL}/ready {turned('stage_ready_turned_false_after_s')}; "
        f"launcher {drill['launcher_exit']}; {drill['requests_failed']} of "
        f"{drill['requests']} requests failed, {drill['requests_failed_clearly']} with a clear "
        f"error; stub restarted: {drill['stub_restarted']}"
    )
    passed = drill.get("launcher_exit_code") not in (None, 0) or drill["stub_restarted"]
    return Check("stub-kill drill", PASS if passed else WARN, detail)
