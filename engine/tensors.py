"""The model stage's tensors <-> engine requests and results (FasterTransformer GPT-J layout).

Kept apart from the Triton adapter so that unit tests exercise it without a server. Arrays are
per Triton request, batch dimension first: a request may carry several prompts (rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from contract.options import BeamParams, EditorStops, InvalidRequestError, SamplingParams
from contract.tensors import OPTION_DEFAULTS
from contract.words import split_word_list
from engine.interface import GenerationRequest, GenerationResult  # no torch: callers parse too

# Option inputs the engine takes and has no use for, named so that they are told apart from one
# it forgot (tests/test_options_written_once.py). FasterTransformer's start_id begins generation
# when there is no prompt; every prompt here is non-empty and its own ids begin the sequence.
UNUSED_OPTION_INPUTS = frozenset({"start_id"})


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
        beam = BeamParams(
            width=int(_scalar(arrays, "beam_width", row)),
            len_penalty=float(_scalar(arrays, "len_penalty", row)),
            diversity_rate=float(_scalar(arrays, "beam_search_diversity_rate", row)),
        )
        if requests and beam.width != requests[0].beam.width:
            raise InvalidRequestError(
                f"beam_width differs between the prompts of one request ({requests[0].beam.width}"
                f" and {beam.width}): the outputs are [prompt, beam, ...], send one width"
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
                stop_words=split_word_list(stop[row]) if stop is not None else [],
                bad_words=split_word_list(bad[row]) if bad is not None else [],
                beam=beam,
                editor=EditorStops(
                    single_line=bool(_scalar(arrays, "single_line", row)),
                    n_indent=int(_scalar(arrays, "n_indent", row)),
                    t_max_predict_ms=int(_scalar(arrays, "t_max_predict_ms", row)),
                ),
                held_back=_held_back(arrays, row),
            )
        )
    for request in requests:
        request.return_log_probs = return_log_probs
    return requests, return_log_probs


def _held_back(arrays: Mapping[str, np.ndarray], row: int) -> int | None:
    """The row's held-back token (token healing), None when absent or negative."""
    value = arrays.get("held_back_id")
    if value is None:
        return None
    flat = np.asarray(value).reshape(len(value), -1)
    token = int(flat[min(row, len(flat) - 1), 0])
    return token if token >= 0 else None


def parse_request(
    arrays: Mapping[str, np.ndarray], stream: bool
) -> tuple[list[GenerationRequest], bool]:
    """``requests_from_tensors`` plus what streaming allows: one prompt, no beams."""
    rows, log_probs = requests_from_tensors(arrays)
    if stream and len(rows) != 1:
        raise InvalidRequestError(f"streaming takes one prompt per request, got {len(rows)}")
    if stream and rows[0].beam.width > 1:
        raise InvalidRequestError(
            f"beam_width={rows[0].beam.width} cannot stream: beams are ranked only once they "
            "finish; send it to the unary `ensemble` instead"
        )
    return rows, log_probs


def tensors_from_results(
    results: list[GenerationResult], return_log_probs: bool, beam_width: int = 1
) -> dict[str, np.ndarray]:
    """output_ids [N, beam, T], sequence_length [N, beam], cum_log_probs [N, beam],
    output_log_probs [N, beam, G]: prompt + generated ids per beam, padded with 0 past each
    beam's sequence_length, beams best first (beam 1 without beam search).

    Log probs are zeros unless ``is_return_log_probs`` was set, except a beam search's
    cum_log_probs, which rank its beams and are always given.
    """
    rows = [_beams(r) for r in results]
    width = max(beam_width, *(len(beams) for beams in rows))
    searched = any(r.beams is not None for r in results)
    sequences = [
        [r.prompt_ids + ids for ids, _, _ in beams] for r, beams in zip(results, rows, strict=True)
    ]
    longest = max(len(seq) for seqs in sequences for seq in seqs)
    generated = max(1, *(len(ids) for beams in rows for ids, _, _ in beams))
    output_ids = np.zeros((len(results), width, longest), dtype=np.uint32)
    lengths = np.zeros((len(results), width), dtype=np.uint32)
    cum_log_probs = np.zeros((len(results), width), dtype=np.float32)
    log_probs = np.zeros((len(results), width, generated), dtype=np.float32)
    for i, (result, beams) in enumerate(zip(results, rows, strict=True)):
        # a search that ended with fewer finished beams than its width (every other token
        # banned): the missing ones are the prompt alone, with a log prob of -inf
        cum_log_probs[i, len(beams) :] = -np.inf if searched else 0.0
        lengths[i, len(beams) :] = len(result.prompt_ids)
        output_ids[i, len(beams) :, : len(result.prompt_ids)] = result.prompt_ids
        for beam, (seq, (_, beam_log_probs, cum)) in enumerate(
            zip(sequences[i], beams, strict=True)
        ):
            output_ids[i, beam, : len(seq)] = seq
            lengths[i, beam] = len(seq)
            if return_log_probs:
                log_probs[i, beam, : len(beam_log_probs)] = beam_log_probs
            if searched:
                cum_log_probs[i, beam] = cum
    if not searched:
        cum_log_probs = log_probs.sum(axis=-1, dtype=np.float32)
    return {
        "output_ids": output_ids,
        "sequence_length": lengths,
        "cum_log_probs": cum_log_probs,
        "output_log_probs": log_probs,
        **result_account(results, width),
    }


def result_account(results: Sequence[GenerationResult], width: int = 1) -> dict[str, np.ndarray]:
    """What happened to each row (contract.tensors.RESULT_OUTPUTS): finish_reason and
    completion_tokens [N, beam] (a beam search's missing beams: its own reason, 0 tokens),
    prompt_tokens [N, 1] (the prompt the engine ran)."""
    reasons = np.empty((len(results), width), dtype=np.object_)
    completion = np.zeros((len(results), width), dtype=np.uint32)
    for i, result in enumerate(results):
        reasons[i, :] = result.finish_reason.encode()
        for beam, (ids, reason) in enumerate(_ends(result)):
            reasons[i, beam] = reason.encode()
            completion[i, beam] = len(ids)
    prompt = np.array([[len(r.prompt_ids)] for r in results], dtype=np.uint32)
    return {"finish_reason": reasons, "prompt_tokens": prompt, "completion_tokens": completion}


def _ends(result: GenerationResult) -> list[tuple[list[int], str]]:
    if result.beams is None:
        return [(result.output_ids, result.finish_reason)]
    return [(b.output_ids, b.finish_reason) for b in result.beams]


def _beams(result: GenerationResult) -> list[tuple[list[int], list[float], float]]:
    """(generated ids, their log probs, cumulative log prob) of each beam, best first."""
    if result.beams is None:
        return [(result.output_ids, result.log_probs, sum(result.log_probs))]
    return [(b.output_ids, b.log_probs, b.cum_log_prob) for b in result.beams]
