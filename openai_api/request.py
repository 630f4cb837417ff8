"""An OpenAI completions request, checked and turned into the client library's requests.

OpenAI semantics are mapped onto the contract as they are, not approximated: sampling is the
default (temperature 1, top_p 1 = the whole distribution), temperature 0 is greedy search, and
an option the engine has no honest equivalent for is refused with a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from client import ENSEMBLE_MODEL, STREAM_MODEL, CompletionRequest, InvalidRequestError
from contract.tensors import ENSEMBLE_INPUTS
from openai_api.errors import CONTRACT_TO_OPENAI, OpenAIError, bad_option, from_invalid_request
from openai_api.repo_context import ContextChunk, parse_chunks

# Editor stop rules, extensions under llama.cpp's names (contract.options.EditorStops): what
# each must be, and its neutral value.
EDITOR_FIELDS = {
    "single_line": ((bool,), "true or false", False),
    "n_indent": ((int,), "an integer >= 0 (columns; 0: off)", 0),
    "t_max_predict_ms": ((int,), "an integer >= 0 (milliseconds; 0: no budget)", 0),
}

# The one name GET /v1/models lists (clients that pick the first model get it), and the names
# it also answers to: Triton's own names for the two completion pipelines.
MODEL_NAME = "codegen"
MODEL_ALIASES = (ENSEMBLE_MODEL, STREAM_MODEL)
COMPLETION_MODELS = (MODEL_NAME, *MODEL_ALIASES)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default
# The contract's options (as the ensemble and the client library name them) that this API reads
# under the same name; every other one it refuses by name instead of ignoring it, so an option
# added to the contract is refused here until the API maps an OpenAI field onto it.
READ_AS_NAMED = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "suffix"}
    | set(EDITOR_FIELDS)
    | {"token_healing"}
)
CONTRACT_ONLY = (
    frozenset({spec.name for spec in ENSEMBLE_INPUTS})
    | frozenset({f.name for f in fields(CompletionRequest) if f.init})
) - READ_AS_NAMED


@dataclass(frozen=True)
class CompletionJob:
    """A checked request: one :class:`CompletionRequest` per choice, choice ``i`` of prompt
    ``p`` at index ``p * n + i`` as OpenAI numbers them."""

    model: str
    prompts: tuple[str, ...]
    suffix: str
    n: int
    requests: tuple[CompletionRequest, ...]
    stops: tuple[str, ...]
    echo: bool
    logprobs: bool
    stream: bool
    include_usage: bool
    max_tokens: int  # as asked: 0 for a warm-up (its requests compute one token)
    chunks: tuple[ContextChunk, ...] = ()  # repository context (input_extra)

    @property
    def warm_only(self) -> bool:
        """``max_tokens`` 0: the prompt only fills the prefix cache; nothing is answered."""
        return self.max_tokens == 0

    def prompt_of(self, index: int) -> str:
        return self.prompts[index // self.n]


def _option(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str, default: Any):
    """``body[name]`` if it has one of ``kinds`` (null = the default), else a 400 naming it."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad_option(name, f"{name} must be {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise bad_option(name, f"{name} must be {what}, got {value!r}")
    return value


def _prompts(body: dict[str, Any]) -> tuple[str, ...]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_option("prompt", "prompt is required: the text to complete")
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    raise bad_option(
        "prompt",
        "prompt must be a string or a non-empty list of strings (token-id prompts are not "
        "supported: send the text)",
    )


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
        raise bad_option("stop", "stop must be a non-empty string or a list of them")
    return tuple(stops)


def editor_options(body: dict[str, Any]) -> dict[str, Any]:
    """The editor stop rules a body sets (``/v1/completions`` and ``/infill`` alike)."""
    return {name: _option(body, name, *spec) for name, spec in EDITOR_FIELDS.items()}


def _refuse_contract_only(body: dict[str, Any]) -> None:
    """A field named as the model server's contract names an option this API does not take."""
    named = sorted(CONTRACT_ONLY & body.keys())
    if named:
        hint = CONTRACT_TO_OPENAI.get(named[0])
        instead = f"use {hint}" if hint else "use the client library or Triton, or leave it out"
        raise bad_option(
            named[0], f"{named[0]} is not an option of this OpenAI-compatible API ({instead})"
        )


def _refuse_unless_neutral(body: dict[str, Any]) -> None:
    """Options the engine has no honest equivalent for: accepted only at their neutral value."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = _option(body, name, (int, float), "a number", 0)
        if value != 0:
            raise bad_option(
                name,
                f"{name} is not supported (the engine has no additive {name.split('_')[0]} "
                "penalty); leave it at 0, or use repetition_penalty (the multiplicative "
                "CTRL penalty, > 1 discourages repeats)",
            )
    if body.get("logit_bias"):
        raise bad_option("logit_bias", "logit_bias is not supported; leave it out")


def parse_completion(
    body: Any, path_model: str | None = None, max_choices: int = 16
) -> CompletionJob:
    """Check an OpenAI completions body and build its requests; a 400 (or 404 for an unknown
    model) names what to change."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    _refuse_contract_only(body)
    if path_model is not None:
        # Copilot-style plugins name their own engine (e.g. copilot-codex): any engine in the
        # path means the completion ensemble
        model = path_model if path_model in COMPLETION_MODELS else MODEL_NAME
    else:
        model = _option(body, "model", (str,), "a string", MODEL_NAME)
    if model not in COMPLETION_MODELS:
        raise OpenAIError(
            404,
            f"the model {model!r} does not exist or does not complete text: use "
            f"{MODEL_NAME!r} (GET /v1/models lists it)",
            param="model",
            code="model_not_found",
        )
    prompts = _prompts(body)
    # fill in the middle: the text after the cursor, the same for every prompt ("" = none)
    suffix = _option(body, "suffix", (str,), "a string (the text after the cursor)", "")
    n = _option(body, "n", (int,), "a positive integer", 1)
    if n < 1 or n * len(prompts) > max_choices:
        raise bad_option(
            "n", f"n must be at least 1 and n x prompts at most {max_choices}, got n={n}"
        )
    best_of = _option(body, "best_of", (int,), "an integer", n)
    if best_of != n:
        raise bad_option(
            "best_of", "best_of other than n is not supported; leave it out or set it to n"
        )
    _refuse_unless_neutral(body)
    logprobs = _option(body, "logprobs", (int,), "an integer from 0 to 5", None)
    if logprobs is not None and logprobs != 0:
        raise bad_option(
            "logprobs",
            "logprobs above 0 is not supported: the engine returns the log probability of each "
            "generated token, not the alternatives (top_logprobs); use logprobs=0",
        )
    echo = _option(body, "echo", (bool,), "true or false", False)
    if echo and logprobs is not None:
        raise bad_option(
            "echo",
            "echo with logprobs is not supported (it needs the prompt's log probabilities, "
            "which the engine does not compute); drop one of them",
        )
    stream = _option(body, "stream", (bool,), "true or false", False)
    stream_options = _option(body, "stream_options", (dict,), "an object", None)
    if stream_options is not None and not stream:
        raise bad_option("stream_options", "stream_options is only allowed with stream: true")
    include_usage = bool((stream_options or {}).get("include_usage", False))
    stops = _stops(body)
    max_tokens = _option(body, "max_tokens", (int,), "an integer >= 0", DEFAULT_MAX_TOKENS)
    if max_tokens == 0 and (stream or echo or logprobs is not None):
        raise bad_option(
            "max_tokens",
            "max_tokens 0 only fills the prompt cache and answers nothing: send it without "
            "stream, echo and logprobs",
        )
    chunks = parse_chunks(body)
    if chunks and len(prompts) > 1:
        raise bad_option(
            "input_extra",
            "input_extra (repository context) goes before one prompt: send one prompt with it",
        )
    sampling = {
        "temperature": float(_option(body, "temperature", (int, float), "a number >= 0", 1.0)),
        "top_p": float(_option(body, "top_p", (int, float), "a number in [0, 1]", 1.0)),
        # extensions beyond OpenAI's options (as vLLM has them): top-k and the CTRL penalty
        "top_k": _option(body, "top_k", (int,), "an integer >= 0", 0),
        "repetition_penalty": float(
            _option(body, "repetition_penalty", (int, float), "a number > 0", 1.0)
        ),
    }
    seed = _option(body, "seed", (int,), "an integer", None)
    editor = editor_options(body)
    # an extension: false sends the prompt's last token as it is (absent: the server's default)
    healing = _option(body, "token_healing", (bool,), "true or false", None)
    try:
        requests = tuple(
            CompletionRequest(
                (prompt,),
                max_tokens=max_tokens or 1,  # a warm-up computes one token, not returned
                seed=None if seed is None else (seed + i) % 2**64 if seed >= 0 else seed,
                stop_words=stops,
                return_log_probs=logprobs is not None,
                suffix=suffix,
                token_healing=healing,
                **sampling,
                **editor,
            )
            for prompt in prompts
            for i in range(n)
        )
    except InvalidRequestError as exc:
        raise from_invalid_request(exc) from None
    return CompletionJob(
        model=model,
        prompts=prompts,
        suffix=suffix,
        n=n,
        requests=requests,
        stops=stops,
        echo=echo,
        logprobs=logprobs is not None,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        chunks=chunks,
    )
