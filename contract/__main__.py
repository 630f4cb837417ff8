"""Print the contract as Markdown: ``python -m contract > docs/contract.md``.

``tests/test_contract.py`` checks that docs/contract.md is this output, so the document cannot
drift from the code any more than the configs can.
"""

from __future__ import annotations

from contract import options
from contract.tensors import (
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    MODEL_IO,
    OPTION_DEFAULTS,
    PREPROCESSING_TO_MODEL_STAGE,
    STAGES,
    STREAM_MODEL,
    TensorSpec,
)

ORDER = (ENSEMBLE_MODEL, STREAM_MODEL, *STAGES, ENGINE_MODEL)
NO_VALUE = {"random_seed": "a random seed", "end_id": "the model's own end token"}


def _absent(name: str) -> str:
    if name not in OPTION_DEFAULTS:
        return ""
    value = OPTION_DEFAULTS[name]
    return NO_VALUE.get(name, "unused") if value is None else f"`{value}`"


def _table(specs: tuple[TensorSpec, ...], defaults: bool) -> list[str]:
    head = "| name | type | dims | optional |" + (" absent means |" if defaults else "")
    rows = [head, "|---|---|---|---|" + ("---|" if defaults else "")]
    for spec in specs:
        row = f"| `{spec.name}` | {spec.triton_type} | {list(spec.dims)} | "
        row += ("yes" if spec.optional else "no") + " |"
        if defaults:
            row += f" {_absent(spec.name)} |"
        rows.append(row)
    return rows


def render() -> str:
    lines = [
        "# The tensor contract",
        "",
        "Generated from `contract/` by `python -m contract`; `tests/test_contract.py` checks",
        "that every `config.pbtxt` declares exactly these tensors and that this page is current.",
        "Dims are per request, without the batch dimension (every model has max_batch_size > 0).",
        "The ensemble's names, types and shapes are those of the FasterTransformer GPT-J",
        "ensemble, so clients written for it work unchanged.",
    ]
    for model in ORDER:
        inputs, outputs = MODEL_IO[model]
        lines += ["", f"## `{model}`", "", "Inputs:", "", *_table(inputs, True)]
        lines += ["", "Outputs:", "", *_table(outputs, False)]
    lines += ["", "## Wiring", "", "| ensemble input | preprocessing input |", "|---|---|"]
    lines += [f"| `{v}` | `{k}` |" for k, v in ENSEMBLE_TO_PREPROCESSING.items()]
    lines += ["", "| preprocessing output | model-stage input |", "|---|---|"]
    lines += [f"| `{k}` | `{v}` |" for k, v in PREPROCESSING_TO_MODEL_STAGE.items()]
    lines += [
        "",
        "The options pass from the ensemble to the model stage under their own names.",
        "",
        "## Limits",
        "",
        f"- prompt: at most {options.MAX_PROMPT_BYTES:,} bytes of UTF-8",
        f"- stop or bad words: at most {options.MAX_WORDS_PER_LIST} per prompt, "
        f"{options.MAX_TOKENS_PER_WORD} tokens each",
        "- `runtime_top_p` in [0, 1]; `temperature` 0 (greedy) or in "
        f"[{options.MIN_TEMPERATURE}, inf); `repetition_penalty` in "
        f"[{options.REPETITION_PENALTY_RANGE[0]}, {options.REPETITION_PENALTY_RANGE[1]}]; "
        "`random_seed` in [0, 2**64); non-finite values are refused",
        "- prompt + `request_output_len` within the model's context",
        "- `beam_width` from 1 to the server's `max_beam_width` (engine/config.pbtxt, "
        f"{options.DEFAULT_MAX_BEAM_WIDTH} by default), the same for every prompt of a request; "
        "`len_penalty` and `beam_search_diversity_rate` finite",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
