"""Overload gets a fast, clear rejection: with the engine full and the engine model's queue at
its bound, the next request is refused at once instead of waiting without end (the model stage
passes each request straight on to the engine model, whose queue is where overload waits)."""

from __future__ import annotations

import json
import queue
import re
import shutil
import time

import pytest
import torch
import tritonclient.grpc as grpcclient
from server_metrics import sample, scrape
from transformers import GPTJConfig, GPTJForCausalLM

from client.request import CompletionRequest, requested_outputs
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL
from serving.paths import checkpoint_dir
from serving.process import free_ports
from serving.triton import Ports, TritonServer

QUEUE = 2  # the engine model's max_queue_size in this test's copy of the repository


@pytest.fixture(scope="module")
def small_server(model_repository, tmp_path_factory):
    """The project's repository with one engine row and a queue of two for the engine model,
    serving a random model wide and long enough that one request keeps the engine busy for
    seconds (the tiny test model would finish before the queue fills)."""
    repo = tmp_path_factory.mktemp("overload") / "model_repository"
    shutil.copytree(model_repository, repo)
    checkpoint = checkpoint_dir(repo)
    tiny = json.loads((checkpoint / "config.json").read_text())
    torch.manual_seed(0)
    slow = GPTJConfig(
        vocab_size=tiny["vocab_size"], n_positions=2048, n_embd=512, n_layer=8, n_head=8,
        rotary_dim=16, bos_token_id=tiny["bos_token_id"], eos_token_id=tiny["eos_token_id"],
    )  # fmt: skip
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    GPTJForCausalLM(slow).save_pretrained(checkpoint)  # beside the tiny model's tokenizer
    config = repo / ENGINE_MODEL / "config.pbtxt"
    text = config.read_text()
    text = re.sub(r'("engine_max_batch_size" value: \{ string_value: )"\d+"', r'\1"1"', text)
    text = re.sub(r"max_queue_size: \d+", f"max_queue_size: {QUEUE}", text)
    assert '"1"' in text and f"max_queue_size: {QUEUE}" in text
    config.write_text(text)
    log = tmp_path_factory.mktemp("logs") / "overload.log"
    triton = TritonServer(repo, Ports(*free_ports(3)), log_file=log)
    triton.start()
    try:
        triton.wait_ready(timeout=240)
        yield triton
    finally:
        triton.stop()


def running(server) -> float:
    return sample(scrape(server), names.ENGINE_RUNNING, ENGINE_MODEL) or 0.0


def test_a_full_queue_rejects_at_once_and_the_server_keeps_serving(small_server):
    client = grpcclient.InferenceServerClient(small_server.grpc_url)
    answers: queue.Queue = queue.Queue()

    def send(tag: str, tokens: int) -> None:
        request = CompletionRequest(("def f(x):\n",), max_tokens=tokens)
        client.async_infer(
            ENSEMBLE_MODEL,
            request.infer_inputs(grpcclient),
            callback=lambda result, error, tag=tag: answers.put((tag, time.monotonic(), error)),
            outputs=requested_outputs(grpcclient),
        )

    send("running", 2000)  # takes the engine's only row for seconds
    deadline = time.monotonic() + 60
    while running(small_server) < 1:
        assert time.monotonic() < deadline, f"the first request never started: {answers.queue}"
        time.sleep(0.05)
    send("waiting for room", 4)  # the engine model's execute waits for engine room
    time.sleep(0.5)
    for i in range(QUEUE):  # then the queue fills
        send(f"queued {i}", 4)
        time.sleep(0.3)
    sent = time.monotonic()
    send("over", 4)
    tag, answered, error = answers.get(timeout=30)
    assert tag == "over", f"{tag} answered first"
    assert answered - sent < 2.0, "the rejection was not fast"
    assert error is not None and "Exceeds maximum queue size" in str(error), error
    rest = [answers.get(timeout=300) for _ in range(QUEUE + 2)]
    assert {tag for tag, _, _ in rest} == {"running", "waiting for room", "queued 0", "queued 1"}
    assert all(error is None for _, _, error in rest), rest
