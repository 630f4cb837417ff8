"""Prompt and word-list tokenization into the model stage's tensors.

A whole ``execute`` batch is tokenized in one call of the (Rust, multi-threaded) tokenizer, and
every request gets its own answer: a bad request gets its error, the others their tensors.

A row with a non-empty ``suffix`` asks for fill-in-the-middle: its prompt is the text before
the cursor (it may then be empty), and the model gets both in the checkpoint's own FIM layout
(``contract.fim``), each side tokenized on its own so that no token straddles the cursor.

The checkpoint's own tokens, never GPT-2's (``contract.model_tokens``): a prompt, FIM or not,
starts with what the tokenizer's rules put before any text (Llama's and Mistral's BOS; nothing
for GPT-2's, whose prompts are unchanged), and every request also stops at the checkpoint's
other end ids (a list ``eos_token_id``: the engine ends at its first, these are stop words).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from contract.fim import NO_FIM, FimLayout, tokenizer_layout
from contract.healing import TokenExtensions
from contract.model_tokens import end_ids, prompt_head
from contract.options import (
    MAX_PROMPT_BYTES,
    MAX_TOKENS_PER_WORD,
    MAX_WORDS_PER_LIST,
    InvalidRequestError,
)
from contract.words import decode_words, word_list
from preprocessing.leading_space import without_leading_space
from preprocessing.line_tokens import LineTokens, ResentTexts, splits_lines
from preprocessing.token_texts import tokenizer_texts

Tensors = dict[str, np.ndarray]
WORD_INPUTS = {"BAD_WORDS_DICT": "INPUT_2 (bad words)", "STOP_WORDS_DICT": "INPUT_3 (stop words)"}


def _text(value: object, what: str, row: int) -> str:
    if isinstance(value, bytes):
        if len(value) > MAX_PROMPT_BYTES:
            raise InvalidRequestError(
                f"{what} of row {row} has {len(value):,} bytes, over the limit of "
                f"{MAX_PROMPT_BYTES:,}; send less text"
            )
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(f"{what} of row {row} is not valid UTF-8: {exc}") from None
    return str(value)


def _column(array: np.ndarray) -> list:
    return list(np.asarray(array).reshape(len(array), -1)[:, 0])


class _Texts:
    """One request's texts, read and checked, waiting for token ids."""

    def __init__(self, inputs: Mapping[str, np.ndarray], fim: FimLayout | None) -> None:
        self.inputs = inputs
        self.prompts = [_text(q, "INPUT_0", i) for i, q in enumerate(_column(inputs["QUERY"]))]
        self.suffixes = [""] * len(self.prompts)
        if "suffix" in inputs:
            self.suffixes = [_text(v, "suffix", i) for i, v in enumerate(_column(inputs["suffix"]))]
            if len(self.suffixes) != len(self.prompts):
                raise InvalidRequestError(
                    f"suffix has {len(self.suffixes)} rows for {len(self.prompts)} prompts in "
                    "INPUT_0: send one suffix per prompt (an empty one for no fill-in-the-middle)"
                )
            if fim is None and any(self.suffixes):
                raise InvalidRequestError(NO_FIM)
        for i, prompt in enumerate(self.prompts):
            if not prompt and not self.suffixes[i]:
                raise InvalidRequestError(
                    f"INPUT_0 row {i} is an empty prompt: send text to complete"
                )
        self.words: dict[str, list[list[str]]] = {}
        for name, what in WORD_INPUTS.items():
            rows = [decode_words(_text(v, what, i)) for i, v in enumerate(_column(inputs[name]))]
            for i, words in enumerate(rows):
                if len(words) > MAX_WORDS_PER_LIST:
                    raise InvalidRequestError(
                        f"{what} of row {i} has {len(words)} words, over the limit of "
                        f"{MAX_WORDS_PER_LIST}"
                    )
            self.words[name] = rows
        # token healing: on unless the request says false; with a suffix, the prefix's end is
        # healed inside the fill-in-the-middle layout (docs/generation.md#token-healing)
        self.healing = [True] * len(self.prompts)
        if "token_healing" in inputs:
            flags = _column(inputs["token_healing"])
            self.healing = [bool(flags[min(i, len(flags) - 1)]) for i in range(len(self.prompts))]

    def texts(self, with_suffixes: bool = True) -> list[str]:
        words = [w for rows in self.words.values() for row in rows for w in row]
        return [*self.prompts, *(self.suffixes if with_suffixes else ()), *words]


