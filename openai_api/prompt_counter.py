"""The served checkpoint's tokenizer, at hand in the API only once it has been checked against
the server's own count: chat renders its template with it and counts a rendered prompt's
tokens. Completions need none of it (the engine reports its own counts, contract/finish.py)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from client import CodegenClient, CodegenError, CompletionRequest, ServerUnavailableError
from contract.model_tokens import prompt_head

log = logging.getLogger("openai_api")
PROBE_PROMPT = 'def probe(x):\n    """Ünïcode ✓ and\ttabs."""\n    return x  # 1234\n'


class PromptCounter:
    """Counts prompt tokens with the served checkpoint's tokenizer, once it has been checked
    against the server's own count (a streamed probe request)."""

    def __init__(self, checkpoint: Path | None) -> None:
        self.checkpoint = checkpoint
        self._tokenizer: Any = None
        self._head = 0  # tokens the tokenizer puts before a prompt (contract.model_tokens)
        self._state = "unchecked"  # then "verified" or "unavailable"
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        return self._state

    def count(self, prompt: str) -> int:
        """As preprocessing counts: the text's tokens and what the tokenizer puts before any
        prompt (a BOS)."""
        return len(self._tokenizer.encode(prompt, add_special_tokens=False)) + self._head

    def usable(self, client: CodegenClient) -> bool:
        """Whether the tokenizer is the served one (checked once, on first use)."""
        if self._state != "unchecked":
            return self._state == "verified"
        with self._lock:
            if self._state == "unchecked":
                self._state = self._check(client)
        return self._state == "verified"

    def _check(self, client: CodegenClient) -> str:
        if self.checkpoint is None or not (self.checkpoint / "config.json").exists():
            log.warning("no checkpoint at %s: no chat template at hand", self.checkpoint)
            return "unavailable"
        try:
            from transformers import PreTrainedTokenizerFast

            self._tokenizer = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint))
            self._head = len(prompt_head(self._tokenizer, self.checkpoint))
        except Exception as exc:
            log.warning("cannot load the tokenizer in %s (%s)", self.checkpoint, exc)
            return "unavailable"
        try:
            # whole: healing would hold the probe's last token back from the engine's count
            request = CompletionRequest(
                (PROBE_PROMPT,), max_tokens=1, temperature=0.0, token_healing=False
            )
            served = client.send(request)[0].prompt_tokens  # the engine's own count
        except ServerUnavailableError:
            raise  # nothing to check against yet: check again on the next request
        except CodegenError as exc:
            log.warning("cannot check the tokenizer against the server (%s)", exc)
            return "unavailable"
        local = self.count(PROBE_PROMPT)
        if served != local:
            log.warning(
                "the tokenizer in %s counts %s prompt tokens where the server counts %s: it is "
                "not the served one",
                self.checkpoint,
                local,
                served,
            )
            return "unavailable"
        log.info("the tokenizer in %s is the served one (checked)", self.checkpoint)
        return "verified"
