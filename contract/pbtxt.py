"""Write each model's tensor declarations into its ``config.pbtxt`` from :mod:`contract.tensors`.

A config keeps its hand-written parts (backend, batching, parameters, comments) and holds
marked blocks that this module owns::

    # BEGIN GENERATED io (make pbtxt; edit contract/tensors.py, not this block)
    input [ ... ]
    output [ ... ]
    # END GENERATED io

Blocks: ``io`` in every model (its inputs and outputs); in the ensemble, ``preprocessing-inputs``
(what the first step reads, :data:`~contract.tensors.ENSEMBLE_TO_PREPROCESSING`),
``options`` (each option passed to the model stage under its own name) and ``account`` (the
model stage's :data:`~contract.tensors.RESULT_OUTPUTS`, mapped out under their own names);
``parameters`` in the models that share one (:data:`~contract.parameters.MODEL_PARAMETERS`:
the checkpoint's place, the fill-in-the-middle order). So a new option is written once, in the
contract, and ``make pbtxt`` declares and wires it everywhere.

``python -m contract.pbtxt --write`` rewrites the blocks; ``--check`` (the default) lists the
configs that differ and exits 1. ``tests/test_pbtxt.py`` and ``make triton`` run the check.
It is text only (no protobuf), so the contract stays the bottom layer.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from contract.parameters import MODEL_PARAMETERS, Parameter
from contract.tensors import (
    ENSEMBLE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    MODEL_IO,
    OPTION_INPUTS,
    RESULT_OUTPUT_NAMES,
    STREAM_MODEL,
    TensorSpec,
)

DEFAULT_REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
COMMAND = "make pbtxt"  # or: python -m contract.pbtxt --write
BEGIN = "# BEGIN GENERATED {block} (make pbtxt; edit {source}, not this block)"
END = "# END GENERATED {block}"
SOURCES = {"parameters": "contract/parameters.py"}  # the others: contract/tensors.py
_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)# BEGIN GENERATED (?P<block>[\w-]+)\b[^\n]*\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)# END GENERATED (?P=block)[ \t]*$",
    re.DOTALL | re.MULTILINE,
)


class PbtxtError(ValueError):
    """A config whose generated blocks are missing, unknown or duplicated."""


def _tensor(spec: TensorSpec, last: bool) -> list[str]:
    dims = ", ".join(str(d) for d in spec.dims)
    line = f'  {{ name: "{spec.name}" data_type: {spec.triton_type} dims: [ {dims} ]'
    line += " optional: true }" if spec.optional else " }"
    return [*_comment(spec.doc, "  "), line + ("" if last else ",")]


def _comment(doc: str, indent: str, width: int = 100) -> list[str]:
    """``doc`` as ``#`` lines of at most ``width`` characters."""
    lines: list[str] = []
    for word in doc.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(f"{indent}# {word}")
    return lines


def _tensor_list(kind: str, specs: Sequence[TensorSpec]) -> list[str]:
    body = [line for i, s in enumerate(specs) for line in _tensor(s, i == len(specs) - 1)]
    return [f"{kind} [", *body, "]"]


def io_block(model: str, without: Collection[str] = ()) -> list[str]:
    """``input [...]`` and ``output [...]`` exactly as the contract declares them (less the
    outputs named in ``without``: the FasterTransformer export's, which it cannot produce)."""
    inputs, outputs = MODEL_IO[model]
    outputs = tuple(spec for spec in outputs if spec.name not in without)
    return [*_tensor_list("input", inputs), *_tensor_list("output", outputs)]


def _input_map(pairs: Sequence[tuple[str, str]]) -> list[str]:
    return [f'input_map {{ key: "{key}" value: "{value}" }}' for key, value in pairs]


def preprocessing_inputs_block() -> list[str]:
    """The ensemble's first step: which ensemble input feeds each preprocessing input."""
    return _input_map(list(ENSEMBLE_TO_PREPROCESSING.items()))


def options_block() -> list[str]:
    """The model-stage step: every option passes through under its own name."""
    return _input_map([(spec.name, spec.name) for spec in OPTION_INPUTS])


def account_block(without: Collection[str] = ()) -> list[str]:
    """The model-stage step: the engine's account leaves the ensemble under its own names."""
    names = [name for name in RESULT_OUTPUT_NAMES if name not in without]
    return [f'output_map {{ key: "{name}" value: "{name}" }}' for name in names]


