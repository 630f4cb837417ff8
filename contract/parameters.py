"""The ``parameters`` that several models' configs share, written once.

Where the served checkpoint is and how a fill-in-the-middle prompt is laid out must agree
between every model that tokenizes, detokenizes or loads the weights. ``make pbtxt``
(:mod:`contract.pbtxt`) writes each model's into a generated ``parameters`` block of its
``config.pbtxt``, as it writes the tensors; ``tests/test_pbtxt.py`` fails on drift. A
parameter one model alone reads (the engine's dtype, batch size, ...) stays hand-written in
that model's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.tensors import ENGINE_MODEL, POSTPROCESSING_MODEL, PREPROCESSING_MODEL


@dataclass(frozen=True)
class Parameter:
    """One ``parameters { key: ... value: { string_value: ... } }`` entry and its comment."""

    key: str
    value: str
    doc: str = ""


CHECKPOINT = "../gptj/1/checkpoint"  # relative to a model's folder (serving.paths.checkpoint_dir)

TOKENIZER_PATH = Parameter(
    "tokenizer_path",
    CHECKPOINT,
    doc="The tokenizer's folder: the served checkpoint (the engine's checkpoint_path).",
)
FIM_ORDER = Parameter(
    "fim_order",
    "auto",
    doc='Fill-in-the-middle prompt order: "auto" (the order `make model` built the checkpoint'
    ' for, in its build.json: SPM for the default model; PSM for any other), "psm", or'
    ' "spm" (StarCoder-style tokens; a prefix cache then reuses an editor\'s resent prompt up'
    " to the cursor). docs/fim.md measures both. The same in every model that builds prompts.",
)
CHECKPOINT_PATH = Parameter(
    "checkpoint_path",
    CHECKPOINT,
    doc="The Hugging Face checkpoint served (relative to this folder); `make model` writes it"
    " into the gptj folder, where the ensemble's model stage has always had it.",
)

# The shared parameters of each model that has any.
MODEL_PARAMETERS: dict[str, tuple[Parameter, ...]] = {
    PREPROCESSING_MODEL: (TOKENIZER_PATH, FIM_ORDER),
    POSTPROCESSING_MODEL: (TOKENIZER_PATH,),
    ENGINE_MODEL: (CHECKPOINT_PATH, FIM_ORDER),
}
