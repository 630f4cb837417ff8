"""Every request option the contract defines reaches every place a caller can set it.

The contract (``contract/tensors.py``: the ensemble's inputs, ``OPTION_INPUTS`` among them)
is the one list. Each check below derives what it expects from it and probes the code, so an
option added to the contract fails here until the client's ``CompletionRequest``, its
``SamplingOptions``, the ``codegen`` flags and the engine's tensor reader carry it, and until
the OpenAI-compatible API either maps an OpenAI field onto it or refuses it by name. (That
every ``config.pbtxt`` declares it is generated: ``make pbtxt``; ``tests/test_pbtxt.py`` fails
until it has run.)

Nothing here lists option names: a probe sets one thing to a legal non-default value and
records which contract inputs changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pytest

from client import cli
from client.client import SamplingOptions
from client.request import CompletionRequest
from contract.tensors import ENSEMBLE_INPUTS, MODEL_STAGE_INPUTS, OPTION_INPUTS, TensorSpec
from contract.words import word_list
from engine import tensors as engine_tensors
from openai_api.errors import OpenAIError
from openai_api.request import parse_completion

CONTRACT_INPUTS = {spec.name for spec in ENSEMBLE_INPUTS}
PROMPT_INPUT = ENSEMBLE_INPUTS[0].name  # INPUT_0: the text, not an option
OPTIONS = CONTRACT_INPUTS - {PROMPT_INPUT}
# Legal values that differ from every default of the contract (0, 1, none, false), tried in turn.
SAMPLES: tuple[Any, ...] = (2, 0.5, True, ("x",), "x", 0)


def changed(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> set[str]:
    """The tensors that appeared or hold other values."""
    return {
        name
        for name, value in after.items()
        if name not in before
        or before[name].shape != value.shape
        or not np.array_equal(before[name], value)
    }


def request_fields() -> dict[str, Any]:
    """CompletionRequest's init fields and their types (what a caller of the library sets)."""
    hints = typing.get_type_hints(CompletionRequest)
    return {f.name: hints[f.name] for f in dataclasses.fields(CompletionRequest) if f.init}


def accepts(kind: Any, value: Any) -> bool:
    """Whether ``value`` fits the annotation ``kind`` (int, float, bool, X | None, tuple[str])."""
    if kind is Any:
        return True
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(k, value) for k in typing.get_args(kind) if k is not type(None))
    if origin is tuple:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def first_change(
    build: Callable[[Any], Mapping[str, np.ndarray]],
    base: Mapping[str, np.ndarray],
    values: Iterable[Any],
    refused: type[Exception] = ValueError,
) -> set[str]:
    """The inputs the first legal value of ``values`` changes (empty: none did)."""
    for value in values:
        try:
            after = build(value)
        except refused:
            continue
        difference = changed(base, after)
        if difference:
            return difference
    return set()


# --- the client library --------------------------------------------------------------------


def library_reach() -> dict[str, set[str]]:
    """For each CompletionRequest field, the contract inputs it sets."""
    base = CompletionRequest(("x",)).tensors()
    reach = {}
    for name, kind in request_fields().items():
        if name == "prompts":
            reach[name] = changed(base, CompletionRequest(("y",)).tensors())
            continue
        values = [v for v in SAMPLES if accepts(kind, v)]
        reach[name] = first_change(
            lambda v, name=name: CompletionRequest(("x",), **{name: v}).tensors(), base, values
        )
    return reach


def test_the_client_request_sets_every_contract_input():
    reach = library_reach()
    reached = set().union(*reach.values())
    assert reached == CONTRACT_INPUTS, (
        f"no CompletionRequest field sets {sorted(CONTRACT_INPUTS - reached)}; "
        f"fields that set nothing: {sorted(k for k, v in reach.items() if not v)}"
    )
    assert not [k for k, v in reach.items() if not v], "a CompletionRequest field sets nothing"


def test_the_client_request_uses_the_contract_types():
    specs: dict[str, TensorSpec] = {spec.name: spec for spec in ENSEMBLE_INPUTS}
    for name, kind in request_fields().items():
        for value in (v for v in SAMPLES if accepts(kind, v) and name != "prompts"):
            try:
                tensors = CompletionRequest(("x",), **{name: value}).tensors()
            except ValueError:
                continue
            for tensor, array in tensors.items():
                assert array.dtype == np.dtype(specs[tensor].numpy_dtype), (name, tensor)


