"""Each checkpoint's own tokens (contract/model_tokens.py): its FIM layout (StarCoder, CodeLlama,
Qwen2.5-Coder, DeepSeek-Coder, CodeGen2), what its tokenizer puts before a prompt (a BOS), and
every end id of its config, on tiny tokenizers and checkpoints built here; the refusal of
``suffix`` on every path for a model without FIM tokens (the layouts alone, and ``/v1/models``'
``fim`` field: test_fim_layouts.py)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import CodeLlamaTokenizer, LlamaTokenizer, PreTrainedTokenizerFast

from contract.fim import NO_FIM, tokenizer_layout
from contract.model_tokens import (
    CODELLAMA_TOKENS,
    DEEPSEEK_TOKENS,
    QWEN_PAD,
    QWEN_TOKENS,
    STARCODER_TOKENS,
    prompt_head,
)
from contract.options import InvalidRequestError
from contract.words import split_word_list
from modelbuild.corpus import read_texts, split
from modelbuild.tokenizer import END_OF_TEXT, train_tokenizer
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.leading_space import without_leading_space
from preprocessing.line_tokens import MIN_HEAD_CHARS
from preprocessing.tokenize import Preprocessor

PREFIX, SUFFIX, MIDDLE = "def f(x):\n    ", "\n    return y\n", "y = x + 1"


def request(prompts, suffixes=None, stop=b"") -> dict[str, np.ndarray]:
    n = len(prompts)
    inputs = {
        "QUERY": np.array([[p] for p in prompts], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.full((n, 1), 8, dtype=np.uint32),
        "BAD_WORDS_DICT": np.array([[b""]] * n, dtype=np.object_),
        "STOP_WORDS_DICT": np.array([[stop]] * n, dtype=np.object_),
        # the prompt whole: these tests check tokenization (test_token_healing.py, healing)
        "token_healing": np.zeros((n, 1), dtype=np.bool_),
    }
    if suffixes is not None:
        inputs["suffix"] = np.array([[s] for s in suffixes], dtype=np.object_)
    return inputs


def prompt_row(out: dict[str, np.ndarray], row: int = 0) -> list[int]:
    return out["INPUT_ID"][row, : int(out["REQUEST_INPUT_LEN"][row, 0])].tolist()


def stop_words(out: dict[str, np.ndarray], row: int = 0) -> list[list[int]]:
    return split_word_list(out["STOP_WORDS_IDS"][row])


def write_config(folder: Path, name: str, **values) -> None:
    path = folder / name
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **values}))


# -- tiny tokenizers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts() -> list[str]:
    train, _ = split()
    return list(read_texts(train[:40]))


def byte_level(folder: Path, texts: list[str], tokens: tuple[str, ...], fim: bool = False) -> Path:
    """The project's byte-level BPE (GPT-J's rule: nothing added to a prompt) with ``tokens``
    added as special tokens, as StarCoder's, Qwen's and DeepSeek's tokenizers have them."""
    tokenizer = train_tokenizer(texts, 400, fim=fim)
    if tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def spiece(texts) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A SentencePiece-style BPE vocabulary (``▁`` for spaces), as Llama's tokenizers have."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    alphabet = sorted(set("".join(texts)) - {" "})
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    state = json.loads(tokenizer.to_str())["model"]
    return state["vocab"], [tuple(m) for m in state["merges"]]


@pytest.fixture(scope="module")
def codellama(tmp_path_factory, spiece) -> Path:
    """transformers' own CodeLlamaTokenizer on a tiny vocabulary: BOS added, the sentinels
    spelled ``▁<PRE>``..., as CodeLlama's checkpoints save it."""
    folder = tmp_path_factory.mktemp("codellama")
    CodeLlamaTokenizer(vocab=spiece[0], merges=spiece[1]).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory, spiece) -> Path:
    """A Llama (2) tokenizer: ``add_bos_token`` as Llama's and Mistral's configs set it, no FIM
    tokens."""
    folder = tmp_path_factory.mktemp("llama")
    LlamaTokenizer(vocab=spiece[0], merges=spiece[1], add_bos_token=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, texts) -> Path:
    """Qwen2.5-Coder's tokens; its end token <|endoftext|> (the project tokenizer's)."""
    return byte_level(tmp_path_factory.mktemp("qwen"), texts, (*QWEN_TOKENS, QWEN_PAD))


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory, texts) -> Path:
    return byte_level(tmp_path_factory.mktemp("deepseek"), texts, DEEPSEEK_TOKENS)


