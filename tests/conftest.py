"""Shared fixtures: a tiny model built in seconds, and a real Triton server serving it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from client.request import CompletionRequest
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL
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
    # the tests run what the openvino pipeline cannot honour on the torch fallback (opt-in)
    fallback = '"fallback" value: { string_value: "none" }'
    assert fallback in config.read_text()
    config.write_text(config.read_text().replace(fallback, fallback.replace("none", "torch")))
    hooks = '"hooks_file" value: { string_value: "" }'
    assert hooks in config.read_text()
    hold = Path(__file__).with_name("engine_hold_hook.py")  # tests/engine_hold.py drives it
    config.write_text(config.read_text().replace(hooks, hooks.replace('""', f'"{hold}"')))
    return repo


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, tiny_checkpoint) -> Path:
    """The tiny model served by the torch engine: the exactness reference, and the one backend
    that honours bad words and the beam diversity rate, which many tests send."""
    return serving_repository(tmp_path_factory, tiny_checkpoint, "torch")


# The tests' openvino engine prefills 64 prompt tokens a pass, so that a prompt within the tiny
# model's 512-token context takes several passes (tests/test_abandoned_requests.py)
OPENVINO_PREFILL_CHUNK = 64


@pytest.fixture(scope="session")
def openvino_model_repository(tmp_path_factory, tiny_checkpoint) -> Path:
    """The tiny model served by the openvino backend (the CPU default)."""
    repo = serving_repository(tmp_path_factory, tiny_checkpoint, "openvino")
    config = repo / ENGINE_MODEL / "config.pbtxt"
    chunk = '"engine_max_prefill_tokens" value: { string_value: "256" }'
    assert chunk in config.read_text(), "engine/config.pbtxt's prefill chunk changed"
    config.write_text(
        config.read_text().replace(chunk, chunk.replace("256", str(OPENVINO_PREFILL_CHUNK)))
    )
    return repo


@pytest.fixture(scope="session")
def server(model_repository, tmp_path_factory):
    yield from serve(model_repository, tmp_path_factory)


@pytest.fixture(scope="session")
def openvino_server(openvino_model_repository, tmp_path_factory):
    yield from serve(openvino_model_repository, tmp_path_factory)


def serve(repository: Path, tmp_path_factory):
    """Triton on ``repository`` (free ports) until the fixture ends; its log tail on failure."""
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


SERVERS = ("server", "openvino_server")


def answers(triton: TritonServer, timeout: float = 120.0) -> str | None:
    """None if the server completes a one-token request within ``timeout``, else why not."""
    import tritonclient.grpc as grpcclient

    if triton.process.poll() is not None:
        return f"tritonserver exited with code {triton.process.returncode}"
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        request = CompletionRequest(("def probe():\n",), max_tokens=1)
        client.infer(ENSEMBLE_MODEL, request.infer_inputs(grpcclient), client_timeout=timeout)
    except Exception as exc:
        return f"a one-token request failed: {exc}"
    finally:
        client.close()
    return None


def _stacks(triton: TritonServer) -> str:
    """py-spy dumps of the server's python-backend stubs: where a wedged one waits."""
    found = subprocess.run(["pgrep", "-P", str(triton.process.pid)], capture_output=True, text=True)
    dumps = []
    for pid in found.stdout.split():
        spy = str(Path(sys.executable).parent / "py-spy")
        dump = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True)
        dumps.append(dump.stdout[-3000:] or dump.stderr[-300:])
    return "\n".join(dumps)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After a failed test on a shared server, check the server still answers; if it does
    not, end the session at once with its log and stacks, rather than let every later test
    wait out its timeout on a dead server (CI would only time out, saying nothing)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name in SERVERS:
        triton = item.funcargs.get(name)
        if triton is None or (why := answers(triton)) is None:
            continue
        log = triton.log_file.read_text()[-6000:] if triton.log_file else ""
        print(f"\n=== the test server stopped answering after {item.nodeid}: {why}")
        print(f"=== tritonserver log (end):\n{log}\n=== stub stacks:\n{_stacks(triton)}")
        pytest.exit(f"the test server stopped answering after {item.nodeid}: {why}", 3)
