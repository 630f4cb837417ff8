"""Every model's tensors: names, types and shapes, and how the ensemble wires them.

The ensemble's inputs and outputs are those of the FasterTransformer GPT-J ensemble, so clients
written for it work unchanged. Each model's ``config.pbtxt`` declares exactly the specs here: its
input and output lists (and the ensemble's option wiring) are generated from them by
``make pbtxt`` (:mod:`contract.pbtxt`); ``tests/test_contract.py`` fails on any drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract.options import DEFAULT_SAMPLING, NO_EDITOR_STOPS

ENSEMBLE_MODEL = "ensemble"
STREAM_MODEL = "ensemble_stream"
PREPROCESSING_MODEL = "preprocessing"
MODEL_STAGE = "gptj"
POSTPROCESSING_MODEL = "postprocessing"
STAGES = (PREPROCESSING_MODEL, MODEL_STAGE, POSTPROCESSING_MODEL)

_NUMPY = {
    "BYTES": np.object_,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT32": np.int32,
    "FP32": np.float32,
    "BOOL": np.bool_,
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as ``config.pbtxt`` declares it (dims without the batch dim)."""

    name: str
    triton_type: str  # as in config.pbtxt, e.g. "TYPE_UINT32"
    dims: tuple[int, ...]
    optional: bool = False
    # A note the generated config.pbtxt writes above the tensor; not part of its identity.
    doc: str = field(default="", compare=False)

    @property
    def wire_type(self) -> str:
        """The datatype name on the wire (KServe v2), e.g. "UINT32" or "BYTES"."""
        name = self.triton_type.removeprefix("TYPE_")
        return "BYTES" if name == "STRING" else name

    @property
    def numpy_dtype(self) -> type:
        return _NUMPY[self.wire_type]


def _scalar(name: str, triton_type: str, doc: str = "") -> TensorSpec:
    return TensorSpec(name, triton_type, (1,), optional=True, doc=doc)


