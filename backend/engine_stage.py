"""The engine inside Triton: started from a model's config, fed by one submit loop, metered.

Only the ``engine`` model runs it: ``gptj`` and ``ensemble_stream`` call that model
(backend/engine_calls.py), so every request shares one copy of the weights and one running
batch. A gptj call arrives as the model stage's typed tensors, which gptj checked, and gets one
final response in that stage's layout; a stream arrives as text, is tokenized here, and gets
responses with its new text, sent by backend/engine_answers.py's thread.
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

from backend.bls_ready import ReadyTeller, TellingSender, owner_pid
from backend.cancel import CancelListener, CancelRegistry
from backend.engine_answers import KEEP_UP_S, Deliveries, Reply, TextStop, TextStream
from backend.engine_hooks import EngineHooks, load_hooks
from backend.io import (
    FINAL,
    error_response,
    model_parameters,
    read_inputs,
    requested_outputs,
    tokenize,
)
from backend.stop_request import stop_named
from contract import metrics as names
from contract.options import DEFAULT_MAX_BEAM_WIDTH, EDITOR_STOP_REASONS, InvalidRequestError
from contract.tensors import ENGINE_INPUTS, ENSEMBLE_TO_PREPROCESSING, STOP_INPUT
from contract.words import decode_words
from engine.fallback import REASONS, with_fallback
from engine.interface import GenerationBackend, GenerationResult, Listener
from engine.models import load_model
from engine.openvino_model import ModelShape, export_weights, require_export
from engine.tensors import parse_request, requests_from_tensors
from engine.threads import in_passing_thread
from engine.torch_engine import TorchEngine
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.token_texts import token_extensions
from preprocessing.tokenize import Preprocessor

# The engine's figures reach Triton at most this often, and when the engine goes idle: in
# python_backend r24.10 each metric update is a round trip to the server. Seven of them after
# every forward pass took a third as long as the pass itself on the default model, and the ten
# sent at every request's end were, at 16 clients, more of the answering thread's time than
# the answers (py-spy on the engine stub under unary traffic). Every 50 ms, the updates still
# held 16 unary clients at output 128 to 224-255 tok/s where every 0.25-1 s gave 323-345 (the
# bare backend: 365; docs/performance.md); a scrape every few seconds sees no difference.
METRICS_EVERY_S = 0.5


class EngineMetrics:
    """The engine's counters on Triton's metrics endpoint (contract/metrics.py says why).
    Counters are summed here, per step and per finished request, and sent every
    ``METRICS_EVERY_S`` and when the engine goes idle, with the gauges as they are then. The
    engine's thread only adds up and reads the gauges; the updates (each a round trip to the
    server) are made by ``deliveries``' one thread, after the responses handed to it before
    (two threads updating one metric at once crash r24.10: see
    ``backend.engine_calls.CallerMetrics``)."""

    def __init__(self, model_name: str, deliveries: Deliveries) -> None:
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
        name, kind = names.ENGINE_FALLBACK_REQUESTS, pb_utils.MetricFamily.COUNTER
        family = pb_utils.MetricFamily(name=name, description=names.ENGINE_FALLBACK_HELP, kind=kind)
        self.families.append(family)  # counted by reason (engine/fallback.py): m[name, reason]
        self.m |= {(name, r): family.Metric(labels={**labels, "reason": r}) for r in REASONS}
        self.engine: GenerationBackend | None = None
        self.after_step: Callable[[], None] = lambda: None
        self.deliveries = deliveries
        self._lock = threading.Lock()
        self._unsent: dict[str | tuple[str, str], float] = {}
        self._last_step = 0.0  # Unix time of the last forward pass, once there was one
        self._sent_at = 0.0

    def _add(self, counters: dict) -> bool:
        """Add to the unsent counters; whether it is time to send them."""
        with self._lock:
            for name, value in counters.items():
                self._unsent[name] = self._unsent.get(name, 0.0) + value
            return time.monotonic() - self._sent_at >= METRICS_EVERY_S

    def on_step(self, rows: int, new_tokens: int, prompt_tokens: int, seconds: float) -> None:
        self._last_step = time.time()
        step = {
            names.ENGINE_STEPS: 1,
            names.ENGINE_STEP_ROWS: rows,
            names.ENGINE_COMPUTE_DURATION_US: seconds * 1e6,
            names.ENGINE_PROMPT_TOKENS: prompt_tokens,
        }
        if self._add(step):
            self.deliveries.call(self._updates())
        self.after_step()  # the engine's thread: hooks that pause the engine wait here

    def on_fallback(self, reason: str) -> None:
        """(the submitting thread) A request went to the fallback engine, for ``reason``."""
        self._add({(names.ENGINE_FALLBACK_REQUESTS, reason): 1})

    def on_idle(self) -> None:
        """The engine has nothing to run (or released its cache): send what is pending."""
        self.deliveries.call(self._updates())

    def on_finish(self, result: GenerationResult) -> None:
        counters = {
            names.ENGINE_REQUESTS: 1,
            names.ENGINE_CANCELLED: int(result.finish_reason == "cancelled"),
            names.ENGINE_GENERATED_TOKENS: len(result.output_ids),
            names.ENGINE_PROMPT_TOKENS_REUSED: result.reused_prompt_tokens,
            names.ENGINE_REQUEST_DURATION_US: result.total_seconds * 1e6,
            names.ENGINE_QUEUE_DURATION_US: result.queue_seconds * 1e6,
            names.ENGINE_EDITOR_STOPS: int(result.finish_reason in EDITOR_STOP_REASONS),
            names.ENGINE_TOKENS_PAST_STOP: result.tokens_past_stop,
        }
        if self._add(counters):
            self.deliveries.call(self._updates())

    def _updates(self) -> Callable[[], None]:
        """(the engine's thread) The metric updates due now, as one call for deliveries:
        the counters summed so far and the gauges as they are."""
        with self._lock:
            counters = {name: value for name, value in self._unsent.items() if value}
            self._unsent = {}
            self._sent_at = time.monotonic()
        gauges = {}
        if self.engine is not None:
            gauges = {
                names.ENGINE_RUNNING: self.engine.running,
                names.ENGINE_KV_CACHE_BYTES: self.engine.cache_bytes,
            }
        if self._last_step:
            gauges[names.ENGINE_LAST_STEP] = self._last_step

        def send() -> None:
            for name, value in counters.items():
                self.m[name].increment(value)
            for name, value in gauges.items():
                self.m[name].set(value)

        return send


def resolve_device(name: str) -> str:
    """ "auto" is CUDA when torch sees a GPU, else the CPU; CODEGEN_DEVICE overrides config."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no CUDA GPU")
    return name


