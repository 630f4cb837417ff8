"""Fill-in-the-middle through the real server on the tiny model (which has the default model's
FIM tokens): the optional ``suffix`` input of ``ensemble`` and ``ensemble_stream``, equal to
transformers' greedy search on the same FIM prompt, and old clients unchanged."""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import serve
from transformers import GPTJForCausalLM, LogitsProcessorList, PreTrainedTokenizerFast
from tritonclient.utils import InferenceServerException

from client import CodegenClient
from client.request import CompletionRequest, requested_outputs
from contract.healing import TokenExtensions
from contract.tensors import ENGINE_MODEL, PREPROCESSING_MODEL
from evaluation.local import FirstTokenMask
from preprocessing.token_texts import tokenizer_texts

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n    return total\n"


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
    model = GPTJForCausalLM.from_pretrained(str(tiny_checkpoint)).eval()
    extensions = TokenExtensions(tokenizer_texts(tokenizer), tokenizer.all_special_ids)
    return tokenizer, model, extensions


def fim_greedy(
    reference, prefix: str, suffix: str, new: int, order: str = "spm", heal: bool = True
) -> tuple[str, int, int]:
    """transformers' greedy middle for the StarCoder SPM prompt (the order the project's model
    is built for, so the server's default) or PSM prompt, the prompt's tokens and the generated
    ones (the end token not counted, as the server counts). ``heal``: the prefix's last token
    held back when a longer token starts with it, and the first token made to extend it (the
    server's default, docs/generation.md#token-healing)."""
    tokenizer, model, extensions = reference
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    pre, suf, mid = tokenizer.convert_tokens_to_ids(
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    )
    before, after = encode(prefix), encode(suffix)
    allowed = extensions.allowed(before[-1]) if heal and before else ()
    kept = before[:-1] if len(allowed) > 1 else before
    ids = [pre, *kept, suf, *after, mid] if order == "psm" else [pre, suf, *after, mid, *kept]
    processors = [FirstTokenMask(len(ids), allowed)] if kept != before else []
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            logits_processor=LogitsProcessorList(processors),
        )[0].tolist()
    generated = out[len(ids) :]
    if generated and generated[-1] == tokenizer.eos_token_id:
        generated = generated[:-1]
    decode = lambda i: tokenizer.decode(i, skip_special_tokens=True)  # noqa: E731
    middle = decode(kept + generated)[len(decode(before)) :]
    return middle, len(ids), len(generated)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_ensemble_fills_the_middle_as_transformers_does(server, reference, protocol):
    module = PROTOCOLS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    request = CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX)
    result = module.InferenceServerClient(url).infer(
        "ensemble", request.infer_inputs(module), outputs=requested_outputs(module)
    )
    middle, prompt, generated = fim_greedy(reference, PREFIX, SUFFIX, 12)
    text = result.as_numpy("OUTPUT_0").reshape(-1)[0].decode()
    assert text == PREFIX + middle  # the prefix and the middle: no suffix, no sentinel
    assert "<fim_" not in text
    assert int(result.as_numpy("sequence_length").reshape(-1)[0]) == prompt + generated


def test_the_stream_sends_the_middle_alone_and_the_client_library_splits_it(server, reference):
    middle, prompt, generated = fim_greedy(reference, PREFIX, SUFFIX, 12)
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        stream = codegen.open_stream(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))
        with stream:
            pieces = list(stream)
        unary = codegen.send(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))[0]
    assert "".join(pieces) == middle == unary.completion
    assert unary.text == PREFIX + middle
    done = stream.completion
    assert done is not None
    assert (done.prompt_tokens, done.completion_tokens) == (prompt, generated)


def test_an_empty_prefix_is_a_valid_fim_request_and_an_empty_suffix_is_plain(server, reference):
    middle, _, _ = fim_greedy(reference, "", "    return 1\n", 8)
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        empty_prefix = codegen.send(CompletionRequest("", max_tokens=8, suffix="    return 1\n"))[0]
        plain = codegen.send(CompletionRequest(PREFIX, max_tokens=8))[0]
        empty_suffix = codegen.send(CompletionRequest(PREFIX, max_tokens=8, suffix=""))[0]
    assert empty_prefix.text == middle
    assert empty_suffix.text == plain.text and plain.text.startswith(PREFIX)


def test_generate_endpoint_takes_suffix_and_old_bodies_still_work(server, reference):
    def generate(body: dict) -> dict:
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/ensemble/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    old = {"INPUT_0": PREFIX, "INPUT_1": 12, "INPUT_2": "", "INPUT_3": ""}
    middle, _, _ = fim_greedy(reference, PREFIX, SUFFIX, 12)
    assert generate(old | {"suffix": SUFFIX})["OUTPUT_0"] == PREFIX + middle
    assert generate(old)["OUTPUT_0"].startswith(PREFIX)  # a FasterTransformer body, unchanged


def test_token_healing_false_sends_the_prefix_whole(server, reference):
    middle, prompt, _ = fim_greedy(reference, PREFIX, SUFFIX, 12, heal=False)
    assert middle != fim_greedy(reference, PREFIX, SUFFIX, 12)[0]
    with CodegenClient(server.grpc_url, "grpc") as codegen:
        request = CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX, token_healing=False)
        whole = codegen.send(request)[0]
    assert whole.text == PREFIX + middle and whole.prompt_tokens == prompt


def test_a_suffix_row_per_prompt_is_required(server):
    module = grpcclient
    request = CompletionRequest(("a = ", "b = "), max_tokens=4, suffix=("\n", "\n"))
    inputs = request.infer_inputs(module)
    bad = [i for i in inputs if i.name() != "suffix"]
    suffix = module.InferInput("suffix", [1, 1], "BYTES")
    suffix.set_data_from_numpy(request.tensors()["suffix"][:1])
    with pytest.raises(InferenceServerException, match="suffix"):
        module.InferenceServerClient(server.grpc_url).infer("ensemble", [*bad, suffix])


@pytest.fixture(scope="module")
def psm_server(model_repository, tmp_path_factory):
    """The tiny model's server with ``fim_order`` psm in both models that build prompts."""
    repo = tmp_path_factory.mktemp("psm") / "model_repository"
    shutil.copytree(model_repository, repo, symlinks=True)
    auto = 'key: "fim_order" value: { string_value: "auto" }'
    for model in (PREPROCESSING_MODEL, ENGINE_MODEL):
        config = repo / model / "config.pbtxt"
        assert auto in config.read_text()
        config.write_text(config.read_text().replace(auto, auto.replace("auto", "psm")))
    yield from serve(repo, tmp_path_factory)


def test_fim_order_psm_reaches_both_paths(psm_server, reference):
    whole = fim_greedy(reference, PREFIX, SUFFIX, 12, order="psm", heal=False)[0]
    assert whole != fim_greedy(reference, PREFIX, SUFFIX, 12, heal=False)[0]  # orders differ
    middle, prompt, generated = fim_greedy(reference, PREFIX, SUFFIX, 12, order="psm")
    with CodegenClient(psm_server.grpc_url, "grpc") as codegen:
        request = CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX, token_healing=False)
        assert codegen.send(request)[0].text == PREFIX + whole
        unary = codegen.send(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))[0]
        stream = codegen.open_stream(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))
        with stream:
            pieces = list(stream)
    assert unary.text == PREFIX + middle  # healed inside the PSM layout
    assert "".join(pieces) == middle
    done = stream.completion
    assert done is not None
    assert (done.prompt_tokens, done.completion_tokens) == (prompt, generated)
