"""Beam search through the running server: the ensemble, the client library and the command."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from transformers import GPTJForCausalLM, PreTrainedTokenizerFast
from tritonclient.utils import InferenceServerException

from client import CodegenClient
from client.cli import EXIT_OK, EXIT_USAGE, main
from client.request import CompletionRequest, requested_outputs, to_infer_inputs
from contract.options import InvalidRequestError

PROMPT = "def add(a, b):\n"
PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
    model = GPTJForCausalLM.from_pretrained(str(tiny_checkpoint)).eval()
    return tokenizer, model


def hf_beam_texts(reference, prompt: str, new: int, width: int) -> list[str]:
    """transformers' beams (length_penalty 0, the model's end token ending a beam)."""
    tokenizer, model = reference
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=new,
            num_beams=width,
            num_return_sequences=width,
            do_sample=False,
            length_penalty=0.0,
            pad_token_id=tokenizer.eos_token_id,
        )
    return tokenizer.batch_decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_ensemble_returns_k_beams_best_first_as_transformers(server, reference, protocol):
    module = PROTOCOLS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    request = CompletionRequest(PROMPT, max_tokens=12, beam_width=4)
    result = module.InferenceServerClient(url).infer(
        "ensemble", request.infer_inputs(module), outputs=requested_outputs(module)
    )
    texts = [t.decode() for t in result.as_numpy("OUTPUT_0").reshape(-1)]
    assert len(texts) == 4  # flat [prompt * beam], as the FasterTransformer ensemble's
    assert texts == hf_beam_texts(reference, PROMPT, 12, 4)
    cum = result.as_numpy("cum_log_probs").reshape(1, 4)[0]
    assert list(cum) == sorted(cum, reverse=True) and np.all(cum < 0)
    assert result.as_numpy("sequence_length").reshape(1, 4).shape == (1, 4)


def test_client_returns_each_prompts_beams_with_their_log_probs(server, reference):
    with CodegenClient(server.grpc_url) as codegen:
        completion = codegen.complete(PROMPT, 12, beam_width=3)
        batch = codegen.complete_batch([PROMPT, "import os\n"], 8, beam_width=2)
        greedy = codegen.complete(PROMPT, 12)
    assert [beam.text for beam in completion.beams] == hf_beam_texts(reference, PROMPT, 12, 3)
    assert completion.text == completion.beams[0].text
    assert completion.cum_log_prob == completion.beams[0].cum_log_prob
    log_probs = [beam.cum_log_prob for beam in completion.beams]
    assert log_probs == sorted(log_probs, reverse=True)
    assert greedy.beams is None  # width 1: as before
    assert [len(c.beams) for c in batch] == [2, 2]
    assert [b.text for b in batch[0].beams] == hf_beam_texts(reference, PROMPT, 8, 2)
    assert [b.text for b in batch[1].beams] == hf_beam_texts(reference, "import os\n", 8, 2)


def test_widths_over_the_limit_and_streams_are_refused_clearly(server):
    with CodegenClient(server.grpc_url) as codegen:
        with pytest.raises(Exception, match=r"beam_width=9 is over this server's limit of 8"):
            codegen.complete(PROMPT, 4, beam_width=9)
        with pytest.raises(InvalidRequestError, match="beam_width=2 cannot stream"):
            codegen.stream(PROMPT, 4, beam_width=2)
        assert codegen.complete(PROMPT, 4).text.startswith(PROMPT)  # still serving
    # the streaming model refuses it too, for clients that skip the library's check
    tensors = CompletionRequest(PROMPT, max_tokens=4).tensors()
    tensors["beam_width"] = np.array([[2]], dtype=np.uint32)
    messages = []
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    stream.start_stream(callback=lambda result, error: messages.append(error))
    stream.async_stream_infer("ensemble_stream", to_infer_inputs(tensors, grpcclient))
    stream.stop_stream()
    assert any(e is not None and "beam_width=2 cannot stream" in str(e) for e in messages)
    mixed = {**CompletionRequest([PROMPT, PROMPT], max_tokens=4).tensors()}
    mixed["beam_width"] = np.array([[2], [3]], dtype=np.uint32)
    with pytest.raises(InferenceServerException, match="beam_width differs between the prompts"):
        httpclient.InferenceServerClient(server.http_url).infer(
            "ensemble", to_infer_inputs(mixed, httpclient)
        )


def test_command_prints_every_beam(server, capsys):
    code = main(["complete", "--url", server.grpc_url, "--beams", "3", "--max-tokens", "6", PROMPT])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert out.count("--- beam ") == 3 and "--- beam 1: log-prob -" in out
    code = main(["complete", "--url", server.grpc_url, "--beams", "2", "--stream", PROMPT])
    assert code == EXIT_USAGE
    assert "invalid --beams: beam_width=2 cannot stream" in capsys.readouterr().err
