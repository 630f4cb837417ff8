"""The model stage's tensors <-> engine requests and results (FasterTransformer GPT-J layout).

Kept apart from the Triton adapter so that unit tests exercise it without a server. Arrays are
per Triton request, batch dimension first: a request may carry several prompts (rows).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from contract.options import InvalidRequestError, SamplingParams
from contract.tensors import OPTION_DEFAULTS
from contract.words import split_word_list
from engine.engine import GenerationRequest, GenerationResult


def _scalar(arrays: Mapping[str, np.ndarray], name: str, row: int):
    value = arrays.get(name)
    if value is None:
        return OPTION_DEFAULTS[name]
    flat = np.asarray(value).reshape(len(value), -1)
    return flat[min(row, len(flat) - 1), 0].item()


def requests_from_tensors(arrays: Mapping[str, np.ndarray]) -> tuple[list[GenerationRequest], bool]:
    """One GenerationRequest per row, and whether log probs were asked for.

    Raises InvalidRequestError naming the input for anything the engine cannot honour.
    """
    input_ids = np.asarray(arrays["input_ids"])
    lengths = np.asarray(arrays["input_lengths"]).reshape(len(input_ids), -1)[:, 0]
    output_len = np.asarray(arrays["request_output_len"]).reshape(len(input_ids), -1)[:, 0]
    stop = arrays.get("stop_words_list")
    bad = arrays.get("bad_words_list")
    requests = []
    return_log_probs = False
    for row in range(len(input_ids)):
        beam_width = int(_scalar(arrays, "beam_width", row))
        if beam_width != 1:
            raise InvalidRequestError(
                f"beam_width={beam_width} is not supported: this server does sampling and greedy "
                "search only (beam_width=1)"
            )
        if not 0 < lengths[row] <= input_ids.shape[1]:
            raise InvalidRequestError(
                f"input_lengths[{row}]={lengths[row]} does not fit input_ids of width "
                f"{input_ids.shape[1]}"
            )
        seed = _scalar(arrays, "random_seed", row)
        sampling = SamplingParams(
            top_k=int(_scalar(arrays, "runtime_top_k", row)),
            top_p=float(_scalar(arrays, "runtime_top_p", row)),
            temperature=float(_scalar(arrays, "temperature", row)),
            repetition_penalty=float(_scalar(arrays, "repetition_penalty", row)),
            seed=None if seed is None else int(seed),
        )
        end_id = _scalar(arrays, "end_id", row)
        return_log_probs = return_log_probs or bool(_scalar(arrays, "is_return_log_probs", row))
        requests.append(
            GenerationRequest(
                prompt_ids=input_ids[row, : lengths[row]].astype(np.int64).tolist(),
                max_new_tokens=int(output_len[row]),
                sampling=sampling,
                end_id=None if end_id is None else int(end_id),
                stop_words=split_word_list(stop[row]) if stop is not None else (),
                bad_words=split_word_list(bad[row]) if bad is not None else (),
            )
        )
    return requests, return_log_probs


def tensors_from_results(
    results: list[GenerationResult], return_log_probs: bool
) -> dict[str, np.ndarray]:
    """output_ids [N, 1, T], sequence_length [N, 1], cum_log_probs [N, 1], output_log_probs
    [N, 1, G]: prompt + generated ids per row, padded with 0 past each row's sequence_length.
    Log probs are zeros unless ``is_return_log_probs`` was set."""
    sequences = [r.prompt_ids + r.output_ids for r in results]
    width = max(len(s) for s in sequences)
    generated = max(1, *(len(r.output_ids) for r in results))
    output_ids = np.zeros((len(results), 1, width), dtype=np.uint32)
    log_probs = np.zeros((len(results), 1, generated), dtype=np.float32)
    for i, (seq, result) in enumerate(zip(sequences, results, strict=True)):
        output_ids[i, 0, : len(seq)] = seq
        if return_log_probs:
            log_probs[i, 0, : len(result.log_probs)] = result.log_probs
    return {
        "output_ids": output_ids,
        "sequence_length": np.array([[len(s)] for s in sequences], dtype=np.uint32),
        "cum_log_probs": log_probs.sum(axis=-1, dtype=np.float32),
        "output_log_probs": log_probs,
    }
