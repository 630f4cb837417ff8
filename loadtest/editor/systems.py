"""The servers a run measures (:class:`System`: sender, counters, CPU, idle) and
:func:`open_systems`, which starts them on free ports, each half of the cache comparison from a
repository copy whose engine config sets ``prefix_caching``, checked against the engine's own
log line (the torch backend has no prefix cache: refused, not compared)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from contract import metrics as names
from contract.tensors import ENGINE_MODEL
from loadtest.editor.protocols import Sender
from loadtest.editor.window import MARGIN_TOKENS
from loadtest.targets import TARGETS, OpenAITarget
from reporting import llama_server as llama
from reporting.machine import tree_cpu_seconds
from reporting.triton import Endpoints, read_snapshot, wait_for_drain
from serving.paths import checkpoint_dir
from serving.process import free_ports
from serving.triton import Ports

log = logging.getLogger("loadtest.editor")
T_MAX_PREDICT_MS = 1000  # both servers' time-budget stop: llama.vim's follow-up budget
ON, OFF, PROJECT, LLAMA, SINGLE = "cache-on", "cache-off", "project", "llama.cpp", "as configured"
# the counters every system gives, by the same names (the stops: the engine's alone)
ENGINE_COUNTERS = {
    "generated": names.ENGINE_GENERATED_TOKENS,
    "prompt": names.ENGINE_PROMPT_TOKENS,
    "reused": names.ENGINE_PROMPT_TOKENS_REUSED,
    "sequences": names.ENGINE_REQUESTS,
    "cancelled": names.ENGINE_CANCELLED,
    "editor_stops": names.ENGINE_EDITOR_STOPS,
    "past_stop": names.ENGINE_TOKENS_PAST_STOP,
}
CACHING = re.compile(r'(key:\s*"prefix_caching"\s*value:\s*\{\s*string_value:\s*")([^"]*)(")')


@dataclass
class System:
    """One server under test: the project's engine, or llama-server (``engine`` False)."""

    label: str
    sender: Sender
    metrics_url: str
    pids: list[int] = field(default_factory=list)
    engine: bool = True

    def counters(self) -> dict[str, float]:
        """So far. llama-server counts a cancelled request's tokens as it drops it."""
        snapshot = read_snapshot(self.metrics_url)
        if self.engine:
            return {k: snapshot.value(v, model=ENGINE_MODEL) for k, v in ENGINE_COUNTERS.items()}
        prefilled, cached = snapshot.value(llama.PREFILLED), snapshot.value(llama.CACHED)
        return {
            "generated": snapshot.value(llama.PREDICTED),
            "prompt": prefilled + cached,
            "reused": cached,
        }

    def busy(self) -> int | None:
        """Requests held; None: unknown."""
        if not self.engine:
            return int(read_snapshot(self.metrics_url).gauge(llama.PROCESSING) or 0)
        state, _ = wait_for_drain(self.metrics_url, 0.0)
        return None if state is None else state.running + state.pending

    def cpu_s(self) -> float:
        """CPU seconds so far; NaN for a server this run did not start."""
        return tree_cpu_seconds(self.pids) if self.pids else float("nan")

    def _poll(self, timeout: float, read: Callable[[], dict | None]) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if (found := read()) is not None:
                    return found
            time.sleep(0.05)
        return None

    def drain(self, timeout: float) -> bool:
        """Wait until the server holds no request; whether it got there."""
        return self._poll(timeout, lambda: None if self.busy() else {}) is not None

    def settled(self, before: dict[str, float], limit_s: float) -> dict[str, float] | None:
        """The counters once the last request was counted (its sequence, or its slot freed)."""

        def read() -> dict | None:
            now = self.counters()
            done = now["sequences"] > before["sequences"] if self.engine else not self.busy()
            return now if done else None

        return self._poll(limit_s, read)


def triton_system(label: str, sender: Sender, metrics_url: str, pids: list[int]) -> System:
    return System(label, sender, metrics_url, pids)


def set_caching(config: str, caching: bool) -> str:
    """The engine's config.pbtxt with its one ``prefix_caching`` parameter set."""
    if (found := len(CACHING.findall(config))) != 1:
        raise ValueError(
            f"the engine config has {found} prefix_caching parameters (expected one)"
            ": the comparison cannot turn the prefix cache on and off"
        )
    return CACHING.sub(lambda m: m[1] + ("true" if caching else "false") + m[3], config)