@pytest.fixture(scope="module")
def gptj(tmp_path_factory, texts) -> Path:
    """The default model's tokenizer: GPT-2's rule (nothing added), StarCoder's sentinels."""
    return byte_level(tmp_path_factory.mktemp("gptj"), texts, (), fim=True)


def ids_of(folder: Path, names) -> list[int]:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    spelled = [n if n in tokenizer.get_vocab() else "▁" + n for n in names]
    return tokenizer.convert_tokens_to_ids(spelled)


def fim_text(folder: Path, out: dict[str, np.ndarray], generated: list[int]) -> str:
    """What postprocessing returns for the FIM prompt of ``out`` followed by ``generated``."""
    sequence = [*prompt_row(out), *generated]
    return Postprocessor(folder).batch(np.array([[sequence]], dtype=np.uint32), None)[0].decode()


# -- the layouts, from real tiny tokenizers ------------------------------------------------------


def test_codellama_follows_metas_reference_prompt(codellama):
    """``<s><PRE> {prefix} <SUF>{suffix} <MID>``: the BOS first, the prefix encoded as a prompt
    is (SentencePiece's leading space), the suffix without that space (Meta's
    ``encode_infilling``); the middle ends at <EOT>, which is never shown."""
    pre = Preprocessor(codellama)
    assert pre.fim is not None and pre.fim.style == "codellama" and pre.fim.order == "psm"
    bos = pre.tokenizer.bos_token_id
    sentinel, suffix_sentinel, middle, eot = ids_of(codellama, CODELLAMA_TOKENS)
    assert pre.tokenizer.convert_ids_to_tokens([sentinel]) == ["▁<PRE>"]
    out = pre.tensors(request([PREFIX.encode(), b"x = 1"], [SUFFIX.encode(), b""]))
    prefix = pre.encode(PREFIX)
    row = prompt_row(out)
    assert row[: 2 + len(prefix)] == [bos, sentinel, *prefix]
    assert row[2 + len(prefix)] == suffix_sentinel and row[-1] == middle
    spelled = "".join(pre.tokenizer.convert_ids_to_tokens(prefix)).replace("▁", " ")
    assert spelled == " " + PREFIX  # the space after <PRE>
    suffix = row[3 + len(prefix) : -1]
    spelled = "".join(pre.tokenizer.convert_ids_to_tokens(suffix)).replace("▁", " ")
    assert spelled == SUFFIX  # no space after <SUF>
    assert pre.encode(SUFFIX) != suffix  # (encoded alone, it would start with one)
    # <EOT> stops a FIM row only; the plain row is its prompt with the BOS
    assert stop_words(out, 0) == [[eot]] and stop_words(out, 1) == []
    assert prompt_row(out, 1) == pre.tokenizer("x = 1")["input_ids"]
    # what comes back: the prefix and the middle, no BOS, no sentinel, no <EOT>
    assert pre.bare is not None
    written = pre.bare.encode(MIDDLE).ids  # a middle as the model writes it, after the cursor
    assert fim_text(codellama, out, [*written, eot]) == PREFIX + MIDDLE
    spm = Preprocessor(codellama, fim_order="spm")
    out = spm.tensors(request([PREFIX.encode()], [SUFFIX.encode()]))
    assert prompt_row(out) == [bos, sentinel, suffix_sentinel, *suffix, middle, *prefix]
    assert fim_text(codellama, out, [*written, eot]) == PREFIX + MIDDLE


def test_qwen_coder_prompt_and_the_end_of_its_middle(qwen):
    pre = Preprocessor(qwen)
    assert pre.fim is not None and pre.fim.style == "qwen"
    sentinel, suffix_sentinel, middle, pad = ids_of(qwen, (*QWEN_TOKENS, QWEN_PAD))
    end = pre.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    out = pre.tensors(request([PREFIX.encode()], [SUFFIX.encode()]))
    expected = [sentinel, *pre.encode(PREFIX), suffix_sentinel, *pre.encode(SUFFIX), middle]
    assert prompt_row(out) == expected  # no BOS: Qwen's tokenizer adds none
    assert fim_text(qwen, out, [*pre.encode(MIDDLE), pad, end]) == PREFIX + MIDDLE
    # without a config, <|endoftext|> ends a middle as a stop word ...
    assert stop_words(out) == [[end]]
    with pytest.raises(ValueError, match="the qwen layout has no such prompt order"):
        Preprocessor(qwen, fim_order="spm")


