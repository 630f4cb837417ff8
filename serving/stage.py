"""What the unary (``gptj``) and streaming (``ensemble_stream``) engine adapters share.

Imported only inside Triton's python backend (it needs ``triton_python_backend_utils``): loading
the checkpoint into an engine from the model config, reading a request's input tensors (or having
``preprocessing`` tokenize them), and the engine's custom metrics.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton_python_backend_utils as pb_utils

from contract import metrics as names
from engine.engine import Engine, GenerationResult
from engine.gptj import GPTJ
from contract.options import InvalidRequestError
from contract.tensors import PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS

INPUTS = (
    "input_ids", "input_lengths", "request_output_len", "runtime_top_k", "runtime_top_p",
    "beam_search_diversity_rate", "temperature", "len_penalty", "repetition_penalty",
    "random_seed", "is_return_log_probs", "beam_width", "start_id", "end_id",
    "stop_words_list", "bad_words_list",
)  # fmt: skip


def read_inputs(request) -> dict:
    """The request's tensors present, by name, as numpy arrays."""
    arrays = {}
    for name in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


def tokenize(request) -> dict:
    """The model-stage tensors of an ensemble-shaped request, tokenized by the
    ``preprocessing`` model (a BLS call), plus the request's optional sampling inputs."""
    inputs = []
    for stage_name, name in PREPROCESSING_INPUTS.items():
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise InvalidRequestError(f"input {name} is required")
        inputs.append(pb_utils.Tensor(stage_name, tensor.as_numpy()))
    response = pb_utils.InferenceRequest(
        model_name="preprocessing",
        requested_output_names=list(PREPROCESSING_OUTPUTS),
        inputs=inputs,
    ).exec()
    if response.has_error():
        raise InvalidRequestError(response.error().message())
    arrays = {
        stage: pb_utils.get_output_tensor_by_name(response, name).as_numpy()
        for name, stage in PREPROCESSING_OUTPUTS.items()
    }
    for name in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if name not in arrays and tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


def error_response(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class EngineMetrics:
    """Engine counters on Triton's metrics endpoint (see contract/metrics.py for why)."""

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
        if self.engine is not None:
            self.m[names.ENGINE_RUNNING].set(self.engine.running)

    def on_finish(self, result: GenerationResult) -> None:
        if self.engine is not None:
            self.m[names.ENGINE_RUNNING].set(self.engine.running)
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
    config = json.loads(args["model_config"])
    params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
    threads = int(params.get("num_threads", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    checkpoint = Path(args["model_repository"]) / params["checkpoint_path"]
    dtype = getattr(torch, params.get("dtype", "float32"))
    device = resolve_device(os.environ.get("CODEGEN_DEVICE") or params.get("device", "auto"))
    model = GPTJ.from_checkpoint(checkpoint, dtype=dtype, device=device)
    metrics = EngineMetrics(args["model_name"])
    engine = Engine(
        model,
        max_batch_size=int(params.get("engine_max_batch_size", "64")),
        max_prefill_tokens=int(params.get("engine_max_prefill_tokens", "4096")),
        observer=metrics,
    )
    metrics.engine = engine
    engine.start()
    cfg = model.config
    pb_utils.Logger.log_info(
        f"{args['model_name']}: serving {checkpoint.resolve()} ({cfg.n_layer} layers, "
        f"{cfg.n_embd} wide, vocab {cfg.vocab_size}, {dtype} on {device})"
    )
    return Stage(engine, checkpoint, params)
