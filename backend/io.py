"""Reading a request's tensors and writing responses, the same way in every adapter."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from contract.options import DEFAULT_MAX_BEAM_WIDTH, InvalidRequestError
from contract.tensors import (
    ENGINE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    INPUT_SPECS,
    PREPROCESSING_TO_MODEL_STAGE,
    TensorSpec,
)
from engine.interface import ModelLimits
from preprocessing.tokenize import Preprocessor
from serving import model_config

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def model_parameters(args: dict) -> dict[str, str]:
    """The ``parameters`` of the model's config.pbtxt, as strings."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def engine_limits(args: dict) -> ModelLimits:
    """What every request must fit (the served model's vocabulary and context, the widest beam
    search), read where the engine model reads it: its config.pbtxt's ``checkpoint_path`` and
    ``max_beam_width``, and the checkpoint's config.json. The models that call the engine
    check requests against it before they can wait behind valid work in the engine's queue."""
    engine_dir = Path(args["model_repository"]).parent / ENGINE_MODEL
    params = model_config.parameters(model_config.read(engine_dir))
    config = json.loads((engine_dir / params["checkpoint_path"] / "config.json").read_text())
    return ModelLimits(
        vocab_size=config["vocab_size"],
        context=config.get("n_positions") or config["max_position_embeddings"],
        max_beam_width=int(params.get("max_beam_width", DEFAULT_MAX_BEAM_WIDTH)),
    )


def read_inputs(request, specs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """The request's tensors present among ``specs``, by name, as numpy arrays."""
    arrays = {}
    for spec in specs:
        tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
        if tensor is not None:
            arrays[spec.name] = tensor.as_numpy()
    return arrays


def requested_outputs(request) -> frozenset[str] | None:
    """The outputs a request asked for (None: all). A response must carry no others: the
    r24.10 stub drops unrequested tensors inside ``send`` without holding the GIL, which frees
    their numpy arrays unlocked and corrupts the stub's heap while other threads run Python
    (fixed in python_backend r24.12, "Hold GIL when deleting numpy array")."""
    try:
        names = request.requested_output_names()
    except Exception:
        return None
    return frozenset(names) or None


def response(outputs: Mapping[str, np.ndarray], requested: frozenset[str] | None = None):
    """A response with ``outputs``, less those the request did not ask for (see
    ``requested_outputs``)."""
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor(k, v) for k, v in outputs.items() if requested is None or k in requested]
    )


def error_response(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def tokenize(preprocessor: Preprocessor, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model-stage tensors of an ensemble-shaped request (its tensors by name): its text
    tokenized in this process by ``preprocessor``, the logic the ``preprocessing`` model runs,
    with the inputs wired as the ensemble wires them, plus its options under their own names.
    In the engine's process rather than a call to ``preprocessing``: a stream's text goes in and
    comes out where its tokens are generated, and crosses no other stub."""
    inputs = {}
    for stage_name, name in ENSEMBLE_TO_PREPROCESSING.items():
        if name not in arrays:
            if INPUT_SPECS[name].optional:
                continue
            raise InvalidRequestError(f"input {name} is required")
        inputs[stage_name] = arrays[name]
    answer = preprocessor.tensors(inputs)
    tokenized = {stage: answer[name] for name, stage in PREPROCESSING_TO_MODEL_STAGE.items()}
    options = {k: v for k, v in arrays.items() if k not in ENSEMBLE_TO_PREPROCESSING.values()}
    return {**tokenized, **options}
