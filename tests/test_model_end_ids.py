"""Every end id of a checkpoint ends its generation (contract/model_tokens.py): the engine's
own first, the others as stop words preprocessing adds, never shown by postprocessing; and the
FasterTransformer contract's ``end_id`` outside the vocabulary is the model's own end token on
every Llama-family checkpoint, as on GPT-J (tests/test_gptj_engine.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_model_tokens import prompt_row, request, stop_words, write_config

from contract.model_tokens import end_ids
from postprocessing.detokenize import Postprocessor
from preprocessing.tokenize import Preprocessor


def test_end_ids_come_from_config_then_generation_config(tmp_path):
    assert end_ids(tmp_path) == []  # a tokenizer alone
    write_config(tmp_path, "generation_config.json", eos_token_id=[7, 9])
    assert end_ids(tmp_path) == [7, 9]  # config.json has none: the engine reads this one
    write_config(tmp_path, "config.json", eos_token_id=9)
    assert end_ids(tmp_path) == [9, 7]
    write_config(tmp_path, "config.json", eos_token_id=[5, 7])
    assert end_ids(tmp_path) == [5, 7, 9]


@pytest.fixture(scope="module")
def project_tokenizer():
    from llama_checkpoints import project_tokenizer

    return project_tokenizer()


def free_greedy(model, prompt: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def tiny_checkpoint_of(family: str, tokenizer, folder: Path):
    """A tiny random ``family`` checkpoint with the project's tokenizer, and its model."""
    from llama_checkpoints import random_model, save_source

    model = random_model(family, tokenizer.eos_token_id, len(tokenizer))
    save_source(model, tokenizer, folder)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "starcoder2"])
def test_an_end_id_outside_the_vocabulary_is_the_llama_familys_own(
    family, project_tokenizer, tmp_path
):
    """The FasterTransformer contract: ``end_id`` 50256 (GPT-2's) or past the vocabulary means
    the model's own end token, here the 5th greedy token."""
    from engine import GenerationRequest, TorchEngine
    from engine.models import load_model

    model = tiny_checkpoint_of(family, project_tokenizer, tmp_path)
    prompt = project_tokenizer.encode("def add(a, b):\n", add_special_tokens=False)
    free = free_greedy(model, prompt, 16)
    end = free[4]
    write_config(tmp_path, "config.json", eos_token_id=end)
    write_config(tmp_path, "generation_config.json", eos_token_id=end)
    engine = TorchEngine(load_model(tmp_path), max_batch_size=2).start()
    try:
        vocab = len(project_tokenizer)
        for end_id in (50256, vocab, None):
            result = engine.generate(GenerationRequest(prompt, 16, end_id=end_id))
            assert result.finish_reason == "end_id"
            assert result.output_ids == free[: free.index(end)]
    finally:
        engine.stop()


def test_every_end_id_of_a_list_ends_generation(project_tokenizer, tmp_path):
    """Llama 3's list: the engine ends at the first; preprocessing sends the others as stop
    words, so the sequence ends at whichever comes first; postprocessing never shows one."""
    from engine import GenerationRequest, TorchEngine
    from engine.models import load_model

    model = tiny_checkpoint_of("llama", project_tokenizer, tmp_path)
    pre = Preprocessor(tmp_path)
    text = "def add(a, b):\n"
    free = free_greedy(model, pre.encode(text), 16)
    unused = next(i for i in range(len(project_tokenizer)) if i not in free)
    write_config(tmp_path, "config.json", eos_token_id=[unused, free[3]])
    write_config(tmp_path, "generation_config.json", eos_token_id=[unused, free[3], unused])
    pre, post = Preprocessor(tmp_path), Postprocessor(tmp_path)
    out = pre.tensors(request([text.encode()], stop=b"zzz"))
    assert stop_words(out) == [pre.encode("zzz"), [free[3]]]  # the client's, then the end id
    engine = TorchEngine(load_model(tmp_path), max_batch_size=2).start()
    try:
        result = engine.generate(GenerationRequest(prompt_row(out), 16, stop_words=stop_words(out)))
    finally:
        engine.stop()
    stop = free.index(free[3])
    assert result.finish_reason == "stop_word" and result.output_ids == free[: stop + 1]
    # the text is the prompt and what came before the end id
    ended, before = ([[[*prompt_row(out), *ids]]] for ids in (free[: stop + 1], free[:stop]))
    texts = [post.batch(np.array(seq, dtype=np.uint32), None)[0] for seq in (ended, before)]
    assert texts[0] == texts[1] and texts[0].decode().startswith(text)
    assert project_tokenizer.decode([free[3]])  # a token the tokenizer would show
