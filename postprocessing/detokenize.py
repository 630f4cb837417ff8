"""Token ids back to text, whole (unary) or piece by piece (streaming).

A fill-in-the-middle sequence (the checkpoint's layout, ``contract.fim``) reads as its prefix
then the generated middle: the FasterTransformer contract returns prompt + completion, and the
text before the cursor plus what goes at the cursor is its analogue. No FIM sentinel is ever
part of a text, whole or streamed; nor is what preprocessing put before the prompt (a BOS), nor
an end id of the checkpoint (``contract.model_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from contract.fim import tokenizer_layout
from contract.model_tokens import end_ids, prompt_head


class Postprocessor:
    def __init__(self, tokenizer_path: str | Path) -> None:
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_path))
        self.fim = tokenizer_layout(self.tokenizer)
        self.head = prompt_head(self.tokenizer, tokenizer_path)  # preprocessing put it first
        # An end id other than the engine's ends a sequence as a stop word, so it stays there,
        # last: not shown even where the tokenizer would show it (not a special token).
        self.ends = frozenset(end_ids(tokenizer_path)[1:])
        self.hidden = self.fim.sentinels if self.fim else frozenset()

    def decode(self, ids: list[int]) -> str:
        """A stream's window of ids (an end id can only be its last generated token)."""
        if self.hidden or self.ends:
            ids = [i for i in ids if i not in self.hidden and i not in self.ends]
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def decode_many(self, sequences: Sequence[list[int]]) -> list[str]:
        """Many whole sequences in one call of the (Rust) tokenizer (a FIM one as its prefix
        and middle)."""
        head = len(self.head)
        if head:  # the BOS: FIM layouts start after it
            sequences = [seq[head:] if seq[:head] == self.head else seq for seq in sequences]
        if self.fim is not None:
            sequences = [self.fim.visible(seq) for seq in sequences]
        if self.ends:
            sequences = [s[:-1] if s and s[-1] in self.ends else s for s in sequences]
        return self.tokenizer.batch_decode(
            list(sequences), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def tensors(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The postprocessing model's output for one request (names in contract.tensors)."""
        return self.batch_requests([inputs])[0]

    def batch_requests(
        self, requests: Sequence[Mapping[str, np.ndarray]]
    ) -> list[dict[str, np.ndarray]]:
        """Outputs for every request of an ``execute`` batch, decoded together."""
        sequences = [_sequences(r["TOKENS_BATCH"], r.get("SEQUENCE_LENGTH")) for r in requests]
        texts = iter(self.decode_many([seq for seqs in sequences for seq in seqs]))
        return [
            {"OUTPUT": np.array([next(texts).encode() for _ in seqs], dtype=np.object_)}
            for seqs in sequences
        ]

    def batch(self, tokens: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
        """TOKENS_BATCH [N, beam, T] (+ SEQUENCE_LENGTH [N, beam]) -> texts, flat [N * beam].

        Flat, as the FasterTransformer ensemble returns it, so ``OUTPUT_0[0]`` is the first text.
        """
        inputs = {"TOKENS_BATCH": tokens}
        if lengths is not None:
            inputs["SEQUENCE_LENGTH"] = lengths
        return self.tensors(inputs)["OUTPUT"]


def _sequences(tokens: np.ndarray, lengths: np.ndarray | None) -> list[list[int]]:
    """Each beam of each prompt, trimmed to its length, in the flat order of OUTPUT."""
    tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
    if lengths is None:
        lengths = np.full(tokens.shape[:2], tokens.shape[-1])
    lengths = lengths.reshape(tokens.shape[:2])
    return [
        tokens[i, beam, : lengths[i, beam]].tolist()
        for i in range(tokens.shape[0])
        for beam in range(tokens.shape[1])
    ]


class IncrementalDecoder:
    """Emits exactly the new text each token adds, never splitting a character.

    Byte-level BPE tokens can end inside a multi-byte UTF-8 character. Each push decodes only a
    short window: from the last point where the text was complete (``prefix``) to the end, and
    emits what it adds to the text up to the last emitted token (``read``). A window ending in
    an unfinished character emits nothing until the character completes, so the pieces
    concatenate to the unary decode, at a cost per token that does not grow with the length.
    """

    CONTEXT = 6  # prompt tokens decoded with the first new ones, for the same spacing

    def __init__(
        self, postprocessor: Postprocessor, prompt_ids: list[int], held_back: int | None = None
    ) -> None:
        """``held_back`` (token healing): the prompt's last token, which the engine did not
        get; the first tokens spell its text again, and the caller has it: it is not emitted."""
        self.postprocessor = postprocessor
        self.ids = list(prompt_ids)
        self.read = len(self.ids)
        self.prefix = max(0, self.read - self.CONTEXT)
        self.skip = ""  # held-back text still to drop from the front of the pieces
        if held_back is not None:
            self.ids.append(held_back)
            self.skip = self._new_text()
            self.ids.pop()

    def _unskip(self, piece: str) -> str:
        cut = 0
        while cut < min(len(self.skip), len(piece)) and self.skip[cut] == piece[cut]:
            cut += 1
        self.skip = self.skip[cut:] if cut == min(len(self.skip), len(piece)) else ""
        return piece[cut:]

    def _new_text(self) -> str:
        decode = self.postprocessor.decode
        before = decode(self.ids[self.prefix : self.read])
        text = decode(self.ids[self.prefix :])
        if text.startswith(before):
            return text[len(before) :]
        # ``before`` ended in a replacement character that the new bytes completed
        pairs = zip(before, text, strict=False)
        common = next((i for i, (a, b) in enumerate(pairs) if a != b), len(before))
        return text[common:]

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        piece = self._new_text()
        if not piece or piece.endswith("\ufffd"):  # an unfinished character: wait for more
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return self._unskip(piece) if self.skip else piece

    def flush(self) -> str:
        """Whatever is left at the end (including a character that never completed)."""
        piece = self._new_text() if self.read < len(self.ids) else ""
        self.prefix, self.read = self.read, len(self.ids)
        return self._unskip(piece) if self.skip else piece
