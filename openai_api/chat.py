"""OpenAI's chat completions (``POST /v1/chat/completions``) on the completion path.

The messages become one prompt, rendered once by the checkpoint's own chat template
(:mod:`contract.chat`), which then runs exactly as a completion does (:func:`parse_completion`
checks the options, :mod:`openai_api.generation` generates, unary or streamed): the same
engine, batch, prefix cache and cancellation. The end of a turn is a stop word. The template is
read from the checkpoint the API has at hand (``--checkpoint``), and only once its tokenizer has
been checked to be the served one (:class:`openai_api.prompt_counter.PromptCounter`).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contract.chat import COMPLETIONS_ROUTE, TOOL_FIELDS, ChatError, ChatTemplate, no_template
from contract.model_tokens import prompt_head
from openai_api.completions import CLIENT_CLOSED_REQUEST, ClientLeftError, run_choices
from openai_api.dependencies import Authorized
from openai_api.errors import OpenAIError, bad_option
from openai_api.generation import Backend, ChoiceResult, model_context
from openai_api.repo_context import FittedContext
from openai_api.request import MODEL_NAME, CompletionJob, parse_completion
from openai_api.routes import read_json
from openai_api.shapes import job_usage
from openai_api.streaming import CompletionChunks, stream_completion

router = APIRouter()
# completions' own fields: a chat body names none of them
COMPLETION_ONLY = ("prompt", "suffix", "echo", "best_of", "input_extra")


class ChatSource:
    """The served checkpoint's chat template, loaded once from the API's checkpoint after its
    tokenizer was checked against the server's count."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._loaded = False
        self._template: ChatTemplate | None = None

    def _load(self) -> ChatTemplate | None:
        from transformers import PreTrainedTokenizerFast

        checkpoint = self.backend.counter.checkpoint
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(checkpoint))
        return ChatTemplate.of(tokenizer, prompt_head(tokenizer, checkpoint))

    def available(self) -> bool:
        """Whether the served model chats (blocking: the first call checks the tokenizer)."""
        if not self.backend.counter.usable(self.backend.client()):
            return False
        with self._lock:
            if not self._loaded:
                self._template, self._loaded = self._load(), True
        return self._template is not None

    def template(self) -> ChatTemplate:
        """The template, or a 400 saying why the model cannot chat."""
        if not self.available():
            if self.backend.counter.state != "verified":
                raise OpenAIError(
                    400,
                    "chat needs the served checkpoint's tokenizer at hand to render its chat "
                    f"template, and this API has none (start it with --checkpoint, the folder "
                    f"Triton serves); send plain text to {COMPLETIONS_ROUTE}",
                    param="messages",
                    code="model_not_chat",
                )
            raise OpenAIError(400, no_template(MODEL_NAME), param="messages", code="model_not_chat")
        assert self._template is not None
        return self._template

    def count(self, prompt: str) -> int:
        return self.backend.counter.count(prompt)


class ChatChunks(CompletionChunks):
    """``chat.completion.chunk``: the role first, then content deltas."""

    object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def opening(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def choice(self, index: int, text: str, result: ChoiceResult | None) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"content": text} if text or result is None else {},
            "logprobs": None,
            "finish_reason": result.finish_reason if result else None,
        }


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """What a text-only template cannot honour, refused by name rather than dropped."""
    for name in TOOL_FIELDS:
        if body.get(name) not in (None, [], "none"):
            raise bad_option(name, f"{name}: tool calls are not supported; leave it out")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise bad_option(
            "response_format",
            "response_format is not supported (no JSON mode or schema): leave it out or send "
            '{"type": "text"}',
        )
    if body.get("logprobs") or body.get("top_logprobs"):
        name = "logprobs" if body.get("logprobs") else "top_logprobs"
        raise bad_option(name, f"{name} is not supported on chat; leave it out")
    for name in ("audio", "modalities", "prediction", "web_search_options"):
        if body.get(name) not in (None, ["text"]):
            raise bad_option(name, f"{name} is not supported (text chat only); leave it out")
    for name in COMPLETION_ONLY:
        if name in body:
            raise bad_option(
                name, f"{name} is a field of {COMPLETIONS_ROUTE}, not of chat; leave it out"
            )


def parse_chat(
    body: Any, chat: ChatTemplate, count: Any, context: int | None, max_choices: int = 16
) -> CompletionJob:
    """Check a chat body and build its completion job: the rendered prompt, the options as a
    completion takes them, the end of a turn as a stop word. ``count``: prompt tokens as the
    server counts them; ``context``: the model's, for the default ``max_tokens`` (the rest)."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    _refuse_unsupported(body)
    try:
        prompt = chat.prompt(body.get("messages"))
    except ChatError as exc:
        raise bad_option(exc.param, str(exc)) from None
    completion = {k: v for k, v in body.items() if k not in ("messages", "logprobs")}
    completion.pop("top_logprobs", None)
    completion.pop("max_completion_tokens", None)
    completion["prompt"] = prompt
    asked = body.get("max_completion_tokens")
    asked = body.get("max_tokens") if asked is None else asked
    if asked is None and context is not None:  # as OpenAI's: up to the end of the context
        room = context - count(prompt)
        if room < 1:
            raise OpenAIError(
                413,
                f"the conversation is {count(prompt)} tokens, which leaves no room in the "
                f"model's context of {context}: drop or shorten messages",
                param="messages",
                code="context_length_exceeded",
            )
        asked = room
    completion["max_tokens"] = asked
    if asked == 0:
        raise bad_option("max_tokens", "max_tokens must be at least 1 for a chat answer")
    job = parse_completion(completion, None, max_choices)
    # every choice also stops at the end of a turn, on tokens (the engine's stop words); it is
    # a special token, so the text never shows it and job.stops (matched on text) leave it out.
    # Token healing is off: the prompt ends in the template's generation prompt, a boundary
    # the model was trained on, not in the user's half-typed text
    requests = tuple(
        replace(r, stop_words=(*r.stop_words, *chat.stops), token_healing=False)
        for r in job.requests
    )
    return replace(job, requests=requests)


def _message(result: ChoiceResult, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": None,
        "finish_reason": result.finish_reason,
    }


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request, api: Authorized) -> Response:
    """OpenAI's chat completions (streamed as ``chat.completion.chunk`` with ``"stream":
    true``), through the checkpoint's chat template."""
    body = await read_json(request)
    source: ChatSource = api.chat
    chat = await api.call(source.template)
    context = model_context(api.backend.counter.checkpoint)
    job = await api.call(parse_chat, body, chat, source.count, context, api.settings.max_choices)
    api.slots.acquire()
    if job.stream:
        empty = FittedContext(job.prompts[0], 0, 0, None)
        return await stream_completion(api, request, job, empty, ChatChunks())
    try:
        # streamed even when whole: the template's special tokens are not in the unary
        # ensemble's text (skipped by its detokenizer), so only a stream's pieces are the answer
        results = await run_choices(api, request, job.requests, job.stops, streamed=True)
    except ClientLeftError:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        api.slots.release()
    return JSONResponse(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": job.model,
            "choices": [_message(result, i) for i, result in enumerate(results)],
            "usage": job_usage(job, results),
        }
    )