@dataclass
class Stage:
    engine: GenerationBackend
    checkpoint: Path
    params: dict[str, str]
    cancels: CancelRegistry
    listener: CancelListener
    hooks: EngineHooks
    teller: ReadyTeller
    deliveries: Deliveries
    preprocessor: Preprocessor  # a stream's text in
    postprocessor: Postprocessor  # and out
    streams: NamedStreams

    def stop(self) -> None:
        self.listener.close()
        self.hooks.close()  # a paused engine goes on, so that it can stop
        self.engine.stop()
        self.deliveries.stop()  # what the engine answered last is still sent
        self.teller.close()


BACKENDS = ("auto", "openvino", "torch")


def resolve_backend(name: str, device: str) -> str:
    """ "auto" is OpenVINO on the CPU and the torch engine on a CUDA GPU; CODEGEN_BACKEND
    overrides config. OpenVINO runs on the CPU only here."""
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is not one of {BACKENDS} (engine/config.pbtxt)")
    if name == "auto":
        return "torch" if device.startswith("cuda") else "openvino"
    if name == "openvino" and device != "cpu":
        raise RuntimeError(f"backend openvino runs on the CPU, but device {device!r} was asked for")
    return name


def start_engine(args: dict) -> Stage:
    """Load the checkpoint named in the model config and start the configured backend on it."""
    params = model_parameters(args)
    threads = int(params.get("num_threads", "0"))
    checkpoint = Path(args["model_repository"]) / params["checkpoint_path"]
    device = resolve_device(os.environ.get("CODEGEN_DEVICE") or params.get("device", "auto"))
    kind = resolve_backend(
        os.environ.get("CODEGEN_BACKEND") or params.get("backend", "auto"), device
    )
    deliveries = Deliveries(int(params.get("stream_run_ahead", "1")))
    metrics = EngineMetrics(args["model_name"], deliveries)
    limits = {
        "max_batch_size": int(params.get("engine_max_batch_size", "64")),
        "max_prefill_tokens": int(params.get("engine_max_prefill_tokens", "4096")),
        "max_cache_tokens": int(params.get("kv_cache_tokens", "0")) or None,
        "max_beam_width": int(params.get("max_beam_width", str(DEFAULT_MAX_BEAM_WIDTH))),
        "observer": metrics,
    }
    extensions = token_extensions(checkpoint)
    limits["token_texts"] = extensions.texts  # what the editor stop rules read
    limits["extensions"] = extensions  # what token healing reads
    if kind == "openvino":
        engine, described = _openvino(checkpoint, params, threads, limits)
    else:
        engine, described = _torch(checkpoint, params, threads, device, limits)
    metrics.engine = engine
    cancels = CancelRegistry()
    hooks = load_hooks(params.get("hooks_file", ""), args["model_name"])

    streams = NamedStreams()

    def after_step() -> None:
        deliveries.keep_up()
        streams.ask_prefilling(deliveries)
        hooks.after_step(metrics.on_idle)  # a paused engine's figures so far reach the server

    metrics.after_step = after_step
    listener = CancelListener(args["model_name"], cancels.cancel)
    engine.start()
    threading.Thread(target=_exit_if_engine_dies, args=(engine,), daemon=True).start()
    pb_utils.Logger.log_info(
        f"{args['model_name']}: serving {checkpoint.resolve()} ({kind} backend, "
        f"{described}, KV-cache budget {engine.max_cache_tokens} positions)"
    )
    return Stage(
        engine,
        checkpoint,
        params,
        cancels,
        listener,
        hooks,
        ReadyTeller(),
        deliveries,
        Preprocessor(checkpoint, params.get("fim_order", "auto")),
        Postprocessor(checkpoint),
        streams,
    )


