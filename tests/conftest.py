"""Shared fixtures: a tiny model built in seconds, and a real Triton server serving it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contract.tensors import ENGINE_MODEL
from modelbuild.train import BuildConfig, build
from serving.paths import MODEL_REPOSITORY, checkpoint_dir
from serving.process import free_ports
from serving.triton import Ports, TritonServer

TINY = BuildConfig(
    name="tiny-test-gptj",
    vocab_size=512,
    n_layer=2,
    n_embd=64,
    n_head=4,
    rotary_dim=8,
    n_positions=512,
    block_size=128,
    batch_size=8,
    steps=30,
    tokenizer_chars=400_000,
    eval_windows=4,
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A real (tiny) GPT-J + tokenizer trained by the project's own build, in seconds."""
    path = tmp_path_factory.mktemp("tiny") / "checkpoint"
    build(path, TINY)
    return path


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, tiny_checkpoint) -> Path:
    """The project's model repository with the tiny checkpoint where `make model` puts one."""
    repo = tmp_path_factory.mktemp("serving") / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("checkpoint"))
    shutil.copytree(tiny_checkpoint, checkpoint_dir(repo))
    config = repo / ENGINE_MODEL / "config.pbtxt"
    hooks = '"test_hooks" value: { string_value: "false" }'
    assert hooks in config.read_text()
    config.write_text(config.read_text().replace(hooks, hooks.replace("false", "true")))
    return repo


@pytest.fixture(scope="session")
def server(model_repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "tritonserver.log"
    triton = TritonServer(model_repository, Ports(*free_ports(3)), log_file=log)
    triton.start()
    try:
        triton.wait_ready(timeout=240)
    except BaseException:
        triton.stop()
        print(log.read_text()[-5000:])
        raise
    yield triton
    triton.stop()
