"""The ensemble's tensor contract and the one place where request tensors are built.

Names, types and shapes are those of the FasterTransformer GPT-J ensemble (see CONTRACT.md), so
clients written for it work unchanged. The client library, the load test and the tests all build
their requests with :class:`CompletionRequest`; the model repository's configs are checked
against :data:`ENSEMBLE_INPUTS` / :data:`ENSEMBLE_OUTPUTS` by the tests.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from engine.params import InvalidRequestError, SamplingParams

ENSEMBLE_MODEL = "ensemble"
STREAM_MODEL = "ensemble_stream"
MODEL_STAGE = "gptj"
STAGES = ("preprocessing", MODEL_STAGE, "postprocessing")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    triton_type: str  # as in config.pbtxt, e.g. "TYPE_UINT32"
    dims: tuple[int, ...]
    optional: bool = False

    @property
    def wire_type(self) -> str:
        """The datatype name on the wire (KServe v2), e.g. "UINT32" or "BYTES"."""
        name = self.triton_type.removeprefix("TYPE_")
        return "BYTES" if name == "STRING" else {"BOOL": "BOOL", "FP32": "FP32"}.get(name, name)

    @property
    def numpy_dtype(self) -> type:
        return {
            "BYTES": np.object_,
            "UINT32": np.uint32,
            "UINT64": np.uint64,
            "INT32": np.int32,
            "FP32": np.float32,
            "BOOL": np.bool_,
        }[self.wire_type]


ENSEMBLE_INPUTS = (
    TensorSpec("INPUT_0", "TYPE_STRING", (-1,)),
    TensorSpec("INPUT_1", "TYPE_UINT32", (-1,)),
    TensorSpec("INPUT_2", "TYPE_STRING", (-1,)),
    TensorSpec("INPUT_3", "TYPE_STRING", (-1,)),
    TensorSpec("runtime_top_k", "TYPE_UINT32", (1,), optional=True),
    TensorSpec("runtime_top_p", "TYPE_FP32", (1,), optional=True),
    TensorSpec("temperature", "TYPE_FP32", (1,), optional=True),
    TensorSpec("len_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("repetition_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("random_seed", "TYPE_UINT64", (1,), optional=True),
    TensorSpec("is_return_log_probs", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("beam_width", "TYPE_UINT32", (1,), optional=True),
    TensorSpec("beam_search_diversity_rate", "TYPE_FP32", (1,), optional=True),
    TensorSpec("start_id", "TYPE_UINT32", (1,), optional=True),
    TensorSpec("end_id", "TYPE_UINT32", (1,), optional=True),
)
ENSEMBLE_OUTPUTS = (
    TensorSpec("OUTPUT_0", "TYPE_STRING", (-1, -1)),
    TensorSpec("sequence_length", "TYPE_UINT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
)
INPUT_SPECS = {spec.name: spec for spec in ENSEMBLE_INPUTS}


def encode_words(words: Sequence[str]) -> str:
    """Stop/bad words as the one CSV string the contract carries ("" for none)."""
    if not words:
        return ""
    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_MINIMAL).writerow(words)  # quotes "," "\"" and newlines
    return buffer.getvalue().removesuffix("\r\n")


def decode_words(text: str) -> list[str]:
    """Inverse of :func:`encode_words`; quoted fields may hold commas, quotes and newlines.

    Text without quotes is split on commas alone, so a client that sends a raw newline word
    (``"\n\n"``) unquoted gets it as one word.
    """
    if not text:
        return []
    if '"' not in text:
        return [word for word in text.split(",") if word]
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if len(rows) != 1:
        raise InvalidRequestError(f"word list {text!r} is not one CSV row")
    return [word for word in rows[0] if word]


@dataclass(frozen=True)
class CompletionRequest:
    """One request to the ensemble: one or more prompts sharing the same options."""

    prompts: tuple[str, ...]
    max_tokens: int = 64
    top_k: int = 0
    top_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    return_log_probs: bool = False
    beam_width: int = 1
    end_id: int | None = None
    start_id: int | None = None
    len_penalty: float | None = None
    beam_search_diversity_rate: float | None = None
    sampling: SamplingParams = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.prompts, str):
            object.__setattr__(self, "prompts", (self.prompts,))
        object.__setattr__(self, "prompts", tuple(self.prompts))
        object.__setattr__(self, "stop_words", tuple(self.stop_words))
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        self.validate()

    def validate(self) -> None:
        """Refuse, before anything is sent, an option the server would refuse."""
        if not self.prompts:
            raise InvalidRequestError("no prompt given")
        for i, prompt in enumerate(self.prompts):
            if not isinstance(prompt, str) or not prompt:
                raise InvalidRequestError(f"prompt {i} is empty: give some text to complete")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {self.max_tokens}"
            )
        if self.beam_width != 1:
            raise InvalidRequestError(
                f"beam_width={self.beam_width} is not supported: the server does sampling and "
                "greedy search only (beam_width=1)"
            )
        for name in ("end_id", "start_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**32:
                raise InvalidRequestError(f"{name} must be a token id in [0, 2**32), got {value}")
        object.__setattr__(
            self,
            "sampling",
            SamplingParams(
                top_k=self.top_k,
                top_p=self.top_p,
                temperature=self.temperature,
                repetition_penalty=self.repetition_penalty,
                seed=self.seed,
            ),
        )

    def tensors(self) -> dict[str, np.ndarray]:
        """The request's tensors by input name, shaped [batch, ...] as the ensemble expects."""
        n = len(self.prompts)

        def column(value, dtype) -> np.ndarray:
            return np.full((n, 1), value, dtype=dtype)

        tensors = {
            "INPUT_0": np.array([[p.encode()] for p in self.prompts], dtype=np.object_),
            "INPUT_1": column(self.max_tokens, np.uint32),
            "INPUT_2": column(encode_words(self.bad_words).encode(), np.object_),
            "INPUT_3": column(encode_words(self.stop_words).encode(), np.object_),
            "runtime_top_k": column(self.top_k, np.uint32),
            "runtime_top_p": column(self.top_p, np.float32),
            "temperature": column(self.temperature, np.float32),
            "repetition_penalty": column(self.repetition_penalty, np.float32),
            "is_return_log_probs": column(self.return_log_probs, np.bool_),
            "beam_width": column(self.beam_width, np.uint32),
        }
        optional = {
            "random_seed": (self.seed, np.uint64),
            "end_id": (self.end_id, np.uint32),
            "start_id": (self.start_id, np.uint32),
            "len_penalty": (self.len_penalty, np.float32),
            "beam_search_diversity_rate": (self.beam_search_diversity_rate, np.float32),
        }
        for name, (value, dtype) in optional.items():
            if value is not None:
                tensors[name] = column(value, dtype)
        return tensors

    def infer_inputs(self, protocol: ModuleType) -> list:
        """``InferInput`` objects for ``tritonclient.http`` or ``tritonclient.grpc``."""
        return to_infer_inputs(self.tensors(), protocol)


def to_infer_inputs(tensors: dict[str, np.ndarray], protocol: ModuleType) -> list:
    inputs = []
    for name, array in tensors.items():
        infer_input = protocol.InferInput(name, list(array.shape), INPUT_SPECS[name].wire_type)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def requested_outputs(protocol: ModuleType) -> list:
    return [protocol.InferRequestedOutput(spec.name) for spec in ENSEMBLE_OUTPUTS]


def generate_body(request: CompletionRequest) -> dict[str, str | int | float | bool]:
    """The JSON body of Triton's HTTP ``generate`` / ``generate_stream`` for a one-prompt request:
    the same tensors as :meth:`CompletionRequest.tensors`, each as the scalar it holds."""
    if len(request.prompts) != 1:
        raise InvalidRequestError(
            f"streaming takes one prompt per request, got {len(request.prompts)}"
        )
    body: dict[str, str | int | float | bool] = {}
    for name, array in request.tensors().items():
        value = array.reshape(-1)[0]
        body[name] = value.decode() if isinstance(value, bytes) else value.item()
    return body
