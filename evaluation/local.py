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

from contract.model_tokens import prompt_head
from engine import ModelShape


class LocalModel:
    """Greedy completions of ``checkpoint`` by transformers on the CPU at float32."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        self.checkpoint = Path(checkpoint)
        self.shape = ModelShape.read(self.checkpoint)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint))
        self.model = AutoModelForCausalLM.from_pretrained(
            str(self.checkpoint), dtype=torch.float32
        ).eval()

    def complete(
        self, prompt: str, max_tokens: int, stops: Sequence[str], ends: Sequence[int] = ()
    ) -> str:
        """The greedy continuation of ``prompt``, generation stopped at the first stop (the
        caller cuts the text there), or at one of ``ends`` besides the end token (a chat
        template's end of turn, a stop word on the server)."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        # the BOS first, as preprocessing puts it (Gemma, Llama 2): the same tokens the server runs
        head = prompt_head(self.tokenizer, self.checkpoint)
        ids = head + self.tokenizer.encode(prompt, add_special_tokens=False)
        start = len(ids)
        decode = self.decode

        class _AtStop(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> bool:
                text = decode(input_ids[0, start:].tolist())
                return any(stop in text for stop in stops)

        batch = torch.tensor([ids])
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
            )
        return decode(out[0, start:].tolist())

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
