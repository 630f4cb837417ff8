"""Token healing through the server: the ensemble's OUTPUT_0 is still exactly the prompt plus
the completion, a stream sends the completion alone (never the held-back text again), both
equal transformers' ``generate(token_healing=True)``, and ``token_healing`` false sends the
prompt whole, as before."""

from __future__ import annotations

import re

import pytest
import torch
from server_metrics import scrape
from transformers import AutoModelForCausalLM, AutoTokenizer

from client import CodegenClient, CompletionRequest
from contract import metrics as names
from contract.finish import FINISH_REASONS
from preprocessing.tokenize import Preprocessor

# Prompts of the tiny model whose last token heals ('re' -> 'return', ' =' -> ' ==', ...).
PROMPTS = ("def f(x):\n    re", "import os\nim", "x =")
NEW = 12


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tokenizer.pad_token = tokenizer.eos_token  # heal_tokens pads its re-tokenized prompts
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    return tokenizer, model


def healed(reference, prompt: str) -> str:
    """transformers' greedy text with token healing: its healed token, then NEW - 1 more (the
    server counts the healed token among the NEW it generates)."""
    tokenizer, model = reference
    encoded = tokenizer(prompt, return_tensors="pt")
    out = model.generate(
        **encoded, max_new_tokens=NEW - 1, do_sample=False, token_healing=True, tokenizer=tokenizer
    )
    return tokenizer.decode(out[0], skip_special_tokens=True)


def plain(reference, prompt: str) -> str:
    tokenizer, model = reference
    encoded = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**encoded, max_new_tokens=NEW, do_sample=False)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def test_the_prompts_heal(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    assert all(pre.extensions.heals(pre.encode(p)[-1]) for p in PROMPTS)


def test_ensemble_and_stream_return_the_prompt_and_the_healed_completion(server, reference):
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        for prompt in PROMPTS:
            unary = codegen.send(CompletionRequest(prompt, max_tokens=NEW))[0]
            assert unary.text == prompt + unary.completion  # OUTPUT_0: the prompt, byte for byte
            assert unary.text == healed(reference, prompt), prompt
            stream = codegen.open_stream(CompletionRequest(prompt, max_tokens=NEW))
            with stream:
                pieces = list(stream)
            assert "".join(pieces) == unary.completion, prompt


def test_token_healing_false_sends_the_prompt_whole(server, reference):
    with CodegenClient(server.http_url, "http") as codegen:
        for prompt in PROMPTS:
            request = CompletionRequest(prompt, max_tokens=NEW, token_healing=False)
            unary = codegen.send(request)[0]
            assert unary.text == plain(reference, prompt), prompt


def fallback_requests(server) -> float:
    """Every sequence the engine sent to its torch fallback, whatever the reason."""
    pattern = rf"^{names.ENGINE_FALLBACK_REQUESTS}{{[^}}]*}} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, scrape(server), re.MULTILINE))


def test_the_openvino_pipeline_heals_a_default_request_itself(openvino_server):
    """With the default fallback "none" a default request that heals must not need the torch
    engine (it would be refused): the export written as `make model` writes it carries the
    tokenizer, so the pipeline heals it, and no sequence reaches the fallback."""
    before = fallback_requests(openvino_server)
    with CodegenClient(openvino_server.grpc_url, "grpc") as codegen:
        for prompt in PROMPTS:
            unary = codegen.send(CompletionRequest(prompt, max_tokens=NEW))[0]
            assert unary.text == prompt + unary.completion, prompt
            assert unary.finish_reason in FINISH_REASONS, prompt
    assert fallback_requests(openvino_server) == before
