"""Shared fixtures: a tiny model built in seconds, and a real Triton server serving it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contract.tensors import ENGINE_MODEL
from modelbuild.openvino_export import ensure_export
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
    """A real (tiny) GPT-J + tokenizer trained by the project's own build, in seconds, with its
    OpenVINO export (as `make model` makes)."""
    path = tmp_path_factory.mktemp("tiny") / "checkpoint"
    build(path, TINY)
    ensure_export(path)
    return path


def serving_repository(tmp_path_factory, checkpoint: Path, backend: str) -> Path:
    """The project's model repository with ``checkpoint`` where `make model` puts one and the
    engine model set to ``backend``."""
    repo = tmp_path_factory.mktemp("serving") / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("checkpoint"))
    shutil.copytree(checkpoint, checkpoint_dir(repo))
    config = repo / ENGINE_MODEL / "config.pbtxt"
    setting = 'key: "backend" value: { string_value: "auto" }'
    assert setting in config.read_text(), "engine/config.pbtxt no longer selects its backend"
    config.write_text(config.read_text().replace(setting, setting.replace("auto", backend)))
    hooks = '"test_hooks" value: { string_value: "false" }'
    assert hooks in config.read_text()
    config.write_text(config.read_text().replace(hooks, hooks.replace("false", "true")))
    return repo


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, tiny_checkpoint) -> Path:
    """The tiny model served by the torch engine: the exactness reference, and the one backend
    that honours bad words and the beam diversity rate, which many tests send."""
    return serving_repository(tmp_path_factory, tiny_checkpoint, "torch")


@pytest.fixture(scope="session")
def openvino_model_repository(tmp_path_factory, tiny_checkpoint) -> Path:
    """The tiny model served by the openvino backend (the CPU default)."""
    return serving_repository(tmp_path_factory, tiny_checkpoint, "openvino")


@pytest.fixture(scope="session")
def server(model_repository, tmp_path_factory):
    yield from _serve(model_repository, tmp_path_factory)


@pytest.fixture(scope="session")
def openvino_server(openvino_model_repository, tmp_path_factory):
    yield from _serve(openvino_model_repository, tmp_path_factory)


def _serve(repository: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "tritonserver.log"
    triton = TritonServer(repository, Ports(*free_ports(3)), log_file=log)
    triton.start()
    try:
        triton.wait_ready(timeout=240)
    except BaseException:
        triton.stop()
        print(log.read_text()[-5000:])
        raise
    yield triton
    triton.stop()
