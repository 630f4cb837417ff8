"""What an editor sends of a file: the text before the cursor, clipped from the left to fit the
served checkpoint's context (counted with its own tokenizer: a load test of refusals measures
nothing), and the text after it, clipped from the right to a share of that budget. The prefix's
cut moves in steps of ``anchor_chars`` (at a line start), as a cache-aware editor keeps it, so
that a prefix cache can reuse it; 0: the exact tail, which moves at every keystroke."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from tokenizers import Tokenizer

MARGIN_TOKENS = 8  # a cut string re-encoded may merge differently; FIM adds a few tokens
CHARS_PER_TOKEN_MAX = 16  # read this many characters per budgeted token before counting

# What a real editor sends (Continue's default): a prompt of at most 1,024 tokens, the file
# around the cursor and chunks of other open files as repository context (input_extra), which
# the API fits within its own budget (openai_api/repo_context.py). No editor sends a whole
# 8k-token file at every keystroke. Of the 1,024, the file takes all but CHUNK_TOKENS when
# chunks go with it; two 12-line chunks of the held-out files are 85 tokens each at the median.
EDITOR_PROMPT_TOKENS = 1024
CONTEXT_CHUNKS, CHUNK_LINES, CHUNK_TOKENS = 2, 12, 256
# The prefix's cut moves in steps of this many characters (a cache-aware editor's window)
ANCHOR_CHARS = 512


def neighbour_chunks(files: Sequence[Path], path: Path) -> list[dict]:
    """``input_extra`` for a request on ``path``: the first lines of the files after it in
    ``files``, the same for every request on that file (as an editor's ring of recent files)."""
    at = files.index(path) if path in files else -1
    chunks = []
    for step in range(1, min(CONTEXT_CHUNKS, len(files) - 1) + 1):
        other = files[(at + step) % len(files)]
        lines = other.read_text(errors="replace").splitlines(keepends=True)[:CHUNK_LINES]
        chunks.append({"filename": other.name, "text": "".join(lines)})
    return chunks


class Encoder(Protocol):
    def offsets(self, text: str) -> list[tuple[int, int]]: ...


class CheckpointTokenizer:
    """The checkpoint's ``tokenizer.json`` through the ``tokenizers`` library."""

    def __init__(self, checkpoint: Path) -> None:
        if not (path := Path(checkpoint) / "tokenizer.json").exists():
            raise FileNotFoundError(
                f"no tokenizer at {path} to clip prompts with: run `make "
                "model`, or pass --model-repository"
            )
        self.tokenizer = Tokenizer.from_file(str(path))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).offsets)


class Window(NamedTuple):
    prefix: str
    suffix: str
    prefix_tokens: int
    suffix_tokens: int


@dataclass(frozen=True)
class Clipper:
    """Fits prefix + suffix + the completion into ``context`` tokens."""

    encoder: Encoder
    context: int
    max_tokens: int
    suffix_share: float = 0.25  # of the prompt budget the suffix may take
    anchor_chars: int = 0  # the prefix's cut moves in steps of this many characters; 0: exact

    def __post_init__(self) -> None:
        if self.budget < 16:
            raise ValueError(
                f"a context of {self.context} tokens leaves {self.budget} for "
                f"the prompt after {self.max_tokens}: ask for fewer"
            )

    @property
    def budget(self) -> int:
        """Prompt tokens (prefix + suffix) a request may carry."""
        return self.context - self.max_tokens - MARGIN_TOKENS

    def clip(
        self, text: str, cursor: int, with_suffix: bool, suffix_at: int | None = None
    ) -> Window:
        """The suffix (from ``suffix_at``) takes up to ``suffix_share``, the prefix the rest."""
        suffix, suffix_tokens = "", 0
        if with_suffix:
            after = text[cursor if suffix_at is None else suffix_at :]
            suffix, suffix_tokens = self._cut(after, int(self.budget * self.suffix_share), True)
        prefix, prefix_tokens = self._cut(text[:cursor], self.budget - suffix_tokens, False)
        cut = cursor - len(prefix)
        if self.anchor_chars and cut > 0:
            step = -(-cut // self.anchor_chars) * self.anchor_chars  # the next multiple
            newline = text.find("\n", step - 1, cursor - 1)
            if newline != -1:  # else no line starts in between: the exact cut stays
                prefix = text[newline + 1 : cursor]
                prefix_tokens = len(self.encoder.offsets(prefix))
        return Window(prefix, suffix, prefix_tokens, suffix_tokens)

    def _cut(self, text: str, tokens: int, head: bool) -> tuple[str, int]:
        """The longest start (``head``) or end of ``text`` within ``tokens``, cut between two."""
        chars = tokens * CHARS_PER_TOKEN_MAX
        text = text[:chars] if head else text[-chars:]
        if len(spans := self.encoder.offsets(text)) <= tokens:
            return text, len(spans)
        return (text[: spans[tokens - 1][1]] if head else text[spans[-tokens][0] :]), tokens
