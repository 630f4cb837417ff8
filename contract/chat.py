"""Chat messages and the checkpoint's own chat template, rendered once into a plain prompt.

An instruct checkpoint is trained on its template's layout, so a chat request becomes the
prompt that template renders (as transformers renders it, ``add_generation_prompt`` on) and
then runs as any completion does: same engine, batch, cache and cancellation. Duck-typed
(the tokenizer is transformers', passed in) and pure, so the API and the evaluation share it.

Two things the template alone does not settle:

- **BOS.** A template that writes the BOS text itself (Llama 3's ``<|begin_of_text|>``) would
  get a second one from the preprocessing's prompt head (:func:`contract.model_tokens.
  prompt_head`): the rendered text loses its leading BOS where the head adds one, so the
  served ids equal ``apply_chat_template(tokenize=True)``'s.
- **The end of a turn.** A template ends an assistant turn with a special token (ChatML's
  ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``) that is not always the
  checkpoint's end token: it is found by rendering a turn (:func:`end_of_turn`) and is a stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")
COMPLETIONS_ROUTE = "POST /v1/completions"
# What OpenAI's chat takes that a text-only template cannot: refused by name, never dropped.
TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")
MESSAGE_TOOL_FIELDS = ("tool_calls", "function_call", "tool_call_id")
_PROBE_ANSWER = "PROBE-ANSWER-7f3a"  # an assistant turn's text, to find what ends the turn


class ChatError(ValueError):
    """A chat request the template cannot take; ``param`` names the field to change."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


def no_template(model: str) -> str:
    """Why a model without a chat template cannot chat, and what to use instead."""
    return (
        f"the model {model!r} has no chat template (its tokenizer_config.json has no "
        f"chat_template), so it cannot chat: send plain text to {COMPLETIONS_ROUTE}"
    )


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "input_image", "image", "input_audio", "file"):
                raise ChatError(
                    f"{where}.content[{i}] is {kind!r}: images, audio and files are not "
                    "supported (the model reads text only); send text parts"
                )
            else:
                raise ChatError(
                    f'{where}.content[{i}] must be a text part ({{"type": "text", "text": '
                    f'"..."}}), got {part!r:.80}'
                )
        return "".join(texts)
    raise ChatError(
        f"{where}.content must be a string or a non-empty list of text parts, got {content!r:.80}"
    )


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """OpenAI's ``messages``, checked, as the template takes them (``role``, ``content``)."""
    if not isinstance(messages, list) or not messages:
        raise ChatError(
            f"messages must be a non-empty list of {{role, content}} objects, got {messages!r:.80}"
        )
    parsed = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatError(f"{where} must be an object with role and content")
        role = message.get("role")
        tools = [name for name in MESSAGE_TOOL_FIELDS if message.get(name)]
        if tools or role in ("tool", "function"):
            what = tools[0] if tools else f"the role {role!r}"
            raise ChatError(f"{where}: tool calls are not supported ({what}); send text turns")
        if role == "developer":  # OpenAI's newer name for the system turn
            role = "system"
        if role not in ROLES:
            raise ChatError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if "content" not in message or message["content"] is None:
            raise ChatError(f"{where} has no content: send its text")
        parsed.append({"role": role, "content": _text(message["content"], where)})
    return parsed


def render(tokenizer: Any, messages: Sequence[dict[str, str]], head: Sequence[int]) -> str:
    """The prompt the checkpoint's template makes of ``messages`` (generation prompt on),
    less a leading BOS that ``head`` (what preprocessing puts before a prompt) adds again."""
    try:
        text = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
    except Exception as exc:  # the template's own raise_exception (e.g. roles must alternate)
        raise ChatError(f"the model's chat template refused the messages: {exc}") from None
    bos = getattr(tokenizer, "bos_token", None)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if head and bos and list(head) == [bos_id] and text.startswith(bos):
        text = text[len(bos) :]
    return text


def end_of_turn(tokenizer: Any) -> str | None:
    """The special token that ends an assistant turn in the template (None when it ends with
    none), found by rendering one turn and reading what follows its text."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_ANSWER}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:
        return None
    if _PROBE_ANSWER not in text:
        return None
    after = text[text.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", ())}
    added = getattr(tokenizer, "get_added_vocab", None)
    specials |= set(added()) if callable(added) else set()
    found = [(after.find(t), -len(t), t) for t in specials if t and t in after]
    if not found:
        return None
    return min(found)[2]  # the earliest, the longest where two start there


@dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's chat: its tokenizer (transformers'), what preprocessing puts before a
    prompt, and the token that ends a turn."""

    tokenizer: Any
    head: tuple[int, ...]
    end: str | None

    @classmethod
    def of(cls, tokenizer: Any, head: Sequence[int]) -> ChatTemplate | None:
        """The tokenizer's chat, or None when it has no chat template."""
        if not getattr(tokenizer, "chat_template", None):
            return None
        return cls(tokenizer, tuple(head), end_of_turn(tokenizer))

    def prompt(self, messages: Any) -> str:
        """The prompt for OpenAI ``messages`` (checked: :class:`ChatError` names a bad one)."""
        return render(self.tokenizer, parse_messages(messages), self.head)

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop words every chat request carries: the end of a turn."""
        return (self.end,) if self.end else ()
