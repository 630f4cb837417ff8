"""Triton adapter for the GPT-J stage: tensors in, engine requests out, answers sent later.

The engine (``engine.engine.Engine``) runs in its own thread; ``execute`` only validates and
submits, then returns ``None``. Each Triton request is answered through its response sender
once all of its rows have finished, which lets requests overlap and batch continuously.
"""

import json
import threading
from pathlib import Path

import torch
import triton_python_backend_utils as pb_utils

from engine import metrics as names
from engine.engine import Engine, GenerationResult
from engine.gptj import GPTJ
from engine.params import InvalidRequestError
from engine.tensors import requests_from_tensors, tensors_from_results

INPUTS = (
    "input_ids",
    "input_lengths",
    "request_output_len",
    "runtime_top_k",
    "runtime_top_p",
    "beam_search_diversity_rate",
    "temperature",
    "len_penalty",
    "repetition_penalty",
    "random_seed",
    "is_return_log_probs",
    "beam_width",
    "start_id",
    "end_id",
    "stop_words_list",
    "bad_words_list",
)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Reply:
    """Collects the rows of one Triton request and sends its single response."""

    def __init__(self, sender, rows: int, return_log_probs: bool) -> None:
        self.sender = sender
        self.results: list[GenerationResult | None] = [None] * rows
        self.return_log_probs = return_log_probs
        self.lock = threading.Lock()

    def row(self, index: int):
        reply = self

        class _Row:
            def on_token(self, token_id: int, log_prob: float) -> None:
                pass

            def on_finish(self, result: GenerationResult) -> None:
                reply.finish(index, result)

        return _Row()

    def finish(self, index: int, result: GenerationResult) -> None:
        with self.lock:
            self.results[index] = result
            if any(r is None for r in self.results):
                return
        errors = [r.error for r in self.results if r.error]
        if errors:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(errors[0]))
        else:
            outputs = tensors_from_results(self.results, self.return_log_probs)
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor(k, v) for k, v in outputs.items()]
            )
        self.sender.send(response, flags=FINAL)


class _Metrics:
    """Engine counters on Triton's metrics endpoint (see engine/metrics.py for why)."""

    def __init__(self, model_name: str) -> None:
        labels = {"model": model_name}
        kinds = [
            (names.ENGINE_METRIC_HELP, pb_utils.MetricFamily.COUNTER),
            (names.ENGINE_GAUGE_HELP, pb_utils.MetricFamily.GAUGE),
        ]
        self.families = []  # keep families alive as long as their metrics
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
        if self.engine is not None:
            self.m[names.ENGINE_RUNNING].set(self.engine.running)

    def on_finish(self, result: GenerationResult) -> None:
        self.m[names.ENGINE_REQUESTS].increment(1)
        self.m[names.ENGINE_GENERATED_TOKENS].increment(len(result.output_ids))
        self.m[names.ENGINE_REQUEST_DURATION_US].increment(result.total_seconds * 1e6)
        self.m[names.ENGINE_QUEUE_DURATION_US].increment(result.queue_seconds * 1e6)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        threads = int(params.get("num_threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        checkpoint = Path(args["model_repository"]) / params["checkpoint_path"]
        dtype = getattr(torch, params.get("dtype", "float32"))
        model = GPTJ.from_checkpoint(checkpoint, dtype=dtype)
        self.metrics = _Metrics(args["model_name"])
        self.engine = Engine(
            model,
            max_batch_size=int(params.get("engine_max_batch_size", "64")),
            max_prefill_tokens=int(params.get("engine_max_prefill_tokens", "4096")),
            observer=self.metrics,
        )
        self.metrics.engine = self.engine
        self.engine.start()
        pb_utils.Logger.log_info(
            f"gptj: serving {checkpoint.resolve()} ({model.config.n_layer} layers, "
            f"{model.config.n_embd} wide, vocab {model.config.vocab_size}, {dtype})"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                arrays = {}
                for name in INPUTS:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        arrays[name] = tensor.as_numpy()
                rows, return_log_probs = requests_from_tensors(arrays)
                for row in rows:
                    self.engine.validate(row)
            except InvalidRequestError as exc:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL
                )
                continue
            reply = _Reply(sender, len(rows), return_log_probs)
            for index, row in enumerate(rows):
                self.engine.submit(row, reply.row(index))
        return None

    def finalize(self):
        self.engine.stop()