def passthrough_block(model: str) -> list[str]:
    """A one-step ensemble's step: every input and output under its own name."""
    inputs, outputs = MODEL_IO[model]
    lines = _input_map([(spec.name, spec.name) for spec in inputs])
    return [*lines, *(f'output_map {{ key: "{s.name}" value: "{s.name}" }}' for s in outputs)]


def _parameter(parameter: Parameter) -> list[str]:
    value = f'{{ string_value: "{parameter.value}" }}'
    return [*_comment(parameter.doc, ""), f'parameters {{ key: "{parameter.key}" value: {value} }}']


def parameters_block(model: str) -> list[str]:
    """The parameters ``model`` shares with other models, each under its comment."""
    return [line for parameter in MODEL_PARAMETERS[model] for line in _parameter(parameter)]


def blocks_for(model: str, without: Collection[str] = ()) -> dict[str, Callable[[], list[str]]]:
    """The generated blocks a model's config must hold, by name (``without``: outputs left out)."""
    blocks: dict[str, Callable[[], list[str]]] = {"io": lambda: io_block(model, without)}
    if model == ENSEMBLE_MODEL:
        blocks["preprocessing-inputs"] = preprocessing_inputs_block
        blocks["options"] = options_block
        blocks["account"] = lambda: account_block(without)
    if model == STREAM_MODEL:
        blocks["passthrough"] = lambda: passthrough_block(model)
    if model in MODEL_PARAMETERS:
        blocks["parameters"] = lambda: parameters_block(model)
    return blocks


def _begin(block: str) -> str:
    return BEGIN.format(block=block, source=SOURCES.get(block, "contract/tensors.py"))


def regenerate(text: str, model: str, without: Collection[str] = ()) -> str:
    """``text`` with each generated block rewritten from the contract (less the outputs named
    in ``without``)."""
    wanted = blocks_for(model, without)
    found = [m["block"] for m in _BLOCK.finditer(text)]
    problems = []
    if missing := [b for b in wanted if b not in found]:
        problems.append(f"no generated block {', '.join(missing)}")
    if unknown := sorted({b for b in found if b not in wanted}):
        problems.append(f"unknown generated block {', '.join(unknown)}")
    if twice := sorted({b for b in found if found.count(b) > 1}):
        problems.append(f"generated block {', '.join(twice)} more than once")
    if problems:
        raise PbtxtError(
            f"{model}/config.pbtxt: {'; '.join(problems)}: mark each with "
            f"'{_begin('<name>')}' and '{END.format(block='<name>')}' lines"
        )

    def rewrite(match: re.Match[str]) -> str:
        indent, block = match["indent"], match["block"]
        body = [indent + line for line in wanted[block]()]
        return "\n".join([indent + _begin(block), *body, indent + END.format(block=block)])

    return _BLOCK.sub(rewrite, text)


def config_path(repository: Path, model: str) -> Path:
    return repository / model / "config.pbtxt"


def drift(repository: Path = DEFAULT_REPOSITORY) -> list[str]:
    """The configs (``<model>/config.pbtxt``) whose generated blocks differ from the contract."""
    stale = []
    for model in sorted(MODEL_IO):
        path = config_path(repository, model)
        text = path.read_text()
        if regenerate(text, model) != text:
            stale.append(f"{model}/config.pbtxt")
    return stale


def write(repository: Path = DEFAULT_REPOSITORY) -> list[str]:
    """Rewrite the generated blocks; returns the configs that changed."""
    changed = []
    for model in sorted(MODEL_IO):
        path = config_path(repository, model)
        text = path.read_text()
        new = regenerate(text, model)
        if new != text:
            path.write_text(new)
            changed.append(f"{model}/config.pbtxt")
    return changed


def drift_message(stale: Sequence[str]) -> str:
    return (
        f"config.pbtxt out of date with contract/tensors.py: {', '.join(stale)}; "
        f"run `{COMMAND}` (python -m contract.pbtxt --write)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m contract.pbtxt", description=__doc__.split("\n")[0]
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 if any differs (default)")
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    args = parser.parse_args(argv)
    try:
        if args.write:
            changed = write(args.repository)
            print("rewrote " + ", ".join(changed) if changed else "every config.pbtxt is current")
            return 0
        stale = drift(args.repository)
    except PbtxtError as error:
        print(error, file=sys.stderr)
        return 2
    if stale:
        print(drift_message(stale), file=sys.stderr)
        return 1
    print("every config.pbtxt is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