def built_fim_order(checkpoint: Path, style: str) -> str:
    """The prompt order ``make model`` built a checkpoint for (its build.json's
    ``build.fim_order``); PSM for any other checkpoint, and always for a layout with one order."""
    try:
        build = json.loads((checkpoint / "build.json").read_text()).get("build", {})
    except (OSError, ValueError):
        return "psm"
    return build.get("fim_order", "psm") if style == "starcoder" else "psm"


class Preprocessor:
    """Turns the ensemble's text inputs into the model stage's token tensors."""

    def __init__(self, tokenizer_path: str | Path, fim_order: str = "auto") -> None:
        """``fim_order``: the layout of a fill-in-the-middle prompt, "psm" or "spm" (StarCoder-
        and CodeLlama-style checkpoints trained on both; contract/fim.py says what each costs),
        or "auto": the order the checkpoint's build names (:func:`built_fim_order`)."""
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_path))
        self.fim = tokenizer_layout(self.tokenizer)
        if self.fim is not None:
            order = built_fim_order(Path(tokenizer_path), self.fim.style)
            order = order if fim_order == "auto" else fim_order
            if order != self.fim.order:
                self.fim = replace(self.fim, order=order)  # refuses what the layout lacks
        backend = self.tokenizer.backend_tokenizer
        self.lines = LineTokens(self._encode_all) if splits_lines(backend) else None
        self.resent = ResentTexts(self.lines.encode_all if self.lines else self._encode_all)
        # CodeLlama's suffix goes without SentencePiece's leading space (leading_space.py)
        self.bare = without_leading_space(backend) if self.fim and self.fim.bare_suffix else None
        self.head = prompt_head(self.tokenizer, tokenizer_path)  # a BOS, or nothing
        special = self.tokenizer.all_special_ids
        self.extensions = TokenExtensions(tokenizer_texts(self.tokenizer), special)
        ends = end_ids(tokenizer_path)
        self.end_stops = [[i] for i in ends[1:]]  # the engine ends at ends[0] itself
        stop = self.fim.stop if self.fim else None
        # a middle's own end (CodeGen2's <eom>), unless an end id already ends it
        self.fim_stop = stop if stop and stop[0] not in ends else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.resent.encode_all(texts)

    def _encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    def _encode_bare(self, texts: Sequence[str]) -> list[list[int]]:
        assert self.bare is not None
        return [e.ids for e in self.bare.encode_batch(list(texts), add_special_tokens=False)]

    def tensors(self, inputs: Mapping[str, np.ndarray]) -> Tensors:
        """The preprocessing model's outputs for one request (names in contract.tensors)."""
        answer = self.batch([inputs])[0]
        if isinstance(answer, InvalidRequestError):
            raise answer
        return answer

    def batch(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Tensors | Exception]:
        """Outputs for every request of an ``execute`` batch, or the error of a bad one."""
        checked: list[_Texts | Exception] = []
        for inputs in requests:
            try:
                checked.append(_Texts(inputs, self.fim))
            except InvalidRequestError as exc:
                checked.append(exc)
        good = [c for c in checked if isinstance(c, _Texts)]
        apart = self.bare is not None  # suffixes without the leading space, encoded apart
        ids = iter(self.encode_all([t for c in good for t in c.texts(with_suffixes=not apart)]))
        after = [t for c in good for t in c.suffixes] if apart else []
        suffix_ids = iter(self._encode_bare(after)) if apart else ids
        answers: list[Tensors | Exception] = []
        for item in checked:
            if isinstance(item, Exception):
                answers.append(item)
                continue
            prompts = [next(ids) for _ in item.prompts]
            suffixes = [next(suffix_ids) for _ in item.suffixes]
            words = {
                name: [[next(ids) for _ in row] for row in rows]
                for name, rows in item.words.items()
            }
            fim_held: list[int | None] = [None] * len(prompts)  # None: not a FIM row
            for i, text in enumerate(item.suffixes):
                if text and self.fim is not None:
                    # the prefix's own last token is held back, wherever the layout puts it
                    fim_held[i] = self._hold_back(prompts[i], True) if item.healing[i] else -1
                    prefix = prompts[i][:-1] if fim_held[i] != -1 else prompts[i]
                    prompts[i] = self.fim.prompt(prefix, suffixes[i])
            try:
                answers.append(self._tensors(item, prompts, words, fim_held))
            except InvalidRequestError as exc:
                answers.append(exc)
        return answers

    def _tensors(
        self,
        item: _Texts,
        prompts: list[list[int]],
        words: dict[str, list[list[list[int]]]],
        fim_held: list[int | None],
    ) -> Tensors:
        for i, row in enumerate(prompts):
            if not row:
                raise InvalidRequestError(
                    f"INPUT_0 row {i} is an empty prompt: send text to complete"
                )
        for name, rows in words.items():
            for i, row in enumerate(rows):
                for word, text in zip(row, item.words[name][i], strict=True):
                    if len(word) > MAX_TOKENS_PER_WORD:
                        raise InvalidRequestError(
                            f"{WORD_INPUTS[name]} of row {i}: the word {text[:40]!r} is "
                            f"{len(word)} tokens, over the limit of {MAX_TOKENS_PER_WORD}"
                        )
        stops = words["STOP_WORDS_DICT"]
        for i, suffix in enumerate(item.suffixes):
            fim_stop = [self.fim_stop] if suffix and self.fim_stop else []  # CodeGen2's <eom>
            stops[i] = [*stops[i], *fim_stop, *self.end_stops]
        held, kept = [], []
        for i, row in enumerate(prompts):
            if fim_held[i] is not None:  # held back from the prefix before the layout was built
                held.append(fim_held[i])
                kept.append(row)
            else:
                held.append(self._hold_back(row) if item.healing[i] else -1)
                kept.append(row[:-1] if held[-1] >= 0 else row)
        prompts = kept
        if self.head:
            prompts = [[*self.head, *row] for row in prompts]
        ids = np.zeros((len(prompts), max(len(r) for r in prompts)), dtype=np.uint32)
        for i, row in enumerate(prompts):
            ids[i, : len(row)] = row
        return {
            "INPUT_ID": ids,
            "REQUEST_INPUT_LEN": np.array([[len(r)] for r in prompts], dtype=np.uint32),
            "BAD_WORDS_IDS": word_list(words["BAD_WORDS_DICT"]),
            "STOP_WORDS_IDS": word_list(words["STOP_WORDS_DICT"]),
            "REQUEST_OUTPUT_LEN": item.inputs["REQUEST_OUTPUT_LEN"],
            "HELD_BACK_ID": np.array([[h] for h in held], dtype=np.int32),
        }

    def _hold_back(self, prompt: list[int], fim: bool = False) -> int:
        """The prompt's (or a FIM prefix's) last token when healing holds it back (its text
        is a proper prefix of another token's), else -1. A one-token prompt keeps it unless a
        BOS leads it, or the FIM layout's tokens and suffix: the model needs a token to
        condition on."""
        if not prompt:
            return -1
        last = prompt[-1]
        if (len(prompt) > 1 or self.head or fim) and self.extensions.heals(last):
            return last
        return -1
