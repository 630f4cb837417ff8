"""The pieces of OpenAI's answer shapes that the routes share: usage, logprobs, an SSE event."""

from __future__ import annotations

import json
from typing import Any

from openai_api.generation import ChoiceResult
from openai_api.request import CompletionJob


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs(result: ChoiceResult) -> dict[str, Any] | None:
    """OpenAI's logprobs object, with what the engine knows: each generated token's log
    probability. Token texts, offsets and alternatives are not returned by the ensemble."""
    if result.log_probs is None:
        return None
    return {
        "tokens": None,
        "token_logprobs": list(result.log_probs),
        "top_logprobs": None,
        "text_offset": None,
    }


def job_usage(job: CompletionJob, results: list[ChoiceResult]) -> dict[str, int]:
    """Prompt tokens once per prompt (not once per choice), as OpenAI counts them."""
    prompt = sum(results[p * job.n].prompt_tokens for p in range(len(job.prompts)))
    return usage(prompt, sum(r.completion_tokens for r in results))


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
