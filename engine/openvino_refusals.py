"""What OpenVINO GenAI's pipeline cannot honour the FasterTransformer way, refused by name with
what to send instead (engine/fallback.py runs such requests on the torch engine)."""

from __future__ import annotations

from engine.interface import GenerationRequest, NotHonouredError
from engine.openvino_log_probs import effective_temperature
from engine.openvino_model import ModelShape


def bans_only_the_end(request: GenerationRequest, shape: ModelShape) -> bool:
    """Whether the request's bad words are only its end token (FasterTransformer clients
    ban it to get answers of full length): honoured by ``min_new_tokens``, which holds the
    end token back until ``max_new_tokens``."""
    end_id = request.end_token(shape.vocab_size, shape.eos_token_id)
    return bool(request.bad_words) and all(list(w) == [end_id] for w in request.bad_words)


def refuse_what_cannot_be_honoured(request: GenerationRequest, shape: ModelShape) -> None:
    """Raise NotHonouredError, naming the option and what to send instead."""
    elsewhere = 'or set fallback "torch" or backend "torch" (engine/config.pbtxt)'
    if request.bad_words and not bans_only_the_end(request, shape):
        raise NotHonouredError(
            "bad_words_list is not supported by the openvino backend beyond the end token "
            "(OpenVINO GenAI has no banned-token list): send the request without bad words, "
            f"or with only the end token, {elsewhere}",
            "bad_words",
        )
    if request.beam.width > 1 and request.beam.diversity_rate != 0.0:  # no beams: no rate
        raise NotHonouredError(
            "beam_search_diversity_rate is not supported by the openvino backend (its "
            "diversity is between beam groups, not FasterTransformer's rank penalty): send "
            f"0, {elsewhere}",
            "beam_diversity",
        )
    if request.beam.width > 1 and request.stop_words:
        raise NotHonouredError(
            "stop words with beam_width > 1 are not supported by the openvino backend: send "
            f"the beam search without stop words, {elsewhere}",
            "beam_stop_words",
        )
    sampling = request.sampling
    if (
        request.beam.width > 1
        and request.return_log_probs
        and (effective_temperature(sampling) != 1.0 or sampling.repetition_penalty != 1.0)
    ):
        raise NotHonouredError(
            "is_return_log_probs with beam_width > 1 under a temperature or "
            "repetition_penalty other than 1.0 is not supported by the openvino backend (its "
            "beams report the model's own log probs): ask with temperature 1 and "
            f"repetition_penalty 1, or without log probs, {elsewhere}",
            "log_probs",
        )