def test_the_library_methods_take_every_request_option():
    options = set(typing.get_type_hints(SamplingOptions))
    assert options == set(request_fields()) - {"prompts", "max_tokens"}


# --- the codegen command -------------------------------------------------------------------


def cli_flags() -> list[argparse.Action]:
    """The `codegen complete` options that shape the request (not the server connection)."""
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    complete = subparsers.choices["complete"]
    connection = {a.dest for a in cli._connection_options()._actions}
    return [
        a
        for a in complete._actions
        if a.option_strings and a.dest not in connection and a.dest != "help"
    ]


def cli_tensors(*argv: str) -> dict[str, np.ndarray]:
    args = cli.build_parser().parse_args(["complete", *argv, "x"])
    return cli._request(args, args.prompt).tensors()


def cli_values(action: argparse.Action) -> list[list[str]]:
    if action.nargs == 0:  # store_true
        return [[action.option_strings[0]]]
    if action.type is int:
        return [[action.option_strings[0], "2"]]
    if action.type is float:
        return [[action.option_strings[0], v] for v in ("0.5", "2")]
    return [[action.option_strings[0], "x"]]


def test_the_codegen_command_has_a_flag_for_every_contract_option():
    base = cli_tensors()
    reached: set[str] = set()
    for action in cli_flags():
        reached |= first_change(lambda argv: cli_tensors(*argv), base, cli_values(action))
    assert reached >= OPTIONS, f"no codegen flag sets {sorted(OPTIONS - reached)}"


# --- the OpenAI-compatible API -------------------------------------------------------------

# OpenAI's own completions parameters (its API reference), the names an OpenAI client sends.
OPENAI_FIELDS = (
    "model",
    "prompt",
    "suffix",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "best_of",
    "logit_bias",
    "user",
    "seed",
)


def api_tensors(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return parse_completion({"prompt": "x", **body}).requests[0].tensors()


def test_the_openai_api_maps_or_refuses_every_contract_option():
    base = api_tensors({})
    library = library_reach()
    # a field the API takes: OpenAI's own, or one named as the client library or contract name it
    candidates = set(OPENAI_FIELDS) | set(library) | OPTIONS
    mapped: dict[str, set[str]] = {}
    for name in sorted(candidates):
        values = [[v] if isinstance(v, tuple) else v for v in SAMPLES]
        mapped[name] = first_change(
            lambda v, name=name: api_tensors({name: v}), base, values, refused=OpenAIError
        )
    reached = set().union(*mapped.values())
    for option in sorted(OPTIONS - reached):
        # not mapped: a body naming it (as the contract or the client library does) is a 400
        names = {option} | {field for field, inputs in library.items() if option in inputs}
        for name in sorted(names):
            with pytest.raises(OpenAIError) as refusal:
                parse_completion({"prompt": "x", name: 2})
            assert refusal.value.status == 400, name
            assert refusal.value.param == name, (name, refusal.value.message)


# --- the engine's tensor reader ------------------------------------------------------------


def stage_arrays(**extra: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([[1, 2, 3]], dtype=np.uint32),
        "input_lengths": np.array([[3]], dtype=np.uint32),
        "request_output_len": np.array([[4]], dtype=np.uint32),
        **extra,
    }


def stage_samples(spec: TensorSpec) -> list[np.ndarray]:
    if spec.dims == (2, -1):  # a word list: one word of one token
        return [word_list([[[5]]])]
    if spec.wire_type == "BOOL":
        return [np.array([[True]])]
    if spec.wire_type == "FP32":
        return [np.array([[v]], dtype=np.float32) for v in (0.5, 2.0)]
    return [np.array([[2]], dtype=spec.numpy_dtype)]


@pytest.mark.parametrize(
    "spec", [s for s in MODEL_STAGE_INPUTS if s.optional], ids=lambda spec: spec.name
)
def test_the_engine_reads_every_option_input(spec):
    base = engine_tensors.requests_from_tensors(stage_arrays())
    ignored = engine_tensors.UNUSED_OPTION_INPUTS
    read = any(
        engine_tensors.requests_from_tensors(stage_arrays(**{spec.name: value})) != base
        for value in stage_samples(spec)
    )
    if spec.name in ignored:
        assert not read, f"{spec.name} is read, yet listed as unused"
    else:
        assert read, f"engine/tensors.py ignores {spec.name}: read it or list it as unused"


def test_every_option_input_reaches_the_model_stage():
    stage = {spec.name for spec in MODEL_STAGE_INPUTS}
    assert {spec.name for spec in OPTION_INPUTS} <= stage
