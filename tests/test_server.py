"""The real Triton server on the tiny model: every generation behaviour, over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import urllib.request

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from engine_hold import engine_held, submitted, wait_for
from server_metrics import sample, scrape, settled_scrape
from transformers import GPTJForCausalLM, PreTrainedTokenizerFast
from tritonclient.utils import InferenceServerException

from client.request import CompletionRequest, requested_outputs, to_infer_inputs
from contract import metrics as names

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """transformers' own model and tokenizer on the checkpoint the server serves."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_checkpoint))
    model = GPTJForCausalLM.from_pretrained(str(tiny_checkpoint)).eval()
    return tokenizer, model


def client(server, protocol: str):
    url = server.http_url if protocol == "http" else server.grpc_url
    return PROTOCOLS[protocol].InferenceServerClient(url)


def infer(server, protocol: str, request: CompletionRequest):
    module = PROTOCOLS[protocol]
    return client(server, protocol).infer(
        "ensemble", request.infer_inputs(module), outputs=requested_outputs(module)
    )


def texts(result) -> list[str]:
    return [t.decode() for t in result.as_numpy("OUTPUT_0").reshape(-1)]


def hf_greedy(reference, prompt: str, new: int, **kwargs) -> tuple[str, int]:
    """transformers' greedy text (stopping at the model's end token, as the server does) and
    the sequence length the server should report (prompt + generated, end token excluded)."""
    tokenizer, model = reference
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)
    tokens = out[0].tolist()
    if tokens[-1] == tokenizer.eos_token_id and len(tokens) > ids.shape[1]:
        tokens = tokens[:-1]
    text = tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return text, len(tokens)


def hf_greedy_text(reference, prompt: str, new: int, **kwargs) -> str:
    return hf_greedy(reference, prompt, new, **kwargs)[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_greedy_completion_matches_transformers(server, reference, protocol):
    result = infer(server, protocol, CompletionRequest(PROMPT, max_tokens=24))
    text = texts(result)[0]
    expected_text, expected_length = hf_greedy(reference, PROMPT, 24)
    assert text.startswith(PROMPT)
    assert text == expected_text
    assert result.as_numpy("sequence_length").reshape(-1)[0] == expected_length


def test_batch_of_prompts_in_one_request_gets_each_its_own_completion(server, reference):
    prompts = ("import os\n", "class Point:\n    def __init__(self, x, y):\n", "for i in")
    result = infer(server, "grpc", CompletionRequest(prompts, max_tokens=10))
    got = texts(result)
    assert len(got) == 3
    for prompt, text in zip(prompts, got, strict=True):
        assert text == hf_greedy_text(reference, prompt, 10)


def test_sampling_options_seed_and_penalties(server, reference):
    sampled = CompletionRequest(
        PROMPT, max_tokens=20, top_k=40, top_p=0.95, temperature=1.3, seed=123
    )
    first = texts(infer(server, "http", sampled))[0]
    assert texts(infer(server, "grpc", sampled))[0] == first
    other = CompletionRequest(PROMPT, max_tokens=20, top_k=40, top_p=0.95, temperature=1.3, seed=9)
    assert texts(infer(server, "http", other))[0] != first
    penalised = texts(infer(server, "http", CompletionRequest(PROMPT, 24, repetition_penalty=1.5)))
    assert penalised[0] == hf_greedy_text(reference, PROMPT, 24, repetition_penalty=1.5)


def test_same_seed_same_text_whatever_else_is_in_the_batch(server):
    target = CompletionRequest(PROMPT, max_tokens=16, top_k=50, temperature=1.5, seed=2024)
    alone = texts(infer(server, "grpc", target))[0]
    noise = [
        CompletionRequest(f"x = {i}\n", max_tokens=8 + 4 * i, top_p=0.9, seed=i) for i in range(8)
    ]
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(infer, server, "grpc", r) for r in [*noise[:4], target, *noise[4:]]]
        results = [texts(f.result())[0] for f in futures]
    assert results[4] == alone