def _torch(
    checkpoint: Path, params: dict[str, str], threads: int, device: str, limits: dict
) -> tuple[TorchEngine, str]:
    if threads > 0:
        torch.set_num_threads(threads)
    dtype = getattr(torch, params.get("dtype", "float32"))
    quantize = params.get("quantize", "none")
    quantization = None if quantize == "none" else quantize
    # loaded in a thread that ends, so the engine's thread is the stub's only OpenMP pool
    model = in_passing_thread(
        lambda: load_model(checkpoint, dtype=dtype, device=device, quantize=quantization)
    )
    cfg = model.config
    described = (
        f"{cfg.n_layer} layers, {cfg.n_embd} wide, vocab {cfg.vocab_size}, {dtype}, "
        f"quantize {quantize}, on {device}"
    )
    return TorchEngine(model, **limits), described


def _openvino(
    checkpoint: Path, params: dict[str, str], threads: int, limits: dict
) -> tuple[GenerationBackend, str]:
    from engine.openvino_backend import OpenVINOBackend  # imports openvino_genai

    if params.get("quantize", "none") != "none":
        raise ValueError("quantize applies to the torch backend only; set it to none")
    shape = ModelShape.read(checkpoint)
    dtype = params.get("dtype", "float32")
    caching = params.get("prefix_caching", "true").lower() in ("1", "true", "yes", "on")
    engine = OpenVINOBackend(
        require_export(checkpoint),
        shape,
        dtype=dtype,
        prefix_caching=caching,
        threads=threads,
        **limits,
    )
    setting = params.get("fallback", "none")  # what the pipeline cannot honour: none or torch
    engine, fallback = with_fallback(setting, engine, checkpoint, threads, **limits)
    return engine, (
        f"{shape.n_layer} layers, {shape.n_embd} wide, vocab {shape.vocab_size}, {dtype}, "
        f"{export_weights(checkpoint)} weights, prefix cache {'on' if caching else 'off'}, "
        f"on CPU, {fallback}"
    )