def test_qwen_coder_base_ends_a_middle_at_its_end_token_and_instruct_too(qwen, tmp_path):
    import shutil

    base, instruct = tmp_path / "base", tmp_path / "instruct"
    shutil.copytree(qwen, base)
    shutil.copytree(qwen, instruct)
    pre = Preprocessor(qwen)
    end = pre.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    pad = pre.tokenizer.convert_tokens_to_ids(QWEN_PAD)  # stands for <|im_end|>
    write_config(base, "config.json", eos_token_id=end)  # the engine ends there: no stop word
    write_config(instruct, "config.json", eos_token_id=pad)  # Instruct: <|im_end|>, then ...
    write_config(instruct, "generation_config.json", eos_token_id=[pad, end])  # ... both
    fim = request([PREFIX.encode(), b"x"], [SUFFIX.encode(), b""])
    assert [stop_words(Preprocessor(base).tensors(fim), r) for r in (0, 1)] == [[], []]
    out = Preprocessor(instruct).tensors(fim)
    assert [stop_words(out, r) for r in (0, 1)] == [[[end]], [[end]]]  # every row, once


def test_deepseek_coder_prompt(deepseek):
    pre = Preprocessor(deepseek)
    assert pre.fim is not None and pre.fim.style == "deepseek"
    begin, hole, end = ids_of(deepseek, DEEPSEEK_TOKENS)
    out = pre.tensors(request([PREFIX.encode()], [SUFFIX.encode()]))
    assert prompt_row(out) == [begin, *pre.encode(PREFIX), hole, *pre.encode(SUFFIX), end]
    assert stop_words(out) == []  # the model's end token ends its middle
    assert fim_text(deepseek, out, pre.encode(MIDDLE)) == PREFIX + MIDDLE
    # a client writing the sentinels itself gets the same tokens
    written = f"{DEEPSEEK_TOKENS[0]}{PREFIX}{DEEPSEEK_TOKENS[1]}{SUFFIX}{DEEPSEEK_TOKENS[2]}"
    assert tokenizer_layout(pre.tokenizer) == pre.fim
    assert pre.encode(written) == prompt_row(out)


def test_codellama_sentinels_spelled_without_the_space_are_found_too(tmp_path, texts):
    folder = byte_level(tmp_path, texts, CODELLAMA_TOKENS)
    pre = Preprocessor(folder)
    assert pre.fim is not None and pre.fim.style == "codellama"
    assert pre.bare is None  # byte-level BPE adds no leading space: nothing to take off


# -- a model without FIM tokens ------------------------------------------------------------------