def test_log_probs_sum_and_match_the_model(server, reference):
    tokenizer, model = reference
    result = infer(server, "http", CompletionRequest(PROMPT, 8, return_log_probs=True))
    output = result.as_numpy("output_log_probs").reshape(-1)
    cum = result.as_numpy("cum_log_probs").reshape(-1)[0]
    assert output.shape == (8,) and np.all(output < 0)
    assert cum == pytest.approx(output.sum(), rel=1e-5)
    prompt_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    prompt_len = prompt_ids.shape[1]
    with torch.no_grad():  # the model's own greedy tokens: their text need not re-tokenize so
        ids = model.generate(prompt_ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        logp = torch.log_softmax(model(ids).logits[0], -1)
    assert texts(result)[0] == tokenizer.decode(ids[0])  # the server's greedy tokens too
    expected = [logp[prompt_len - 1 + i, ids[0, prompt_len + i]].item() for i in range(8)]
    np.testing.assert_allclose(output, expected, atol=1e-3)


def generated_ids(reference, prompt: str, new: int) -> list[int]:
    tokenizer, _ = reference
    _, length = hf_greedy(reference, prompt, new)
    prompt_len = len(tokenizer.encode(prompt))
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = reference[1].generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, prompt_len:length].tolist()


def single_token_words(reference, ids: list[int]) -> list[tuple[int, int]]:
    """(position, id) of generated tokens whose text encodes back to exactly that token."""
    tokenizer, _ = reference
    return [(i, t) for i, t in enumerate(ids) if tokenizer.encode(tokenizer.decode([t])) == [t]]


def test_stop_words_end_generation(server, reference):
    tokenizer, _ = reference
    ids = generated_ids(reference, PROMPT, 30)
    token = next(t for i, t in single_token_words(reference, ids) if i >= 3)
    first = ids.index(token)
    stop_word = tokenizer.decode([token])
    stopped = infer(server, "http", CompletionRequest(PROMPT, 30, stop_words=(stop_word, "zzzq")))
    # the first token whose text completes the word: ``token`` itself at the latest
    end = next(k for k in range(first + 1) if stop_word in tokenizer.decode(ids[: k + 1]))
    assert texts(stopped)[0] == PROMPT + tokenizer.decode(ids[: end + 1])
    assert (
        stopped.as_numpy("sequence_length").reshape(-1)[0]
        == len(tokenizer.encode(PROMPT)) + end + 1
    )


def test_bad_words_are_never_produced(server, reference):
    tokenizer, _ = reference
    ids = generated_ids(reference, PROMPT, 30)
    _, token = single_token_words(reference, ids)[0]
    word = tokenizer.decode([token])
    clean = texts(infer(server, "grpc", CompletionRequest(PROMPT, 30, bad_words=(word,))))[0]
    assert clean == hf_greedy_text(reference, PROMPT, 30, bad_words_ids=[[token]])
    assert clean != hf_greedy_text(reference, PROMPT, 30)


def test_end_id_inside_the_vocabulary_stops_generation(server, reference):
    tokenizer, _ = reference
    ids = generated_ids(reference, PROMPT, 20)
    end_id = ids[3]
    result = infer(server, "http", CompletionRequest(PROMPT, 20, end_id=end_id))
    prompt_len = len(tokenizer.encode(PROMPT))
    assert result.as_numpy("sequence_length").reshape(-1)[0] == prompt_len + ids.index(end_id)
    assert texts(result)[0] == PROMPT + tokenizer.decode(ids[: ids.index(end_id)])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server, protocol):
    module = PROTOCOLS[protocol]
    good = CompletionRequest(PROMPT, max_tokens=4)
    cases = {
        "beam_width=9 is over this server's limit of 8": {
            "beam_width": np.array([[9]], dtype=np.uint32)
        },
        "runtime_top_p must be in [0, 1]": {"runtime_top_p": np.array([[1.5]], dtype=np.float32)},
        "empty prompt": {"INPUT_0": np.array([[b""]], dtype=object)},
        "exceeds the model's context": {"INPUT_1": np.array([[100000]], dtype=np.uint32)},
        "not valid UTF-8": {"INPUT_0": np.array([[b"\xff\xfe"]], dtype=object)},
    }
    for message, override in cases.items():
        tensors = {**good.tensors(), **override}
        with pytest.raises(InferenceServerException, match=message.replace("[", r"\[")):
            client(server, protocol).infer("ensemble", to_infer_inputs(tensors, module))
    assert texts(infer(server, protocol, good))[0].startswith(PROMPT)


def metric(text: str, name: str, model: str) -> float:
    value = sample(text, name, model)
    assert value is not None, f"{name} for {model} not in the metrics"
    return value


