"""The engine inside Triton: started from a model's config, fed by one submit loop, metered.

The unary model stage (``gptj``) and the streaming model (``ensemble_stream``) both use it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import triton_python_backend_utils as pb_utils

from backend.io import FINAL, error_response, model_parameters
from contract import metrics as names
from contract.options import DEFAULT_MAX_BEAM_WIDTH, InvalidRequestError
from engine.engine import Engine, GenerationRequest, GenerationResult, Listener
from engine.gptj import GPTJ


class EngineMetrics:
    """The engine's counters on Triton's metrics endpoint (contract/metrics.py says why)."""

    def __init__(self, model_name: str) -> None:
        labels = {"model": model_name}
        kinds = [
            (names.ENGINE_METRIC_HELP, pb_utils.MetricFamily.COUNTER),
            (names.ENGINE_GAUGE_HELP, pb_utils.MetricFamily.GAUGE),
        ]
        self.families = []  # a family must outlive its metrics
        self.m = {}
        for helps, kind in kinds:
            for name, description in helps.items():
                family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
                self.families.append(family)
                self.m[name] = family.Metric(labels=labels)
        self.engine: Engine | None = None

    def on_step(self, rows: int, new_tokens: int, prompt_tokens: int, seconds: float) -> None:
        self.m[names.ENGINE_STEPS].increment(1)
        self.m[names.ENGINE_STEP_ROWS].increment(rows)
        self.m[names.ENGINE_COMPUTE_DURATION_US].increment(seconds * 1e6)
        self.m[names.ENGINE_PROMPT_TOKENS].increment(prompt_tokens)
        self.m[names.ENGINE_LAST_STEP].set(time.time())
        self._gauges()

    def on_idle(self) -> None:
        """The engine released its cache."""
        self._gauges()

    def _gauges(self) -> None:
        if self.engine is not None:
            self.m[names.ENGINE_RUNNING].set(self.engine.running)
            self.m[names.ENGINE_KV_CACHE_BYTES].set(self.engine.cache_bytes)

    def on_finish(self, result: GenerationResult) -> None:
        self._gauges()
        self.m[names.ENGINE_REQUESTS].increment(1)
        if result.finish_reason == "cancelled":
            self.m[names.ENGINE_CANCELLED].increment(1)
        self.m[names.ENGINE_GENERATED_TOKENS].increment(len(result.output_ids))
        self.m[names.ENGINE_REQUEST_DURATION_US].increment(result.total_seconds * 1e6)
        self.m[names.ENGINE_QUEUE_DURATION_US].increment(result.queue_seconds * 1e6)


def resolve_device(name: str) -> str:
    """ "auto" is CUDA when torch sees a GPU, else the CPU; CODEGEN_DEVICE overrides config."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no CUDA GPU")
    return name


@dataclass
class Stage:
    engine: Engine
    checkpoint: Path
    params: dict[str, str]


def start_engine(args: dict) -> Stage:
    """Load the checkpoint named in the model config and start an engine on it."""
    params = model_parameters(args)
    threads = int(params.get("num_threads", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    checkpoint = Path(args["model_repository"]) / params["checkpoint_path"]
    dtype = getattr(torch, params.get("dtype", "float32"))
    device = resolve_device(os.environ.get("CODEGEN_DEVICE") or params.get("device", "auto"))
    quantize = params.get("quantize", "none")
    model = GPTJ.from_checkpoint(
        checkpoint, dtype=dtype, device=device, quantize=None if quantize == "none" else quantize
    )
    metrics = EngineMetrics(args["model_name"])
    engine = Engine(
        model,
        max_batch_size=int(params.get("engine_max_batch_size", "64")),
        max_prefill_tokens=int(params.get("engine_max_prefill_tokens", "4096")),
        max_cache_tokens=int(params.get("kv_cache_tokens", "0")) or None,
        max_beam_width=int(params.get("max_beam_width", str(DEFAULT_MAX_BEAM_WIDTH))),
        observer=metrics,
    )
    metrics.engine = engine
    engine.start()
    threading.Thread(target=_exit_if_engine_dies, args=(engine,), daemon=True).start()
    cfg = model.config
    pb_utils.Logger.log_info(
        f"{args['model_name']}: serving {checkpoint.resolve()} ({cfg.n_layer} layers, "
        f"{cfg.n_embd} wide, vocab {cfg.vocab_size}, {dtype}, quantize {quantize}, on {device}, "
        f"KV-cache budget {engine.max_cache_tokens} positions)"
    )
    return Stage(engine, checkpoint, params)


def _exit_if_engine_dies(engine: Engine, every: float = 1.0) -> None:
    """An engine whose worker thread ended can answer nothing: end the stub with it, so that
    the launcher's watchdog stops the server and a supervisor starts a healthy one, rather than
    leave a server that says ready and hangs every request."""
    while True:
        time.sleep(every)
        if not engine.alive and not engine.stopping:
            pb_utils.Logger.log_error("the engine's worker thread ended: exiting this stub")
            os._exit(70)  # EX_SOFTWARE


# request -> (its rows, whether log probs were asked for)
Parse = Callable[[object], tuple[list[GenerationRequest], bool]]
# (response sender, rows, log probs?) -> one listener per row
Listeners = Callable[[object, list[GenerationRequest], bool], Sequence[Listener]]


def submit_requests(engine: Engine, requests, parse: Parse, listeners: Listeners) -> None:
    """Validate each Triton request and hand its rows to the engine, which answers later.

    A bad request is answered with its own error and the others go on. The loop waits for
    engine room before submitting, so that a request the engine cannot start yet waits in
    Triton's queue, where ``nv_inference_queue_duration_us`` and the pending count show the
    overload (and an autoscaler can act on it), rather than in a queue no metric sees.
    """
    for request in requests:
        sender = request.get_response_sender()
        try:
            rows, log_probs = parse(request)
            for row in rows:
                engine.validate(row)
        except InvalidRequestError as exc:
            sender.send(error_response(str(exc)), flags=FINAL)
            continue
        except Exception as exc:  # a bug must fail this request only, not the whole batch
            pb_utils.Logger.log_error(f"could not read a request: {exc!r}")
            sender.send(error_response(f"internal error reading the request: {exc}"), FINAL)
            continue
        engine.wait_for_room(sum(row.rows for row in rows))
        for row, listener in zip(rows, listeners(sender, rows, log_probs), strict=True):
            listener.handle = engine.submit(row, listener)
