"""What the served model can do that a client may want to know before asking: whether it takes
a ``suffix`` (fill-in-the-middle), listed by ``GET /v1/models`` as ``"fim"``; and how many
tokens a prompt is, as the server counts it (:func:`count_tokens`, for repository context).

The served checkpoint's tokenizer decides (contract/fim.py), and it is Triton's: the API may run
on another host, with no checkpoint at hand or an older one. So the API asks Triton's own
``preprocessing`` model, over the same gRPC endpoint it completes through, to tokenize an empty
prompt with a one-character suffix: a model with a FIM layout answers with token ids, one
without refuses with contract.fim.NO_FIM. Nothing is generated (the engine is not called), so
the question costs one tokenizer call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from client import resolve_target
from contract.fim import NO_FIM_START
from contract.tensors import PREPROCESSING_INPUTS, PREPROCESSING_MODEL

log = logging.getLogger("openai_api")

ASK_TIMEOUT_S = 10.0
MAX_ROWS = 64  # the preprocessing model's max_batch_size


def _inputs(prompts: list[bytes], suffix: bytes, output_len: int = 1) -> list:
    """The preprocessing model's inputs: one row per prompt, each with ``suffix``, no words."""
    import tritonclient.grpc as grpcclient

    rows = len(prompts)
    values = {
        "QUERY": prompts,
        "REQUEST_OUTPUT_LEN": [output_len] * rows,
        "BAD_WORDS_DICT": [b""] * rows,
        "STOP_WORDS_DICT": [b""] * rows,
        "suffix": [suffix] * rows,
        "token_healing": [False] * rows,  # count every token of the prompt
    }
    inputs = []
    for spec in PREPROCESSING_INPUTS:
        array = np.array(values[spec.name], dtype=spec.numpy_dtype).reshape(rows, 1)
        tensor = grpcclient.InferInput(spec.name, list(array.shape), spec.wire_type)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def count_tokens(client: Any, prompts: Sequence[str], suffix: str) -> list[int]:
    """Each prompt's tokens with ``suffix`` as the served tokenizer counts them (its BOS and
    fill-in-the-middle tokens included), from Triton's ``preprocessing`` model over ``client``
    (a ``tritonclient.grpc.InferenceServerClient``); nothing is generated."""
    import tritonclient.grpc as grpcclient

    counts: list[int] = []
    for start in range(0, len(prompts), MAX_ROWS):
        rows = [p.encode() for p in prompts[start : start + MAX_ROWS]]
        result = client.infer(
            PREPROCESSING_MODEL,
            _inputs(rows, suffix.encode()),
            outputs=[grpcclient.InferRequestedOutput("REQUEST_INPUT_LEN")],
            client_timeout=ASK_TIMEOUT_S,
        )
        counts.extend(int(n) for n in result.as_numpy("REQUEST_INPUT_LEN").reshape(-1))
    return counts


def takes_suffix(triton_url: str, timeout_s: float = ASK_TIMEOUT_S) -> bool | None:
    """Whether the model Triton serves fills in the middle; None when Triton cannot say (not
    reachable, no ``preprocessing`` model, another error)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = _inputs([b""], b"\n")  # an empty prompt before a one-character suffix
    try:
        target = resolve_target(triton_url, "grpc")
        client = grpcclient.InferenceServerClient(target.address, ssl=target.ssl)
    except Exception as exc:
        log.warning("cannot ask %s whether its model takes a suffix: %s", triton_url, exc)
        return None
    try:
        client.infer(
            PREPROCESSING_MODEL,
            inputs,
            outputs=[grpcclient.InferRequestedOutput("REQUEST_INPUT_LEN")],
            client_timeout=timeout_s,
        )
    except Exception as exc:
        message = (exc.message() if isinstance(exc, InferenceServerException) else "") or str(exc)
        if NO_FIM_START in message:
            return False
        log.warning("cannot ask %s whether its model takes a suffix: %s", triton_url, message)
        return None
    finally:
        client.close()
    return True
