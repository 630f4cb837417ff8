"""The fill-in-the-middle layouts alone (contract/fim.py: StarCoder, CodeLlama, Qwen2.5-Coder,
DeepSeek-Coder sentinels, the prompt orders each was trained on, what an answer hides), and how
the API learns whether the served model takes a ``suffix`` (``/v1/models``' ``fim`` field)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import httpx
import pytest

from contract.fim import NO_FIM, FimLayout
from contract.model_tokens import (
    CODEGEN2_TOKENS,
    CODELLAMA_TOKENS,
    DEEPSEEK_TOKENS,
    QWEN_PAD,
    QWEN_TOKENS,
    STARCODER_TOKENS,
)

# -- the layouts, unit level --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "names"),
    [
        ("starcoder", STARCODER_TOKENS),
        ("codellama", CODELLAMA_TOKENS),
        ("qwen", (*QWEN_TOKENS, QWEN_PAD)),
        ("deepseek", DEEPSEEK_TOKENS),
    ],
)
def test_each_layout_puts_prefix_suffix_and_middle_sentinels_and_hides_them(style, names):
    layout = FimLayout(style, {name: 1 + i for i, name in enumerate(names)})
    prompt = layout.prompt([10, 11], [20, 21])
    assert prompt == [1, 10, 11, 2, 20, 21, 3]  # PSM: <pre> P <suf> S <mid>
    assert layout.visible([*prompt, 30, 31]) == [10, 11, 30, 31]
    assert layout.visible([10, 2, 11]) == [10, 11]  # a sentinel the model wrote, hidden
    assert layout.sentinels == frozenset(range(1, len(names) + 1))  # <EOT>, <|fim_pad|> too
    if style in ("starcoder", "codellama"):  # trained on SPM as well
        spm = FimLayout(style, layout.ids, order="spm")
        assert spm.prompt([10, 11], [20, 21]) == [1, 2, 20, 21, 3, 10, 11]
        assert spm.visible([*spm.prompt([10, 11], [20, 21]), 30]) == [10, 11, 30]
    else:
        with pytest.raises(ValueError, match=f"the {style} layout has no such prompt order"):
            FimLayout(style, layout.ids, order="spm")
    assert layout.stop == ([4] if style == "codellama" else None)  # <EOT> ends a middle


def test_qwen_ends_a_middle_with_its_end_token_which_it_does_not_hide():
    layout = FimLayout(
        "qwen", dict(zip((*QWEN_TOKENS, "<|endoftext|>"), (1, 2, 3, 0), strict=True))
    )
    assert layout.stop == [0] and 0 not in layout.sentinels


def test_no_fim_lists_every_layout():
    for tokens in (STARCODER_TOKENS, CODELLAMA_TOKENS, QWEN_TOKENS, DEEPSEEK_TOKENS):
        assert "/".join(tokens) in NO_FIM
    assert "/".join(CODEGEN2_TOKENS[:3]) in NO_FIM and NO_FIM.startswith("`suffix` asks")


class _FakeTriton:
    """tritonclient.grpc's client, answering the preprocessing question as told."""

    answer: ClassVar[Exception | None] = None
    asked: ClassVar[list] = []

    def __init__(self, address: str, ssl: bool = False) -> None:
        self.address = address

    def infer(self, model, inputs, outputs=None, client_timeout=None):
        _FakeTriton.asked.append((model, {i.name(): i.datatype() for i in inputs}))
        if self.answer is not None:
            raise self.answer
        return object()

    def close(self) -> None:
        pass


def test_takes_suffix_asks_the_preprocessing_model(monkeypatch):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from openai_api.capabilities import takes_suffix

    monkeypatch.setattr(grpcclient, "InferenceServerClient", _FakeTriton)
    monkeypatch.setattr(_FakeTriton, "answer", None)
    assert takes_suffix("localhost:8001") is True
    model, inputs = _FakeTriton.asked[-1]
    assert model == "preprocessing" and inputs["suffix"] == "BYTES"
    monkeypatch.setattr(_FakeTriton, "answer", InferenceServerException(f"in model: {NO_FIM}"))
    assert takes_suffix("localhost:8001") is False
    monkeypatch.setattr(_FakeTriton, "answer", InferenceServerException("no such model"))
    assert takes_suffix("localhost:8001") is None


@pytest.fixture(scope="module")
def api(server, tiny_checkpoint) -> Iterator:
    from api_server import ApiServer

    from openai_api import Settings

    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


def test_v1_models_says_whether_the_served_model_takes_a_suffix(api, monkeypatch):
    import openai_api.routes

    (entry,) = httpx.get(f"{api.url}/v1/models", timeout=60).json()["data"]
    assert entry["id"] == "codegen" and entry["fim"] is True  # the default model's StarCoder
    monkeypatch.setattr(openai_api.routes, "takes_suffix", lambda url: False)
    (entry,) = httpx.get(f"{api.url}/v1/models", timeout=60).json()["data"]
    assert entry["fim"] is False
