"""A chat rendered by the checkpoint's own template (contract/chat.py) and tokenized by the
served preprocessing equals transformers' ``apply_chat_template(tokenize=True)`` token for
token: SmolLM2's template, a tiny Qwen2-style checkpoint's, and a Llama-3-style one whose
template writes the BOS that the tokenizer also adds (not doubled). The end of a turn is found
and is a stop; bad messages are refused naming what is wrong."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from llama_checkpoints import random_model, save_source
from test_model_tokens import byte_level, prompt_row, request
from transformers import PreTrainedTokenizerFast

from contract.chat import ChatError, ChatTemplate, end_of_turn, parse_messages
from contract.model_tokens import prompt_head
from modelbuild.checkpoint_files import install_tokenizer
from modelbuild.corpus import read_texts, split
from modelbuild.tokenizer import END_OF_TEXT
from openai_api.chat import parse_chat
from preprocessing.tokenize import Preprocessor

# SmolLM2-135M-Instruct's template, as its GGUF (and so `make model`) carries it
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2-Instruct's: a default system turn, ChatML, the end of turn <|im_end|> not the end token
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama 3's shape: the template writes the BOS itself
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
CHATML = ("<|im_start|>", "<|im_end|>")
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CONVERSATION = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "Write fib(n).\n\tUse a loop ✓"},
    {"role": "assistant", "content": "```python\ndef fib(n):\n    a, b = 0, 1\n```"},
    {"role": "user", "content": [{"type": "text", "text": "Now "}, {"type": "text", "text": "x"}]},
]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    train, _ = split()
    return list(read_texts(train[:40]))


def with_template(folder: Path, template: str, **config: object) -> Path:
    """``folder``'s tokenizer_config.json with ``template`` (and ``config``) in it."""
    path = folder / "tokenizer_config.json"
    values = json.loads(path.read_text())
    values.update({"chat_template": template, **config})
    path.write_text(json.dumps(values))
    return folder


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory, texts) -> Path:
    folder = byte_level(tmp_path_factory.mktemp("smollm2"), texts, CHATML)
    return with_template(folder, SMOLLM2, eos_token="<|im_end|>", bos_token="<|im_start|>")


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory, texts) -> Path:
    """A tiny random Qwen2 checkpoint, its end token <|endoftext|>, its turns ChatML's."""
    folder = byte_level(tmp_path_factory.mktemp("qwen2-tok"), texts, CHATML)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    checkpoint = tmp_path_factory.mktemp("qwen2") / "checkpoint"
    save_source(random_model("qwen2", eos, len(tokenizer)), tokenizer, checkpoint)
    return with_template(checkpoint, QWEN2)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory, texts) -> Path:
    folder = byte_level(tmp_path_factory.mktemp("llama3"), texts, LLAMA3_TOKENS)
    return with_template(folder, LLAMA3, bos_token="<|begin_of_text|>", add_bos_token=True)


def chat_of(folder: Path) -> ChatTemplate:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    chat = ChatTemplate.of(tokenizer, prompt_head(tokenizer, folder))
    assert chat is not None
    return chat


def reference_ids(folder: Path, messages) -> list[int]:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


@pytest.mark.parametrize("name", ["smollm2", "qwen2", "llama3"])
def test_the_served_prompt_is_apply_chat_template_token_for_token(request_, name):
    folder = request_.getfixturevalue(name)
    chat = chat_of(folder)
    prompt = chat.prompt(CONVERSATION)
    served = prompt_row(Preprocessor(folder).tensors(request([prompt.encode()])))
    joined = [*CONVERSATION[:3], {"role": "user", "content": "Now x"}]
    assert served == reference_ids(folder, joined)
    assert prompt.endswith("assistant\n" if name != "llama3" else "<|end_header_id|>\n\n")


@pytest.fixture
def request_(request):
    """pytest's own ``request`` (the name ``request`` is test_model_tokens' helper here)."""
    return request


def test_a_template_that_writes_the_bos_does_not_get_a_second_one(llama3):
    chat = chat_of(llama3)
    assert chat.head == (chat.tokenizer.bos_token_id,)
    prompt = chat.prompt([{"role": "user", "content": "hi"}])
    assert not prompt.startswith("<|begin_of_text|>")
    served = prompt_row(Preprocessor(llama3).tensors(request([prompt.encode()])))
    assert served.count(chat.tokenizer.bos_token_id) == 1 and served[0] == chat.head[0]


def test_the_end_of_a_turn_is_the_templates_own_token(smollm2, qwen2, llama3):
    assert chat_of(smollm2).stops == ("<|im_end|>",)
    # Qwen2: the turn ends with <|im_end|>, not the checkpoint's end token <|endoftext|>
    assert chat_of(qwen2).stops == ("<|im_end|>",)
    assert chat_of(llama3).stops == ("<|eot_id|>",)


def test_a_tokenizer_without_a_template_does_not_chat(tmp_path, texts):
    folder = byte_level(tmp_path, texts, ())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    assert ChatTemplate.of(tokenizer, []) is None
    assert end_of_turn(tokenizer) is None


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role must be one of"),
        ([{"role": "user", "content": 3}], "messages[0].content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "images"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "must be a text part"),
        ([{"role": "user"}], "has no content"),
        ([{"role": "tool", "content": "{}", "tool_call_id": "1"}], "tool calls"),
        ([{"role": "assistant", "content": None, "tool_calls": [{}]}], "tool_calls"),
    ],
)
def test_bad_messages_are_refused_by_name(messages, named):
    with pytest.raises(ChatError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_messages(messages)


def test_the_developer_role_is_the_system_turn():
    assert parse_messages([{"role": "developer", "content": "x"}]) == [
        {"role": "system", "content": "x"}
    ]


def test_an_imported_checkpoint_keeps_its_chat_template(qwen2, tmp_path):
    """transformers saves the template apart (chat_template.jinja): the import copies it."""
    source, dest = tmp_path / "source", tmp_path / "dest"
    PreTrainedTokenizerFast.from_pretrained(str(qwen2)).save_pretrained(source)
    assert (source / "chat_template.jinja").is_file()
    dest.mkdir()
    install_tokenizer(source, dest)
    assert PreTrainedTokenizerFast.from_pretrained(str(dest)).chat_template == QWEN2


def test_a_chat_request_stops_at_the_end_of_a_turn_and_is_not_healed(smollm2):
    """The prompt ends in the template's generation prompt, a boundary the model was trained
    on: token healing (on by default for plain completion) is off for every choice."""
    body = {"messages": CONVERSATION[:2], "max_tokens": 8, "n": 2, "stop": ["\n\n"]}
    job = parse_chat(body, chat_of(smollm2), count=len, context=512)
    assert job.requests
    for choice in job.requests:
        assert choice.token_healing is False
        assert "<|im_end|>" in choice.stop_words and "\n\n" in choice.stop_words