@pytest.fixture
def backend_io(monkeypatch):
    """backend.io (the engine model's stream tokenization) against a stand-in for python_backend."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 2
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "backend.io", raising=False)
    yield importlib.import_module("backend.io")
    sys.modules.pop("backend.io", None)


def test_a_model_without_sentinels_refuses_suffix_on_every_path(llama, backend_io):
    from client import CodegenError, CompletionRequest
    from openai_api.errors import from_client_error

    pre = Preprocessor(llama)
    assert pre.fim is None
    # preprocessing (the ensemble's stage)
    with pytest.raises(InvalidRequestError) as refused:
        pre.tensors(request([b"def f():"], [b"    return 1"]))
    assert str(refused.value) == NO_FIM
    # the engine model tokenizes a stream in process, with the same code
    tensors = CompletionRequest("def f():", max_tokens=4, suffix="    return 1").tensors()
    with pytest.raises(InvalidRequestError, match="`suffix` asks for fill-in-the-middle"):
        backend_io.tokenize(pre, tensors)
    # the OpenAI API (`suffix`) and /infill map the server's refusal onto a 400 naming suffix
    error = from_client_error(CodegenError(f"[StatusCode.INTERNAL] {NO_FIM}"), "localhost:8001")
    assert (error.status, error.param, error.message) == (400, "suffix", NO_FIM)
    # and the prompt without a suffix is served, its BOS first
    plain = pre.tensors(request([b"def f():"], [b""]))
    assert prompt_row(plain) == pre.tokenizer("def f():")["input_ids"]


# -- BOS ----------------------------------------------------------------------------------------


def test_a_llama_tokenizer_gets_its_bos_first_and_postprocessing_hides_it(llama):
    from openai_api.prompt_counter import PromptCounter

    pre, post = Preprocessor(llama), Postprocessor(llama)
    bos = pre.tokenizer.bos_token_id
    assert pre.head == [bos] == prompt_head(pre.tokenizer)  # tokenizer.json's template
    out = pre.tensors(request([b"def f(x):", b"import os"]))
    for row, text in enumerate(["def f(x):", "import os"]):
        assert prompt_row(out, row) == [bos, *pre.encode(text)]  # what the tokenizer adds
        assert prompt_row(out, row) == pre.tokenizer(text)["input_ids"]
    bare = without_leading_space(pre.tokenizer.backend_tokenizer)
    assert bare is not None
    completion = bare.encode("\n    return x").ids  # as the model writes it: no leading space
    sequence = np.array([[[*prompt_row(out), *completion]]], dtype=np.uint32)
    assert post.batch(sequence, None)[0].decode() == "def f(x):\n    return x"
    decoder = IncrementalDecoder(post, prompt_row(out))
    assert "".join(decoder.push(t) for t in completion) + decoder.flush() == "\n    return x"
    # the API's checked tokenizer (chat) counts a prompt's tokens as preprocessing does
    counter = PromptCounter(llama)
    counter._tokenizer, counter._head = pre.tokenizer, len(prompt_head(pre.tokenizer, llama))
    assert counter.count("def f(x):") == len(prompt_row(out))


def test_the_api_checks_its_tokenizer_on_the_whole_probe_prompt(llama, tmp_path):
    """The chat's tokenizer check compares its count with the engine's ``prompt_tokens``,
    which leave out a token that healing holds back: the probe goes whole (on SmolLM2 its
    last newline is held back, and every chat was refused as "not the served one")."""
    from client.results import Completion
    from openai_api.prompt_counter import PROBE_PROMPT, PromptCounter

    pre = Preprocessor(llama)

    class HealingServer:
        def send(self, request):
            (prompt,) = request.prompts
            count = len(pre.head) + len(pre.encode(prompt))
            healed = request.token_healing is not False
            held = healed and pre.extensions.heals(pre.encode(prompt)[-1])
            return [Completion(prompt, "", prompt, count, prompt_tokens=count - held)]

    assert pre.extensions.heals(pre.encode(PROBE_PROMPT)[-1])  # else this shows nothing
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(llama, checkpoint)
    (checkpoint / "config.json").write_text('{"model_type": "llama"}')
    counter = PromptCounter(checkpoint)
    assert counter.usable(HealingServer()) and counter.state == "verified"


def test_gptj_prompts_stay_as_they_were(gptj):
    pre = Preprocessor(gptj)
    assert pre.head == [] and pre.end_stops == [] and pre.bare is None
    out = pre.tensors(request([b"def f(x):"], stop=b"\n\n"))
    assert prompt_row(out) == pre.encode("def f(x):")
    assert stop_words(out) == [pre.encode("\n\n")]


def test_the_resent_prefix_cache_stays_exact_under_a_bos(tmp_path, texts):
    """The project's pre-tokenizer (its line-token cache) with a BOS the checkpoint asks for
    (``add_bos_token`` in tokenizer_config.json, which transformers 5 itself ignores next to a
    tokenizer.json): the cache holds the text's ids alone and the BOS goes first, the first
    time and the next."""
    folder = byte_level(tmp_path, texts, (), fim=True)
    write_config(folder, "tokenizer_config.json", add_bos_token=True)
    pre = Preprocessor(folder)
    bos = pre.tokenizer.bos_token_id
    assert pre.lines is not None and pre.head == [bos]
    assert pre.tokenizer("x")["input_ids"] == pre.encode("x")  # (transformers adds nothing)
    head = "".join(texts)[: MIN_HEAD_CHARS * 2]
    head = head[: head.rfind("\n") + 1]
    for typed in ("    ret", "    return x"):
        before = pre.lines.hits
        out = pre.tensors(request([(head + typed).encode()]))
        assert prompt_row(out) == [bos, *pre.tokenizer(head + typed)["input_ids"]]
    assert pre.lines.hits == before + 1  # the second prompt's head came from the cache
    # the FIM prompt: the BOS, then the layout
    out = pre.tensors(request([PREFIX.encode()], [SUFFIX.encode()]))
    sentinels = pre.tokenizer.convert_tokens_to_ids(list(STARCODER_TOKENS))
    assert prompt_row(out)[:2] == [bos, sentinels[0]]
    assert fim_text(folder, out, pre.encode(MIDDLE)) == PREFIX + MIDDLE


def test_the_leading_space_comes_off_either_kind_of_sentencepiece_tokenizer(spiece, gptj):
    vocab, merges = spiece
    for legacy in (False, True):
        tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
        if legacy:  # transformers' older Llama conversion: the space in the normalizer
            tokenizer.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
            )
        else:
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        assert tokenizer.encode("\n  return").tokens[0].startswith("▁")
        bare = without_leading_space(tokenizer)
        assert bare is not None
        assert "".join(bare.encode("\n  return").tokens) == "\n▁▁return"
    gpt = PreTrainedTokenizerFast.from_pretrained(str(gptj)).backend_tokenizer
    assert without_leading_space(gpt) is None
