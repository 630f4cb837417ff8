"""Overload gets a fast, clear rejection: with the engine full and the engine model's queue at
its bound, the next request is refused at once instead of waiting without end (the model stage
passes each request straight on to the engine model, whose queue is where overload waits)."""

from __future__ import annotations

import json
import queue
import shutil
import time

import pytest
import torch
import tritonclient.grpc as grpcclient
from engine_hold import engine_held, wait_for
from server_metrics import sample, scrape
from transformers import GPTJConfig, GPTJForCausalLM

from client.request import CompletionRequest, requested_outputs
from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, MODEL_STAGE
from serving import model_config
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
        vocab_size=tiny["vocab_size"],
        n_positions=2048,
        n_embd=512,
        n_layer=8,
        n_head=8,
        rotary_dim=16,
        bos_token_id=tiny["bos_token_id"],
        eos_token_id=tiny["eos_token_id"],
    )
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    GPTJForCausalLM(slow).save_pretrained(checkpoint)  # beside the tiny model's tokenizer
    config = model_config.read(repo / ENGINE_MODEL)
    model_config.set_parameters(config, {"engine_max_batch_size": "1"})
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = QUEUE
    # the held requests wait as long as a slow machine needs to finish the running one
    policy.default_timeout_microseconds = 900_000_000
    model_config.write(repo / ENGINE_MODEL, config)
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
    """By construction, not by timing: once the first request runs, the engine is held still
    (tests/engine_hold.py), so nothing ahead of the queue can move. The request over the queue's
    bound must be refused while everything is still held (it waited for nothing); once the
    engine goes on, every request that was let in is answered."""
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

    send("running", 600)  # takes the engine's only row
    deadline = time.monotonic() + 120
    while running(small_server) < 1:
        assert time.monotonic() < deadline, f"the first request never started: {answers.queue}"
        time.sleep(0.05)
    let_in = ["running"]
    with engine_held(small_server):
        # one request is taken into the engine model's (held) instance, the next ones wait in
        # its queue; each is sent once the one before has reached the engine model
        while pending(small_server) < QUEUE:
            assert len(let_in) < 2 + 2 * QUEUE, f"the queue never filled: {answers.queue}"
            let_in.append(f"held {len(let_in)}")
            send(let_in[-1], 4)
            wait_for(
                lambda: engine_requests_seen(small_server) >= len(let_in),
                "a request never reached the engine model",
            )
            queued = len(let_in) - 2  # those after the one in the instance
            if queued:
                # it is in the queue unless it was batched with the one before (then the
                # loop sends one more)
                wait_for(lambda q=queued: pending(small_server) >= q, "", timeout=10, fail=False)
        send("over", 4)
        tag, _, error = answers.get(timeout=60)  # the engine is held: nothing else can end
        assert tag == "over", f"{tag} answered first"
        assert error is not None and "Exceeds maximum queue size" in str(error), error
        assert answers.empty()
    rest = [answers.get(timeout=600) for _ in let_in]
    assert sorted(tag for tag, _, _ in rest) == sorted(let_in)
    assert all(error is None for _, _, error in rest), [(t, str(e)) for t, _, e in rest]


def pending(server) -> float:
    """Requests waiting in the engine model's queue (not those in its instance)."""
    return sample(scrape(server), names.PENDING_REQUEST_COUNT, ENGINE_MODEL) or 0.0


def engine_requests_seen(server) -> float:
    """Requests the model stage has passed on to the engine model (in flight there)."""
    return sample(scrape(server), names.CALLS_IN_FLIGHT, MODEL_STAGE) or 0.0
