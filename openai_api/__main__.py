"""``python -m openai_api`` (``make api``): serve the OpenAI-compatible API with uvicorn.

With ``--start-triton``, a Triton server is started first on the model repository when none
answers at ``--triton`` on this machine (as the load test does), and stopped on exit.

    python -m openai_api --port 8080 --triton localhost:8001 --start-triton
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from client import CodegenClient, CodegenError, ServerUnavailableError
from openai_api.settings import API_KEY_VARIABLE, DEFAULT_CHECKPOINT, Settings
from serving.paths import MODEL_REPOSITORY

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
log = logging.getLogger("openai_api")


def triton_ready(url: str) -> bool | None:
    """True if Triton serves at ``url``, False if it answers but is not ready, None if
    nothing answers."""
    try:
        with CodegenClient(url, "grpc", timeout=5) as client:
            return client.is_ready()
    except ServerUnavailableError:
        return None
    except CodegenError:
        return False


def ensure_triton(args: argparse.Namespace) -> object | None:
    """Start Triton on the model repository when nothing answers at ``args.triton`` (a local
    address); return it so that it is stopped on exit. Waits while one is starting."""
    state = triton_ready(args.triton)
    if state:
        log.info("using the Triton server at %s", args.triton)
        return None
    parts = urlsplit("//" + args.triton.split("://")[-1])
    if state is False or parts.hostname not in LOCAL_HOSTS:
        deadline = time.monotonic() + args.triton_timeout
        log.info("waiting for the Triton server at %s to be ready ...", args.triton)
        while not triton_ready(args.triton):
            if time.monotonic() > deadline:
                raise SystemExit(f"no ready Triton server at {args.triton}")
            time.sleep(1)
        return None
    from serving.triton import Ports, TritonServer

    checkpoint = args.model_repository / "gptj" / "1" / "checkpoint" / "config.json"
    if not checkpoint.exists():
        raise SystemExit(f"no model at {checkpoint.parent}: run `make model` first")
    ports = Ports(args.triton_http_port, parts.port or 8001, args.triton_metrics_port)
    server = TritonServer(args.model_repository, ports)
    log.info("no Triton answers at %s: starting one on %s ...", args.triton, args.model_repository)
    server.start()
    try:
        server.wait_ready(args.triton_timeout)
    except BaseException:
        server.stop()
        raise
    log.info("Triton is ready (HTTP %d, gRPC %d)", ports.http, ports.grpc)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--triton", help="Triton's gRPC host:port ($TRITON_URL, localhost:8001)")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help="the served checkpoint's folder: its tokenizer counts prompt tokens so that "
        "non-streamed requests use the unary ensemble (checked against the server first)",
    )
    parser.add_argument("--max-concurrent", type=int, default=Settings.max_concurrent)
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=Settings.context_tokens,
        help="prompt tokens a request with input_extra may reach, max_tokens included, before "
        "its last chunks are dropped (within the model's context; reported in usage)",
    )
    parser.add_argument("--start-triton", action="store_true", help="start Triton if none answers")
    parser.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--triton-http-port", type=int, default=8000)
    parser.add_argument("--triton-metrics-port", type=int, default=8002)
    parser.add_argument("--triton-timeout", type=float, default=600.0)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")

    settings = Settings.from_environment(
        triton_url=args.triton,
        checkpoint=args.checkpoint,
        max_concurrent=args.max_concurrent,
        context_tokens=args.context_tokens,
    )
    args.triton = settings.triton_url
    server = ensure_triton(args) if args.start_triton else None
    faults: list = []
    stopping = threading.Event()
    if server is not None:
        watch_triton(server, faults, stopping)
    try:
        import uvicorn

        from openai_api.app import create_app

        app = create_app(settings)
        key = "on" if settings.api_key else f"off (set {API_KEY_VARIABLE} to require one)"
        print(
            f"\nOpenAI-compatible API on http://{args.host}:{args.port} (Ctrl-C stops it)\n"
            f"  playground   http://{args.host}:{args.port}/\n"
            f"  completions  POST http://{args.host}:{args.port}/v1/completions\n"
            f"  chat         POST http://{args.host}:{args.port}/v1/chat/completions\n"
            f"  Triton       grpc://{settings.triton_url}   API key: {key}\n",
            flush=True,
        )
        # uvicorn handles SIGTERM itself, then raises it again once it has shut down: with the
        # default handler the process would die there, before the Triton started here is
        # stopped; with this one the raise is a no-op and the stop below runs
        signal.signal(signal.SIGTERM, lambda *_: None)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        stopping.set()
        if server is not None:
            log.info("stopping the Triton server started here")
            server.stop()
    if faults:
        log.error(
            "exiting with code %d so that a supervisor restarts the API and Triton",
            faults[0].exit_code,
        )
        return faults[0].exit_code
    return 0


def watch_triton(server, faults: list, stopping: threading.Event) -> threading.Thread:
    """Watch the Triton started here (serving/watchdog.py): once it died, lost a stub or
    hung, kill it, say so, and stop the API (SIGTERM to this process, which uvicorn handles)
    so that ``main`` exits non-zero and a supervisor restarts both."""
    from serving.watchdog import Watchdog, kill_server_tree, model_stubs

    def watch() -> None:
        dog = Watchdog(server.process.pid, server.live_url, model_stubs(server.process.pid))
        while (fault := dog.check()) is None:
            if stopping.wait(0.5):
                return
        if stopping.is_set():
            return
        faults.append(fault)
        log.error("%s", fault.message)
        kill_server_tree(server.process.pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="triton-watchdog", daemon=True)
    thread.start()
    return thread


if __name__ == "__main__":
    sys.exit(main())
