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
from transformers import GPTJForCausalLM, PreTrainedTokenizerFast
from tritonclient.utils import InferenceServerException

from client import CodegenClient
from client.request import CompletionRequest, requested_outputs
from contract.tensors import PREPROCESSING_MODEL, STREAM_MODEL

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n    return total\n"


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
    model = GPTJForCausalLM.from_pretrained(str(tiny_checkpoint)).eval()
    return tokenizer, model


def fim_greedy(
    reference, prefix: str, suffix: str, new: int, order: str = "spm"
) -> tuple[str, int, int]:
    """transformers' greedy middle for the StarCoder SPM prompt (the order the project's model
    is built for, so the server's default) or PSM prompt, the prompt's tokens and the generated
    ones (the end token not counted, as the server counts)."""
    tokenizer, model = reference
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    pre, suf, mid = tokenizer.convert_tokens_to_ids(
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    )
    ids = [pre, *encode(prefix), suf, *encode(suffix), mid]
    if order == "spm":
        ids = [pre, suf, *encode(suffix), mid, *encode(prefix)]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0
        )[0].tolist()
    generated = out[len(ids) :]
    if generated and generated[-1] == tokenizer.eos_token_id:
        generated = generated[:-1]
    middle = tokenizer.decode(generated, skip_special_tokens=True)
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
    for model in (PREPROCESSING_MODEL, STREAM_MODEL):
        config = repo / model / "config.pbtxt"
        assert auto in config.read_text()
        config.write_text(config.read_text().replace(auto, auto.replace("auto", "psm")))
    yield from serve(repo, tmp_path_factory)


def test_fim_order_psm_reaches_both_paths(psm_server, reference):
    middle, prompt, generated = fim_greedy(reference, PREFIX, SUFFIX, 12, order="psm")
    assert middle != fim_greedy(reference, PREFIX, SUFFIX, 12)[0]  # the orders tell apart
    with CodegenClient(psm_server.grpc_url, "grpc") as codegen:
        unary = codegen.send(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))[0]
        stream = codegen.open_stream(CompletionRequest(PREFIX, max_tokens=12, suffix=SUFFIX))
        with stream:
            pieces = list(stream)
    assert unary.text == PREFIX + middle
    assert "".join(pieces) == middle
    done = stream.completion
    assert done is not None
    assert (done.prompt_tokens, done.completion_tokens) == (prompt, generated)
