"""The one place where a request's tensors are built, from the contract's names and types.

The client library, the command, the load test and the tests all build their requests with
:class:`CompletionRequest`, which checks every option with the server's own rules
(:mod:`contract.options`) before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from contract.options import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SAMPLING,
    BeamParams,
    EditorStops,
    InvalidRequestError,
    SamplingParams,
)
from contract.tensors import (
    ENSEMBLE_INPUTS,
    ENSEMBLE_OUTPUTS,
    INPUT_SPECS,
    RESULT_OUTPUT_NAMES,
    STOP_INPUT,
)
from contract.words import encode_words


@dataclass(frozen=True)
class CompletionRequest:
    """One request to the ensemble: one or more prompts sharing the same options.

    ``suffix``: the text after the cursor, for fill-in-the-middle (the prompt is then the text
    before it, and may be empty); one string for one prompt, or one per prompt. The completion
    is what goes between them, and the whole text the server returns is prompt + middle.
    """

    prompts: tuple[str, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    top_k: int = DEFAULT_SAMPLING.top_k
    top_p: float = DEFAULT_SAMPLING.top_p
    temperature: float = DEFAULT_SAMPLING.temperature
    repetition_penalty: float = DEFAULT_SAMPLING.repetition_penalty
    seed: int | None = DEFAULT_SAMPLING.seed
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    return_log_probs: bool = False
    beam_width: int = 1
    end_id: int | None = None
    start_id: int | None = None
    len_penalty: float | None = None
    beam_search_diversity_rate: float | None = None
    suffix: str | tuple[str, ...] | None = None
    single_line: bool = False
    n_indent: int = 0
    t_max_predict_ms: int = 0
    token_healing: bool | None = None  # None: the server's default (on)
    sampling: SamplingParams = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.prompts, str):
            object.__setattr__(self, "prompts", (self.prompts,))
        object.__setattr__(self, "prompts", tuple(self.prompts))
        object.__setattr__(self, "stop_words", tuple(self.stop_words))
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        if isinstance(self.suffix, str):
            object.__setattr__(self, "suffix", (self.suffix,))
        elif self.suffix is not None:
            object.__setattr__(self, "suffix", tuple(self.suffix))
        self.validate()

    def validate(self) -> None:
        """Refuse, before anything is sent, an option the server would refuse."""
        if not self.prompts:
            raise InvalidRequestError("no prompt given")
        suffixes = self.suffixes
        if len(suffixes) != len(self.prompts):
            raise InvalidRequestError(
                f"{len(suffixes)} suffixes for {len(self.prompts)} prompts: give one per prompt"
            )
        for i, (prompt, suffix) in enumerate(zip(self.prompts, suffixes, strict=True)):
            if not isinstance(suffix, str):
                raise InvalidRequestError(f"suffix {i} must be text, got {suffix!r}")
            if not isinstance(prompt, str) or not (prompt or suffix):
                raise InvalidRequestError(f"prompt {i} is empty: give some text to complete")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {self.max_tokens}"
            )
        if not isinstance(self.beam_width, int):
            raise InvalidRequestError(f"beam_width must be an integer, got {self.beam_width!r}")
        BeamParams(  # the server's limit on the width is its own (max_beam_width)
            self.beam_width,
            0.0 if self.len_penalty is None else self.len_penalty,
            0.0 if self.beam_search_diversity_rate is None else self.beam_search_diversity_rate,
        )
        for name in ("n_indent", "t_max_predict_ms"):
            if not isinstance(getattr(self, name), int):
                raise InvalidRequestError(f"{name} must be an integer, got {getattr(self, name)!r}")
        editor = EditorStops(bool(self.single_line), self.n_indent, self.t_max_predict_ms)
        if editor.active and self.beam_width > 1:
            raise InvalidRequestError(
                "single_line, n_indent and t_max_predict_ms end one answer; send beam_width 1"
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

    @property
    def suffixes(self) -> tuple[str, ...]:
        """One suffix per prompt ("" where none: no fill-in-the-middle)."""
        assert not isinstance(self.suffix, str)  # made a tuple in __post_init__
        return self.suffix if self.suffix is not None else ("",) * len(self.prompts)

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
            # the editor stop rules: absent unless set, so a server without them still answers
            "single_line": (self.single_line or None, np.bool_),
            "n_indent": (self.n_indent or None, np.uint32),
            "t_max_predict_ms": (self.t_max_predict_ms or None, np.uint32),
            "token_healing": (self.token_healing, np.bool_),  # absent: the server's default
        }
        for name, (value, dtype) in optional.items():
            if value is not None:
                tensors[name] = column(value, dtype)
        if any(self.suffixes):  # absent otherwise: a server without the input still answers
            tensors["suffix"] = np.array([[s.encode()] for s in self.suffixes], dtype=np.object_)
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


def stop_tensors(prompt: str = "") -> dict[str, np.ndarray]:
    """A stop request's tensors: sent with the request id of a request still generating (to
    ``ensemble``, ``gptj`` or ``ensemble_stream``), it ends that request (whose client gets an
    error saying it was stopped) and is answered at once with nothing generated. The
    ensemble's required inputs must be there; their values do not matter (``prompt`` comes
    back as a unary answer's text)."""
    tensors = CompletionRequest((prompt or " ",), max_tokens=1).tensors()
    required = {spec.name for spec in ENSEMBLE_INPUTS if not spec.optional}
    tensors = {name: array for name, array in tensors.items() if name in required}
    tensors[STOP_INPUT.name] = np.array([[True]], dtype=np.bool_)
    return tensors


def stop_inputs(protocol: ModuleType, prompt: str = "") -> list:
    """:func:`stop_tensors` as ``InferInput`` objects of ``protocol``."""
    return to_infer_inputs(stop_tensors(prompt), protocol)


def requested_outputs(protocol: ModuleType, account: bool = True) -> list:
    """The ensemble's outputs, and with ``account`` the engine's (finish reason, token counts)."""
    names = [spec.name for spec in ENSEMBLE_OUTPUTS] + list(RESULT_OUTPUT_NAMES if account else ())
    return [protocol.InferRequestedOutput(name) for name in names]


def gives_account(metadata: Any) -> bool:
    """Whether a model's metadata (gRPC message or HTTP dict) lists the engine's account; a
    FasterTransformer export's ensemble does not, and Triton refuses an output it lacks."""
    outputs = metadata["outputs"] if isinstance(metadata, dict) else metadata.outputs
    names = {o["name"] if isinstance(o, dict) else o.name for o in outputs}
    return set(RESULT_OUTPUT_NAMES) <= names


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