def _exit_if_engine_dies(engine: GenerationBackend, every: float = 1.0) -> None:
    """An engine whose worker thread ended can answer nothing: end the stub with it, so that
    the launcher's watchdog stops the server and a supervisor starts a healthy one, rather than
    leave a server that says ready and hangs every request."""
    while True:
        time.sleep(every)
        if not engine.alive and not engine.stopping:
            pb_utils.Logger.log_error("the engine's worker thread ended: exiting this stub")
            os._exit(70)  # EX_SOFTWARE


class NamedStreams:
    """The streams generating under each client request id: what a stop request names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, set[TextStream]] = {}

    def add(self, client_id: str, stream: TextStream) -> None:
        with self._lock:
            self._open.setdefault(client_id, set()).add(stream)

    def remove(self, client_id: str, stream: TextStream) -> None:
        with self._lock:
            named = self._open.get(client_id, set())
            named.discard(stream)
            if not named:
                self._open.pop(client_id, None)

    def stop(self, client_id: str) -> int:
        """Stop the streams named ``client_id``; returns how many there were."""
        with self._lock:
            named = list(self._open.get(client_id, ()))
        for stream in named:
            stream.stop()
        return len(named)

    def prefilling(self) -> list[TextStream]:
        """(after a pass) The streams with no token yet that were submitted before the pass
        before: their prompts take several passes, or wait for room. A prompt that fits in one
        pass has its first token after it, so the streams of short prompts, nearly all under
        load, cost no round trip here."""
        waiting = []
        with self._lock:
            for named in self._open.values():
                for stream in named:
                    if stream.handle is None or stream.generating:
                        continue
                    if stream.passes_waited:
                        waiting.append(stream)
                    stream.passes_waited += 1
        return waiting

    def ask_prefilling(self, deliveries: Deliveries) -> None:
        """(the engine's thread, after a step) Have deliveries ask whether the clients of the
        streams still in their prefill went away (:meth:`TextStream.ask_if_left`), and wait
        for the answers, so that a stream whose client left is dropped before the next step
        rather than prefilled another chunk (a round trip to the server per such stream)."""
        if not (waiting := self.prefilling()):
            return
        asked = threading.Event()

        def ask() -> None:
            try:
                for stream in waiting:
                    stream.ask_if_left()
            finally:
                asked.set()

        deliveries.call(ask)
        if not asked.wait(KEEP_UP_S):
            pb_utils.Logger.log_warn("no answer from deliveries in time: stepping on")


def _request_key(request) -> str:
    """The id the request came with: a BLS caller's key (what a cancellation names), or the
    client's own id (what a stop request names); empty: none."""
    try:
        return request.request_id() or ""
    except Exception:  # an id Triton cannot hand over as text
        return ""


def _answer_stop(stage: Stage, sender, client_id: str) -> None:
    """A stop request (``stop`` true): stop the streams generating under its request id (their
    clients get an error saying so) and answer it with the final flag alone."""
    if stop_named(stage.streams.stop, sender, client_id):
        sender.send(flags=FINAL)


def _read(stage: Stage, request, key: str, sender):
    """The request's rows and the listeners to answer them: a gptj call's (the model stage's
    tensors, one final response) or a stream's (its text tokenized here, a response per
    piece)."""
    arrays = read_inputs(request, ENGINE_INPUTS)
    requested = requested_outputs(request)
    if "input_ids" in arrays:
        if texts := sorted(ENSEMBLE_TO_PREPROCESSING.values() & arrays.keys()):
            raise InvalidRequestError(
                f"input_ids (token ids) and {', '.join(texts)} (text) were both "
                "sent: send the ensemble's inputs or the model stage's, not both"
            )
        rows, _ = requests_from_tensors(arrays)
        width, log_probs = rows[0].beam.width, rows[0].return_log_probs
        done = functools.partial(stage.cancels.forget, key)
        reply = Reply(
            sender,
            len(rows),
            log_probs,
            width,
            done,
            stage.deliveries,
            requested,
            watch_client=owner_pid(key) is None,
        )
        return rows, reply.listeners([TextStop.of(stage.postprocessor, row) for row in rows])
    rows, _ = parse_request(tokenize(stage.preprocessor, arrays), stream=True)
    decoder = IncrementalDecoder(stage.postprocessor, rows[0].prompt_ids, rows[0].held_back)

    def done() -> None:
        stage.streams.remove(key, stream)

    words = np.asarray(arrays["INPUT_3"]).reshape(-1)[0]  # checked by the tokenizing above
    words = tuple(decode_words(words.decode() if isinstance(words, bytes) else str(words)))
    stream = TextStream(sender, rows[0], decoder, done, stage.deliveries, requested, key, words)
    stage.streams.add(key, stream)
    return rows, [stream]


def submit_requests(stage: Stage, requests) -> None:
    """Hand each Triton request's rows to the engine, which answers later, once the backend
    accepted every one of them.

    A bad request is answered with its own error and the others go on. The loop waits for
    engine room before submitting, so that a request the engine cannot start yet waits in
    Triton's queue, where ``nv_inference_queue_duration_us`` and the pending count show the
    overload (and an autoscaler can act on it), rather than in a queue no metric sees.
    """
    engine = stage.engine
    for request in requests:
        key = _request_key(request)
        sender = request.get_response_sender()
        if owner_pid(key) is not None:  # a BLS caller: it reads each response once told
            sender = TellingSender(sender, key, stage.teller)
        stop = pb_utils.get_input_tensor_by_name(request, STOP_INPUT.name)
        if stop is not None and bool(stop.as_numpy().any()):
            _answer_stop(stage, sender, key)
            continue
        listeners: Sequence[Listener] = []
        try:
            rows, listeners = _read(stage, request, key, sender)
            # the backend checks each row once (the model's limits, its KV-cache budget, what
            # it cannot honour) and says where it runs
            targets = [engine.route(row) for row in rows]
        except Exception as exc:
            for listener in listeners:  # never submitted: nothing will finish them
                if isinstance(listener, TextStream):
                    listener.done()
            if isinstance(exc, InvalidRequestError):
                sender.send(error_response(str(exc)), flags=FINAL)
            else:  # a bug must fail this request only, not the whole batch
                pb_utils.Logger.log_error(f"could not read a request: {exc!r}")
                sender.send(error_response(f"internal error reading the request: {exc}"), FINAL)
            continue
        stage.hooks.before_submit(sender.is_cancelled)
        engine.wait_for_room(sum(row.rows for row in rows))
        # asked before submitting: asking a request already answered crashes r24.10 (see
        # docs/operations.md); a client that left while it waited gets no prefill
        client_left = sender.is_cancelled()
        for row, target, listener in zip(rows, targets, listeners, strict=True):
            listener.handle = target.submit(row, listener, checked=True)
            if client_left:
                listener.handle.cancel()
            if owner_pid(key) is not None:  # a caller's cancellation names it (cancel.py)
                stage.cancels.track(key, listener.handle)
        stage.hooks.on_submitted()
