"""A byte-level BPE tokenizer (GPT-2 style, so any text round-trips) trained on the corpus.

Each newline and each line's indentation are tokens of their own
(``preprocessing.line_tokens.code_pre_tokenizer``), never merged
with what follows. An editor's prompt ends at the cursor, and the cursor is most often at a
line's start or after its indentation: GPT-2's rule would make that ending a token the model
seldom saw in training (``"\n   "`` then ``" return"``), and the model would start another
line instead of writing this one. Here the text up to the cursor tokenizes as the whole file
does (``"\n"``, ``"    "``, ``"return"``).

Its special tokens are the end of text and, with ``fim``, StarCoder's fill-in-the-middle
sentinels (``contract.fim``), so a model trained with it can be asked to fill a gap.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from contract.fim import STARCODER_TOKENS
from preprocessing.line_tokens import code_pre_tokenizer

END_OF_TEXT = "<|endoftext|>"


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, fim: bool = True
) -> PreTrainedTokenizerFast:
    fim_tokens = list(STARCODER_TOKENS) if fim else []
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = code_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, *fim_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        additional_special_tokens=fim_tokens,
        clean_up_tokenization_spaces=False,
    )