def test_burst_of_mixed_lengths_is_batched_and_each_gets_what_it_asked(server, reference):
    """24 concurrent requests, 4 to 32 tokens each, over both protocols: each gets exactly its
    own greedy continuation (ending early only at the model's end token)."""
    tokenizer, _ = reference
    before = settled_scrape(server)
    prompts = [f"def f{i}(x):\n" + "    y = x\n" * (i % 4) for i in range(24)]
    lengths = [4 + (7 * i) % 29 for i in range(24)]

    protocols = ["grpc" if i % 2 else "http" for i in range(24)]
    clients = [client(server, protocol) for protocol in protocols]  # connect before the burst
    start = threading.Barrier(24)

    def one(i: int):
        module = PROTOCOLS[protocols[i]]
        request = CompletionRequest(prompts[i], max_tokens=lengths[i])
        inputs, outputs = request.infer_inputs(module), requested_outputs(module)
        start.wait()  # all 24 leave together: a real burst
        return clients[i].infer("ensemble", inputs, outputs=outputs)

    # by construction, not by the machine's speed: the engine holds after one step
    # (tests/engine_hold.py) until the whole burst has been submitted to it, so that it takes
    # them into one batch
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        first = submitted(server)
        with engine_held(server, after_steps=0):
            futures = [pool.submit(one, i) for i in range(24)]
            wait_for(lambda: submitted(server) >= first + 24, "the burst never reached the engine")
        results = [future.result() for future in futures]
    expected_tokens = 0
    for prompt, new, result in zip(prompts, lengths, results, strict=True):
        text, length = hf_greedy(reference, prompt, new)
        assert result.as_numpy("sequence_length").reshape(-1)[0] == length
        assert texts(result)[0] == text
        expected_tokens += length - len(tokenizer.encode(prompt))
    after = settled_scrape(server)
    for stage in ("ensemble", "preprocessing", "gptj", "postprocessing", "engine"):
        delta = metric(after, names.INFERENCE_COUNT, stage) - metric(
            before, names.INFERENCE_COUNT, stage
        )
        assert delta == 24
    # and the engine (behind gptj) really ran several sequences per forward pass
    steps = metric(after, names.ENGINE_STEPS, "engine") - metric(
        before, names.ENGINE_STEPS, "engine"
    )
    rows = metric(after, names.ENGINE_STEP_ROWS, "engine") - metric(
        before, names.ENGINE_STEP_ROWS, "engine"
    )
    assert rows / steps > 2
    generated = metric(after, names.ENGINE_GENERATED_TOKENS, "engine") - metric(
        before, names.ENGINE_GENERATED_TOKENS, "engine"
    )
    assert generated == expected_tokens


def test_engine_model_config_shows_the_checkpoint(server):
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("engine")
    assert config["parameters"]["checkpoint_path"]["string_value"] == "../gptj/1/checkpoint"
    assert config["backend"] == "python"


def test_every_metric_the_dashboards_alerts_and_autoscaler_query_is_exported(server):
    """The deployment's Grafana dashboard, alert rules and HPA rule query only live metrics."""
    from deploy_metrics import referenced_metric_names

    infer(server, "http", CompletionRequest(PROMPT, 2))
    exported = {line.split("{")[0] for line in scrape(server).splitlines() if line[:1].isalpha()}
    missing = referenced_metric_names() - exported
    assert not missing, f"queried but not exported by this Triton: {missing}"


def post_json(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_plain_json_clients_as_in_the_readme(server, reference):
    """The README's curl examples: KServe JSON /infer and the generate extension."""
    inputs = [
        {"name": "INPUT_0", "datatype": "BYTES", "shape": [1, 1], "data": [PROMPT]},
        {"name": "INPUT_1", "datatype": "UINT32", "shape": [1, 1], "data": [12]},
        {"name": "INPUT_2", "datatype": "BYTES", "shape": [1, 1], "data": [""]},
        {"name": "INPUT_3", "datatype": "BYTES", "shape": [1, 1], "data": ["\n\n"]},
    ]
    answer = post_json(server, "/v2/models/ensemble/infer", {"inputs": inputs})
    text = next(o for o in answer["outputs"] if o["name"] == "OUTPUT_0")["data"][0]
    assert text.startswith(PROMPT)
    generated = post_json(
        server,
        "/v2/models/ensemble/generate",
        {"INPUT_0": PROMPT, "INPUT_1": 12, "INPUT_2": "", "INPUT_3": ""},
    )
    assert generated["OUTPUT_0"] == hf_greedy_text(reference, PROMPT, 12)
