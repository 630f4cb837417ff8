"""Line-aware tokenization: the code pre-tokenizer, and the token ids of a resent prefix.

The default model's tokenizer (``make model``) splits off each newline and each line's
indentation before byte-level BPE (:func:`code_pre_tokenizer`; modelbuild/tokenizer.py says
why). No token then spans a newline, so a text's tokens are those of its part before its last
newline followed by those of the rest, the newline on: ``encode(a + b) == encode(a) +
encode(b)`` whenever ``b`` starts with a newline. An editor resends the file on each pause in
typing, a few characters more each time; :class:`LineTokens` remembers the ids of texts up to
their last newline, so only the last line is tokenized again (0.6 ms of tokenizer work for a
3,000-character prefix otherwise, on every keystroke). No tokenizer library caches this; it is
only sound for tokenizers with this rule, which :func:`splits_lines` checks exactly. The ids
are the text's alone (no special tokens): a BOS the checkpoint's tokenizer puts before a prompt
is added by preprocessing to the whole prompt afterwards, so it never sits inside a cached head.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tokenizers import Regex, pre_tokenizers

# A newline, and the spaces and tabs that start a line, each split off before byte-level BPE.
LAYOUT = r"\r?\n|(?<=\n)[ \t]+"
CACHED_HEADS = 64  # texts up to their last newline remembered (a few editors' files each)
MIN_HEAD_CHARS = 256  # shorter heads cost less to tokenize than to look up
# Longer heads are tokenized whole each time: a model's context holds a few thousand tokens of
# code, and this bounds what the cache holds (64 x 32 KiB of text and its ids, about 20 MiB).
MAX_HEAD_CHARS = 32_768


def code_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LAYOUT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )


def _state(component) -> dict | None:
    return json.loads(component.__getstate__()) if component is not None else None


def splits_lines(backend) -> bool:
    """Whether a ``tokenizers.Tokenizer`` pre-tokenizes with :func:`code_pre_tokenizer` and
    nothing (no normalizer) could join text across a newline."""
    return backend.normalizer is None and _state(backend.pre_tokenizer) == _state(
        code_pre_tokenizer()
    )


class _Remembered:
    """The token ids of the last ``entries`` texts looked up (least recently used forgotten)."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def known(self, texts: Sequence[str]) -> dict[str, list[int]]:
        found = {}
        with self._lock:
            for text in texts:
                if (ids := self._ids.get(text)) is not None:
                    self._ids.move_to_end(text)
                    found[text] = ids
                    self.hits += 1
        return found

    def remember(self, new: dict[str, list[int]]) -> None:
        with self._lock:
            self._ids.update(new)
            while len(self._ids) > self._entries:
                self._ids.popitem(last=False)


class LineTokens:
    """Token ids of texts, the part before each text's last newline looked up in an LRU."""

    def __init__(self, encode_all, entries: int = CACHED_HEADS) -> None:
        self._encode_all = encode_all  # list[str] -> list[list[int]], no special tokens added
        self._heads = _Remembered(entries)

    @property
    def hits(self) -> int:
        return self._heads.hits

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        cuts = [_head_end(text) for text in texts]
        known = self._heads.known(
            [text[:cut] for text, cut in zip(texts, cuts, strict=True) if cut]
        )
        missing = list(dict.fromkeys(t[:c] for t, c in zip(texts, cuts, strict=True) if c))
        missing = [head for head in missing if head not in known]
        rests = [text[cut:] for text, cut in zip(texts, cuts, strict=True)]
        encoded = self._encode_all(missing + rests) if missing or rests else []
        new = dict(zip(missing, encoded[: len(missing)], strict=True))
        self._heads.remember(new)
        heads = known | new
        return [
            [*heads[text[:cut]], *rest] if cut else rest
            for text, cut, rest in zip(texts, cuts, encoded[len(missing) :], strict=True)
        ]


class ResentTexts:
    """Token ids of whole texts sent before, for any tokenizer: a text always gets the same ids,
    and an editor sends the same prompt again and again (it asks again at the same place, or
    after a request it left). Tokenizing a 2,600-character prompt took 1.4 ms of a resent
    prompt's first token in the engine's process (the CPU idle before it; 0.4 ms back to back):
    a look-up takes microseconds. Texts shorter than ``MIN_HEAD_CHARS`` cost less to tokenize
    than to look up; longer than ``MAX_HEAD_CHARS`` are not kept."""

    def __init__(self, encode_all, entries: int = CACHED_HEADS) -> None:
        self._encode_all = encode_all  # list[str] -> list[list[int]]
        self._texts = _Remembered(entries)

    @property
    def hits(self) -> int:
        return self._texts.hits

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        kept = {t for t in texts if MIN_HEAD_CHARS <= len(t) <= MAX_HEAD_CHARS}
        known = self._texts.known(list(kept))
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        encoded = dict(zip(missing, self._encode_all(missing) if missing else [], strict=True))
        # copies, kept and given: callers may change what they get, never what is remembered
        self._texts.remember({t: list(ids) for t, ids in encoded.items() if t in kept})
        return [list(known[t]) if t in known else list(encoded[t]) for t in texts]


def _head_end(text: str) -> int:
    """Where the text's part before its last newline ends (a ``\\r\\n`` stays whole); 0 when
    that part is too short to be worth remembering or too long to keep."""
    cut = text.rfind("\n")
    if cut > 0 and text[cut - 1] == "\r":
        cut -= 1
    return cut if MIN_HEAD_CHARS <= cut <= MAX_HEAD_CHARS else 0