def cache_repository(source: Path, dest: Path, caching: bool) -> Path:
    """A copy of the model repository with ``prefix_caching`` set, the checkpoint linked."""
    checkpoint = checkpoint_dir(Path(source).resolve())
    if not (checkpoint / "config.json").exists():
        raise SystemExit(f"no model at {checkpoint}: run `make model` first")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("checkpoint", "__pycache__"))
    checkpoint_dir(dest).symlink_to(checkpoint, target_is_directory=True)
    config = dest / ENGINE_MODEL / "config.pbtxt"
    config.write_text(set_caching(config.read_text(), caching))
    return dest


def check_caching(log_file: Path, expected: bool) -> None:
    """The engine logs "prefix cache on|off" as it loads: it must run the setting asked for."""
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    if not (said := re.findall(r"prefix cache (on|off)", text)):  # openvino's log says it
        raise SystemExit(
            f"the engine did not log whether its prefix cache is on ({log_file}): "
            "only the openvino backend has one, to compare on and off"
        )
    if said[-1] != (want := "on" if expected else "off"):
        raise SystemExit(f"the engine says its prefix cache is {said[-1]}, expected {want}")


def open_systems(
    args: argparse.Namespace, endpoints: Endpoints, out: Path, copies: Path, stack: ExitStack
) -> tuple[dict[str, System], dict[str, str]]:
    """The systems, started (or found, for --no-compare) and ready, and what each serves."""
    stops = {"one_line": args.one_line, "t_max_predict_ms": T_MAX_PREDICT_MS}
    plan = [(SINGLE, args.model_repository, endpoints, None)]
    if args.compare:
        halves = [(PROJECT, True)] if args.peer else [(ON, True), (OFF, False)]
        plan = [
            (
                label,
                cache_repository(args.model_repository, copies / label, on),
                Endpoints.local(Ports(*free_ports(3))),
                on,
            )
            for label, on in halves
        ]
    systems, servers = {}, {}
    for label, repository, where, caching in plan:
        log.info(f"--- {label}: starting the project's Triton ---")
        target = OpenAITarget if args.protocol == "openai" else TARGETS["grpc"].server
        server = stack.enter_context(target(where, repository, out / label))
        triton = server.triton if isinstance(server, OpenAITarget) else server
        if caching is not None:
            if not triton.started:
                raise SystemExit(f"a server already answered at {where.host}: not one of ours")
            shutil.copy2(
                repository / ENGINE_MODEL / "config.pbtxt", out / label / "engine_config.pbtxt"
            )
            check_caching(out / label / "tritonserver.log", caching)
        if not server.model_ready(ENGINE_MODEL):
            raise SystemExit(f"`{ENGINE_MODEL}` is not ready at {where.host}")
        pids = [
            p.process.pid
            for p in (
                triton.served.launcher if triton.started else None,
                getattr(server, "api", None),
            )
            if getattr(p, "process", None)
        ]
        address = where.grpc if args.protocol == "grpc" else server.users_url[len("http://") :]
        sender = Sender(args.protocol, address, args.max_tokens, **stops)
        systems[label] = triton_system(label, sender, where.metrics_url, pids)
        servers[label] = (
            f"the project's Triton at {where.host}, engine {server.describe().stage_parameters}"
        )
    if args.peer == "llama":
        gguf = llama.checkpoint_gguf(checkpoint_dir(args.model_repository))
        # one slot per typist: at 64 it answered none in time (docs/editor-load.md)
        slots = args.peer_slots or args.typists
        ctx = slots * (args.prompt_tokens + args.max_tokens + MARGIN_TOKENS)
        server = llama.LlamaServer(
            gguf,
            free_ports(1)[0],
            out / LLAMA / "llama-server.log",
            slots,
            ctx_size=ctx,
            threads=args.peer_threads,
        )
        log.info(f"--- {LLAMA}: {gguf.name}, {slots} slots, context {ctx} ---")
        stack.callback(server.stop)
        server.start().wait_ready()
        sender = Sender("llama", server.url.removeprefix("http://"), args.max_tokens, **stops)
        systems[LLAMA] = System(LLAMA, sender, f"{server.url}/metrics", [server.process.pid], False)
        servers[LLAMA] = f"llama-server {' '.join(server.command()[1:])}"
    return systems, servers
