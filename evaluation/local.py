"""The same checkpoint run alone: transformers' ``generate`` at float32, greedy, batch of one.

It is the reference the served completions are compared with, so it copies what the server
does to a prompt and nothing more: the checkpoint's own tokenizer without special tokens
added (as ``preprocessing`` encodes), the end token the engine stops at, the same stops
(generation ends once one appears; the text is cut at the first), the same token budget.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from contract.healing import ORIGINAL_BIAS, TokenExtensions
from contract.model_tokens import prompt_head
from engine import ModelShape


class LocalModel:
    """Greedy completions of ``checkpoint`` by transformers on the CPU at float32.

    ``healing``: token healing as the server does it (docs/generation.md#token-healing): the
    prompt's last token held back by the same rule (contract/healing.py, on the same token
    texts) and the first generated token masked to the tokens that start with its text, + 1 on
    the held-back one, through transformers' own ``logits_processor`` hook. transformers'
    ``token_healing=True`` is not used: it strips and re-tokenizes the prompt (the differences
    are listed in docs/generation.md), so it answers another prompt than the server's.
    """

    def __init__(self, checkpoint: Path, healing: bool = False) -> None:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        from preprocessing.token_texts import tokenizer_texts

        self.checkpoint = Path(checkpoint)
        self.shape = ModelShape.read(self.checkpoint)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint))
        self.model = AutoModelForCausalLM.from_pretrained(
            str(self.checkpoint), dtype=torch.float32
        ).eval()
        self.extensions = (
            TokenExtensions(tokenizer_texts(self.tokenizer), self.tokenizer.all_special_ids)
            if healing
            else None
        )

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        stops: Sequence[str],
        ends: Sequence[int] = (),
        heal: bool = True,
    ) -> str:
        """The greedy continuation of ``prompt``, generation stopped at the first stop (the
        caller cuts the text there), or at one of ``ends`` besides the end token (a chat
        template's end of turn, a stop word on the server). ``heal``: token healing when the
        model was loaded with it (off for chat, as the server does)."""
        # the BOS first, as preprocessing puts it (Gemma, Llama 2): the same tokens the server runs
        head = prompt_head(self.tokenizer, self.checkpoint)
        ids = head + self.tokenizer.encode(prompt, add_special_tokens=False)
        allowed = self._healed(ids, len(head)) if heal else ()
        if not allowed:
            return self.generate(ids, max_tokens, stops, ends)
        text = self.text_after(ids[:-1], ids[-1])
        return self.generate(ids[:-1], max_tokens, stops, ends, allowed, text)

    def generate(
        self,
        ids: Sequence[int],
        max_tokens: int,
        stops: Sequence[str],
        ends: Sequence[int] = (),
        allowed: Sequence[int] = (),
        text: Callable[[list[int]], str] | None = None,
    ) -> str:
        """The greedy continuation of the token ids ``ids``, as ``text`` reads the generated
        ids (default: decoded alone), stopped at the first stop or end. ``allowed``: what the
        first token may be (token healing), the held-back token first."""
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        start, completion = len(ids), text or self.decode

        class _AtStop(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> bool:
                text = completion(input_ids[0, start:].tolist())
                return any(stop in text for stop in stops)

        processors = LogitsProcessorList([FirstTokenMask(start, allowed)] if allowed else [])
        batch = torch.tensor([list(ids)])
        with torch.inference_mode():
            out = self.model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                max_new_tokens=max_tokens,
                do_sample=False,
                num_beams=1,
                top_k=None,
                top_p=None,
                temperature=None,
                repetition_penalty=1.0,
                eos_token_id=[self.shape.eos_token_id, *ends],
                pad_token_id=self.shape.eos_token_id,
                stopping_criteria=StoppingCriteriaList([_AtStop()]),
                logits_processor=processors,
            )
        return completion(out[0, start:].tolist())

    def _healed(self, ids: list[int], head: int) -> tuple[int, ...]:
        """The tokens the first one may be when healing holds ``ids``' last token back (that
        token first), as preprocessing decides it; () when nothing is held back."""
        if self.extensions is None or not ids:
            return ()
        if len(ids) - head > 1 or head:
            allowed = self.extensions.allowed(ids[-1])
            return allowed if len(allowed) > 1 else ()
        return ()

    def text_after(self, kept: list[int], held: int) -> Callable[[list[int]], str]:
        """The text after the user's prompt, as the server returns it: the kept prompt and the
        generated tokens decoded together, the whole prompt's text (``held`` included) cut
        off; the first generated token starts with the held-back text by the mask."""
        user = len(self.decode([*kept, held]))

        def completion(generated: list[int]) -> str:
            return self.decode(kept + generated)[user:]

        return completion

    def decode(self, ids: list[int]) -> str:
        """As ``postprocessing`` decodes: special tokens dropped, spaces kept as they are."""
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def complete_all(
        self,
        requests: Sequence[tuple[str, int, Sequence[str]]],
        progress: Callable[[], None] | None = None,
    ) -> list[str]:
        """Completions of (prompt, max_tokens, stops), one after another."""
        answers = []
        for prompt, max_tokens, stops in requests:
            answers.append(self.complete(prompt, max_tokens, stops))
            if progress is not None:
                progress()
        return answers


class FirstTokenMask:
    """transformers' logits-processor hook: at the first generated position, every token but
    ``allowed`` masked out and + ``ORIGINAL_BIAS`` on the held-back one (``allowed[0]``), as
    the torch engine's sampler does (engine/sampling.py)."""

    def __init__(self, start: int, allowed: Sequence[int]) -> None:
        self.start = start
        self.allowed = torch.tensor(list(allowed))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] != self.start:
            return scores
        masked = torch.full_like(scores, float("-inf"))
        masked[:, self.allowed] = scores[:, self.allowed]
        masked[:, self.allowed[0]] += ORIGINAL_BIAS
        return masked


def describe_checkpoint(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's path, model_type, shape and parameter count (read from the safetensors
    headers, so nothing is loaded)."""
    checkpoint = Path(checkpoint)
    info: dict[str, Any] = {"checkpoint": str(checkpoint)}
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return {**info, "error": "no readable config.json"}
    info["model_type"] = config.get("model_type")
    info["name"] = config.get("_name_or_path") or config.get("_model_name_or_path")
    try:
        shape = ModelShape.read(checkpoint)
        info.update(
            layers=shape.n_layer, width=shape.n_embd, context=shape.context, vocab=shape.vocab_size
        )
    except Exception as exc:  # a family the engine does not serve: still describe it
        info["shape_error"] = str(exc)
    info["parameters"] = safetensors_parameters(checkpoint)
    try:
        build = json.loads((checkpoint / "build.json").read_text())
        info["name"] = build.get("name") or info["name"]
    except (OSError, ValueError):
        pass
    return info


def safetensors_parameters(checkpoint: Path) -> int | None:
    """The number of weights in the checkpoint's ``*.safetensors`` files (their headers)."""
    total = 0
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    for path in files:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total if files else None
