"""The engine inside Triton: started from a model's config, fed by one submit loop, metered.

Only the ``engine`` model runs it: the unary model stage (``gptj``) and the streaming model
(``ensemble_stream``) call that model (backend/engine_calls.py), so every request shares one
copy of the weights and one running batch. A unary request gets one final response in the
model stage's layout; a streamed one (input ``stream``) a response per token.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from backend.cancel import CancelListener, CancelRegistry
from backend.io import (
    FINAL,
    error_response,
    model_parameters,
    read_inputs,
    requested_outputs,
    response,
)
from contract import metrics as names
from contract.options import DEFAULT_MAX_BEAM_WIDTH, InvalidRequestError
from contract.tensors import ENGINE_ERROR, ENGINE_INPUTS
from engine.engine import Engine, GenerationRequest, GenerationResult, Listener
from engine.gptj import GPTJ
from engine.tensors import requests_from_tensors, tensors_from_results
from engine.threads import in_passing_thread


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
    cancels: CancelRegistry
    listener: CancelListener

    def stop(self) -> None:
        self.listener.close()
        self.engine.stop()


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
    quantization = None if quantize == "none" else quantize
    # loaded in a thread that ends, so the engine's thread is the stub's only OpenMP pool
    model = in_passing_thread(
        lambda: GPTJ.from_checkpoint(checkpoint, dtype=dtype, device=device, quantize=quantization)
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
    cancels = CancelRegistry()
    listener = CancelListener(args["model_name"], cancels.cancel)
    engine.start()
    threading.Thread(target=_exit_if_engine_dies, args=(engine,), daemon=True).start()
    cfg = model.config
    pb_utils.Logger.log_info(
        f"{args['model_name']}: serving {checkpoint.resolve()} ({cfg.n_layer} layers, "
        f"{cfg.n_embd} wide, vocab {cfg.vocab_size}, {dtype}, quantize {quantize}, on {device}, "
        f"KV-cache budget {engine.max_cache_tokens} positions)"
    )
    return Stage(engine, checkpoint, params, cancels, listener)


def _exit_if_engine_dies(engine: Engine, every: float = 1.0) -> None:
    """An engine whose worker thread ended can answer nothing: end the stub with it, so that
    the launcher's watchdog stops the server and a supervisor starts a healthy one, rather than
    leave a server that says ready and hangs every request."""
    while True:
        time.sleep(every)
        if not engine.alive and not engine.stopping:
            pb_utils.Logger.log_error("the engine's worker thread ended: exiting this stub")
            os._exit(70)  # EX_SOFTWARE


def _request_key(request) -> str:
    """The id the caller gave its BLS request: what a cancellation names (empty: none)."""
    try:
        return request.request_id() or ""
    except Exception:  # an id Triton cannot hand over as text: not one of ours
        return ""


def submit_requests(stage: Stage, requests) -> None:
    """Validate each Triton request and hand its rows to the engine, which answers later.

    A bad request is answered with its own error and the others go on. The loop waits for
    engine room before submitting, so that a request the engine cannot start yet waits in
    Triton's queue, where ``nv_inference_queue_duration_us`` and the pending count show the
    overload (and an autoscaler can act on it), rather than in a queue no metric sees.
    """
    engine = stage.engine
    for request in requests:
        sender = request.get_response_sender()
        try:
            arrays = read_inputs(request, ENGINE_INPUTS)
            stream = "stream" in arrays and bool(np.asarray(arrays.pop("stream")).any())
            rows, log_probs = requests_from_tensors(arrays)
            if stream and len(rows) != 1:
                raise InvalidRequestError(
                    f"streaming takes one prompt per request, got {len(rows)}"
                )
            if stream and rows[0].beam.width > 1:
                raise InvalidRequestError(
                    f"beam_width={rows[0].beam.width} cannot stream: beams are ranked only "
                    "once they finish; send it to the unary `ensemble` instead"
                )
            for row in rows:
                engine.validate(row)
        except InvalidRequestError as exc:
            sender.send(error_response(str(exc)), flags=FINAL)
            continue
        except Exception as exc:  # a bug must fail this request only, not the whole batch
            pb_utils.Logger.log_error(f"could not read a request: {exc!r}")
            sender.send(error_response(f"internal error reading the request: {exc}"), FINAL)
            continue
        key = _request_key(request)
        done = functools.partial(stage.cancels.forget, key)
        requested = requested_outputs(request)
        if stream:
            listeners: Sequence[Listener] = [
                _TokenStream(sender, rows[0], log_probs, done, requested)
            ]
        else:
            width = rows[0].beam.width
            listeners = _Reply(sender, len(rows), log_probs, width, done, requested).listeners()
        engine.wait_for_room(sum(row.rows for row in rows))
        for row, listener in zip(rows, listeners, strict=True):
            listener.handle = engine.submit(row, listener)
            stage.cancels.track(key, listener.handle)


CANCELLED = "cancelled: the client went away or its timeout passed"
CHECK_EVERY = 8  # tokens between two questions to Triton whether a client went away


class _Reply:
    """Collects the rows of one unary request and sends its single response."""

    def __init__(
        self,
        sender,
        rows: int,
        return_log_probs: bool,
        beam_width: int,
        done: Callable[[], None],
        requested: frozenset[str] | None = None,
    ) -> None:
        self.sender = sender
        self.requested = requested
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.beam_width = beam_width
        self.done = done
        self.lock = threading.Lock()

    def listeners(self) -> list[_Row]:
        return [_Row(self, index) for index in range(len(self.results))]

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        self.done()
        errors = [r.error for r in self.results if r.error]
        if any(r.finish_reason == "cancelled" for r in self.results):
            errors.append(CANCELLED)
        if errors:
            self.sender.send(error_response(errors[0]), flags=FINAL)
        else:
            outputs = tensors_from_results(self.results, self.return_log_probs, self.beam_width)
            self.sender.send(response(outputs, self.requested), flags=FINAL)


class _Row:
    """One prompt of a unary request: only its end matters, and whether its client is still
    there (a direct client of the engine model; a BLS caller cancels through the channel),
    asked every few tokens (a question to the server, so not every token)."""

    def __init__(self, reply: _Reply, index: int) -> None:
        self.reply, self.index, self.handle = reply, index, None
        self.tokens = 0

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.tokens += 1
        if self.tokens % CHECK_EVERY == 0 and self.reply.sender.is_cancelled():
            self.handle.cancel()  # the engine drops the row at its next step

    def on_finish(self, result: GenerationResult) -> None:
        self.reply.finish(self.index, result)


class _TokenStream:
    """One streamed prompt: a response per generated token (that token, the length so far),
    then a final response (an error, or none)."""

    def __init__(
        self,
        sender,
        row: GenerationRequest,
        log_probs: bool,
        done: Callable[[], None],
        requested: frozenset[str] | None = None,
    ):
        self.sender, self.done, self.handle = sender, done, None
        self.requested = requested
        self.length = len(row.prompt_ids)
        self.want_log_probs = log_probs
        self.cumulative = 0.0

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.length += 1
        if not self.want_log_probs:
            log_prob = 0.0
        self.cumulative += log_prob
        if self.length % CHECK_EVERY == 0 and self.sender.is_cancelled():
            self.handle.cancel()
            return
        outputs = {
            "output_ids": np.array([[[token_id]]], dtype=np.uint32),
            "sequence_length": np.array([[self.length]], dtype=np.uint32),
            "cum_log_probs": np.array([[self.cumulative]], dtype=np.float32),
            "output_log_probs": np.array([[[log_prob]]], dtype=np.float32),
        }
        self.sender.send(response(outputs, self.requested))

    def on_finish(self, result: GenerationResult) -> None:
        self.done()
        message = result.error or (CANCELLED if result.finish_reason == "cancelled" else None)
        if message is None:
            self.sender.send(flags=FINAL)
        elif self.requested is None or ENGINE_ERROR.name in self.requested:
            error = np.array([[message.encode()]], dtype=np.object_)
            self.sender.send(response({ENGINE_ERROR.name: error}, self.requested), flags=FINAL)
        else:  # a direct gRPC client that did not ask for the error output
            self.sender.send(error_response(message), flags=FINAL)