# Per-prompt options: the ensemble passes them to the model stage under the same names.
OPTION_INPUTS = (
    _scalar("runtime_top_k", "TYPE_UINT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("beam_search_diversity_rate", "TYPE_FP32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("random_seed", "TYPE_UINT64"),
    _scalar("is_return_log_probs", "TYPE_BOOL"),
    _scalar("beam_width", "TYPE_UINT32"),
    _scalar("start_id", "TYPE_UINT32"),
    _scalar("end_id", "TYPE_UINT32"),
    # Not in the FasterTransformer contract: editor stop rules (contract/options.py EditorStops)
    _scalar("single_line", "TYPE_BOOL", "not in the FasterTransformer contract: editors' stop"),
    _scalar("n_indent", "TYPE_UINT32", "not in the FasterTransformer contract: editors' stop"),
    _scalar("t_max_predict_ms", "TYPE_UINT32", "not in the FasterTransformer contract: ditto"),
)
# The value the model stage uses for an option input that is absent (None: no value).
OPTION_DEFAULTS: dict[str, int | float | bool | None] = {
    "runtime_top_k": DEFAULT_SAMPLING.top_k,
    "runtime_top_p": DEFAULT_SAMPLING.top_p,
    "temperature": DEFAULT_SAMPLING.temperature,
    "repetition_penalty": DEFAULT_SAMPLING.repetition_penalty,
    "random_seed": DEFAULT_SAMPLING.seed,
    "is_return_log_probs": False,
    "beam_width": 1,
    "start_id": None,
    "end_id": None,  # the model's own end token
    "len_penalty": 0.0,
    "beam_search_diversity_rate": 0.0,
    "single_line": NO_EDITOR_STOPS.single_line,
    "n_indent": NO_EDITOR_STOPS.n_indent,
    "t_max_predict_ms": NO_EDITOR_STOPS.t_max_predict_ms,
}

ENSEMBLE_INPUTS = (
    TensorSpec("INPUT_0", "TYPE_STRING", (-1,)),  # prompt text
    TensorSpec("INPUT_1", "TYPE_UINT32", (-1,)),  # tokens to generate
    TensorSpec("INPUT_2", "TYPE_STRING", (-1,)),  # bad words, one CSV string
    TensorSpec("INPUT_3", "TYPE_STRING", (-1,)),  # stop words, one CSV string
    *OPTION_INPUTS,
    # Present and not empty, the prompt (INPUT_0) is the text before it and the model fills the
    # gap (contract/fim.py).
    TensorSpec(
        "suffix",
        "TYPE_STRING",
        (-1,),
        optional=True,
        doc="not in the FasterTransformer contract: the text after the cursor (fill-in-the-middle)",
    ),
    # Absent: on; with a suffix the prefix's end is healed inside the layout (contract/healing.py).
    _scalar(
        "token_healing",
        "TYPE_BOOL",
        "not in the FasterTransformer contract: false keeps the prompt's last token as it is",
    ),
)
ENSEMBLE_OUTPUTS = (
    TensorSpec("OUTPUT_0", "TYPE_STRING", (-1, -1)),  # prompt + completion, flat [batch * beam]
    TensorSpec("sequence_length", "TYPE_UINT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
)

# One response per piece of text: that piece, and the log probs of the tokens it carries.
STREAM_OUTPUTS = (
    TensorSpec("OUTPUT_0", "TYPE_STRING", (-1,)),
    TensorSpec("sequence_length", "TYPE_UINT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1,)),
)

# Not in the FasterTransformer contract: what happened, in every final response of the models
# that generate (the seed's outputs stay as they were; a client that does not ask for these
# does not get them).
RESULT_OUTPUTS = (
    TensorSpec(
        "finish_reason",
        "TYPE_STRING",
        (-1,),
        doc="not in the FasterTransformer contract: why each beam ended (contract/finish.py)",
    ),
    TensorSpec(
        "prompt_tokens",
        "TYPE_UINT32",
        (1,),
        doc="not in the FasterTransformer contract: the prompt's tokens, as the engine ran it",
    ),
    TensorSpec(
        "completion_tokens",
        "TYPE_UINT32",
        (-1,),
        doc="not in the FasterTransformer contract: the tokens each beam generated",
    ),
)
RESULT_OUTPUT_NAMES = tuple(spec.name for spec in RESULT_OUTPUTS)

PREPROCESSING_INPUTS = (
    TensorSpec("QUERY", "TYPE_STRING", (-1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_UINT32", (-1,)),
    TensorSpec("BAD_WORDS_DICT", "TYPE_STRING", (-1,)),
    TensorSpec("STOP_WORDS_DICT", "TYPE_STRING", (-1,)),
    TensorSpec("suffix", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("token_healing", "TYPE_BOOL", (1,), optional=True),
)
PREPROCESSING_OUTPUTS = (
    TensorSpec("INPUT_ID", "TYPE_UINT32", (-1,)),
    TensorSpec("REQUEST_INPUT_LEN", "TYPE_UINT32", (1,)),
    TensorSpec("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)),
    TensorSpec("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_UINT32", (-1,)),
    TensorSpec("HELD_BACK_ID", "TYPE_INT32", (1,)),  # token healing: the held-back id, or -1
)

MODEL_STAGE_INPUTS = (
    TensorSpec("input_ids", "TYPE_UINT32", (-1,)),
    TensorSpec("input_lengths", "TYPE_UINT32", (1,)),
    TensorSpec("request_output_len", "TYPE_UINT32", (-1,)),
    *OPTION_INPUTS,
    TensorSpec("stop_words_list", "TYPE_INT32", (2, -1), optional=True),
    TensorSpec("bad_words_list", "TYPE_INT32", (2, -1), optional=True),
    # Token healing: the prompt's last token, held back out of input_ids (-1 or absent: none);
    # the first generated token must start with its text (contract/healing.py).
    TensorSpec("held_back_id", "TYPE_INT32", (1,), optional=True),
)
MODEL_STAGE_OUTPUTS = (
    TensorSpec("output_ids", "TYPE_UINT32", (-1, -1)),  # [beam, prompt + generated]
    TensorSpec("sequence_length", "TYPE_UINT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
)

POSTPROCESSING_INPUTS = (
    TensorSpec("TOKENS_BATCH", "TYPE_UINT32", (-1, -1)),
    TensorSpec("SEQUENCE_LENGTH", "TYPE_UINT32", (-1,), optional=True),
)
POSTPROCESSING_OUTPUTS = (TensorSpec("OUTPUT", "TYPE_STRING", (-1, -1)),)

# How the ensemble feeds the stages (the same wiring as ensemble/config.pbtxt, which the test
# checks); ensemble_stream uses it to run preprocessing's logic in its own process.
ENSEMBLE_TO_PREPROCESSING = {
    "QUERY": "INPUT_0",
    "REQUEST_OUTPUT_LEN": "INPUT_1",
    "BAD_WORDS_DICT": "INPUT_2",
    "STOP_WORDS_DICT": "INPUT_3",
    "suffix": "suffix",
    "token_healing": "token_healing",
}
PREPROCESSING_TO_MODEL_STAGE = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "BAD_WORDS_IDS": "bad_words_list",
    "STOP_WORDS_IDS": "stop_words_list",
    "HELD_BACK_ID": "held_back_id",
}

# Every model's declared I/O, for the config check.
# Not a request option: a control input (TensorRT-LLM's convention). A request with `stop` true
# and the request id of a request still generating stops that generation: the ensemble passes
# it to the model stage, and the streaming model takes it itself; each answers it at once.
STOP_INPUT = _scalar(
    "stop",
    "TYPE_BOOL",
    doc="not in the FasterTransformer contract: true stops the request with this request id",
)

MODEL_IO = {
    ENSEMBLE_MODEL: ((*ENSEMBLE_INPUTS, STOP_INPUT), (*ENSEMBLE_OUTPUTS, *RESULT_OUTPUTS)),
    STREAM_MODEL: ((*ENSEMBLE_INPUTS, STOP_INPUT), (*STREAM_OUTPUTS, *RESULT_OUTPUTS)),
    PREPROCESSING_MODEL: (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS),
    MODEL_STAGE: ((*MODEL_STAGE_INPUTS, STOP_INPUT), (*MODEL_STAGE_OUTPUTS, *RESULT_OUTPUTS)),
    POSTPROCESSING_MODEL: (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS),
}
INPUT_SPECS = {spec.name: spec for spec in (*ENSEMBLE_INPUTS, STOP_INPUT)}

# The one model that hosts the engine (decoupled): one copy of the weights, one running batch
# for every path. A stream reaches it with the ensemble's inputs (the prompt as text), directly
# or through `ensemble_stream`: it tokenizes, generates and detokenizes in its own process, one
# response per piece of text, then a final one with the account. The unary model stage `gptj`
# calls it (BLS: HTTP and unary gRPC refuse an ensemble with a decoupled step) with its own
# inputs, the model stage's typed tensors, once it has checked them, and gets one final
# response in the model stage's layout.
ENGINE_MODEL = "engine"
_GPTJ_CALL = (
    "gptj's call, these and the options above: the model stage's inputs as gptj got and checked"
    " them; answered with one final response in the model stage's layout"
)
_STAGE_ONLY = [spec for spec in MODEL_STAGE_INPUTS if spec not in ENSEMBLE_INPUTS]
ENGINE_INPUTS = (
    *(
        TensorSpec(spec.name, spec.triton_type, spec.dims, optional=True, doc=spec.doc)
        for spec in ENSEMBLE_INPUTS
    ),
    STOP_INPUT,
    *(
        TensorSpec(
            spec.name, spec.triton_type, spec.dims, optional=True, doc=_GPTJ_CALL if i == 0 else ""
        )
        for i, spec in enumerate(_STAGE_ONLY)
    ),
)
# A stream's outputs (as `ensemble_stream` declares them), then the model stage's token ids.
ENGINE_OUTPUTS = (
    *STREAM_OUTPUTS,
    MODEL_STAGE_OUTPUTS[0],
    *RESULT_OUTPUTS,
)
MODEL_IO[ENGINE_MODEL] = (ENGINE_INPUTS, ENGINE_OUTPUTS)
