"""The contract is stated once: every model's config.pbtxt declares exactly contract.tensors,
the ensemble wires the stages as the contract says, and imports point down the layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from contract.options import InvalidRequestError, SamplingParams
from contract.tensors import (
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    ENSEMBLE_TO_PREPROCESSING,
    MODEL_IO,
    MODEL_STAGE,
    PREPROCESSING_TO_MODEL_STAGE,
    STAGES,
    STREAM_MODEL,
    TensorSpec,
)
from serving import model_config
from serving.paths import MODEL_REPOSITORY, REPO_ROOT, checkpoint_dir


def load_config(name: str) -> model_config.ModelConfig:
    return model_config.read(MODEL_REPOSITORY / name)


def declared(tensors) -> set[TensorSpec]:
    return {
        TensorSpec(
            t.name,
            model_config_pb2.DataType.Name(t.data_type),
            tuple(t.dims),
            getattr(t, "optional", False),
        )
        for t in tensors
    }


@pytest.mark.parametrize("model", sorted(MODEL_IO))
def test_config_declares_exactly_the_contract(model):
    inputs, outputs = MODEL_IO[model]
    config = load_config(model)
    assert config.name == model
    assert declared(config.input) == set(inputs)
    assert declared(config.output) == set(outputs)
    assert config.max_batch_size > 0


def test_every_model_in_the_repository_is_in_the_contract():
    folders = {p.name for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file()}
    assert folders == set(MODEL_IO)


def test_ensemble_steps_wire_the_stages_as_the_contract_says():
    steps = load_config(ENSEMBLE_MODEL).ensemble_scheduling.step
    assert tuple(s.model_name for s in steps) == STAGES
    pre, model, _ = steps
    assert dict(pre.input_map) == ENSEMBLE_TO_PREPROCESSING
    internal = {v: k for k, v in model.input_map.items()}
    assert {k: internal[v] for k, v in pre.output_map.items()} == PREPROCESSING_TO_MODEL_STAGE
    # options go through unchanged, under their own names
    options = {k: v for k, v in model.input_map.items() if not v.startswith("_")}
    assert all(k == v for k, v in options.items())
    for step in steps:
        stage = load_config(step.model_name)
        assert set(step.input_map) <= {t.name for t in stage.input}, step.model_name
        assert set(step.output_map) <= {t.name for t in stage.output}, step.model_name
        required = {t.name for t in stage.input if not t.optional}
        assert required <= set(step.input_map), step.model_name


def test_stages_run_on_cpu_with_dynamic_batching_and_name_their_checkpoint():
    for name in (*STAGES, ENGINE_MODEL):
        config = load_config(name)
        assert config.HasField("dynamic_batching"), name
        kinds = {g.kind for g in config.instance_group}
        assert kinds == {model_config_pb2.ModelInstanceGroup.KIND_CPU}, name
    assert not load_config(MODEL_STAGE).model_transaction_policy.decoupled  # HTTP needs that
    # the streaming name is a one-step ensemble of the engine: a token crosses one stub
    stream = load_config(STREAM_MODEL)
    assert stream.platform == "ensemble"
    assert [step.model_name for step in stream.ensemble_scheduling.step] == [ENGINE_MODEL]


def test_one_model_loads_the_checkpoint_and_every_engine_user_calls_it():
    """One engine per server: only the engine model names a checkpoint to load; the model
    stage and the streaming model hold no engine parameters of their own."""
    engine = load_config(ENGINE_MODEL)
    assert engine.model_transaction_policy.decoupled
    path = engine.parameters["checkpoint_path"].string_value
    assert path == "../gptj/1/checkpoint"
    assert (MODEL_REPOSITORY / ENGINE_MODEL / path).resolve() == checkpoint_dir().resolve()
    loaders = [
        name
        for name in MODEL_IO
        if (MODEL_REPOSITORY / name / "config.pbtxt").read_text().count("engine_max_batch_size")
    ]
    assert loaders == [ENGINE_MODEL]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", float("nan")),
    ],
)
def test_non_finite_options_are_refused_naming_the_option(option, value):
    with pytest.raises(InvalidRequestError, match=f"{option} must be .* finite"):
        SamplingParams(**{option: value})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("temperature", 1e-30, "too small to sample with"),
        ("repetition_penalty", 1e-30, r"must be in \[0.01, 100.0\]"),
        ("repetition_penalty", 1e30, r"must be in \[0.01, 100.0\]"),
    ],
)
def test_values_that_would_overflow_are_refused(option, value, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**{option: value})


@pytest.mark.parametrize("model", [*STAGES, ENGINE_MODEL])
def test_every_queue_is_bounded_and_rejects_when_full(model):
    """(The ensembles have no queue of their own: their requests wait in their steps'.)"""
    policy = load_config(model).dynamic_batching.default_queue_policy
    assert policy.max_queue_size > 0
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert policy.default_timeout_microseconds > 0 and policy.allow_timeout_override


# -- imports point down ------------------------------------------------------------------------

# What each of the project's packages may import of the others. Third-party imports are free,
# except those named in FORBIDDEN.
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "engine": {"contract"},
    "preprocessing": {"contract"},
    "postprocessing": {"contract"},
    "backend": {"contract", "engine", "preprocessing", "postprocessing", "serving"},
    "model_repository": {"contract", "engine", "preprocessing", "postprocessing", "backend"},
    "client": {"contract"},
    "serving": {"contract"},
    "modelbuild": {"contract", "engine", "preprocessing", "postprocessing", "serving"},
    "reporting": {"contract", "serving"},
    "loadtest": {"contract", "client", "serving", "openai_api", "reporting"},
    "openai_api": {"contract", "client", "serving"},
    "bench": {"contract", "engine", "client", "serving", "loadtest", "modelbuild", "reporting"},
    "evaluation": {"contract", "engine", "preprocessing", "serving", "bench", "reporting"},
}
FORBIDDEN: dict[str, set[str]] = {
    "contract": {"torch", "triton_python_backend_utils", "tritonclient", "transformers"},
    "engine": {"triton_python_backend_utils", "tritonclient", "transformers", "tokenizers"},
    "preprocessing": {"torch", "triton_python_backend_utils", "tritonclient"},
    "postprocessing": {"torch", "triton_python_backend_utils", "tritonclient"},
    "client": {"torch", "triton_python_backend_utils", "transformers"},
    "reporting": {"torch", "triton_python_backend_utils", "tritonclient", "locust"},
}
PACKAGES = set(ALLOWED) | {"tests", "scripts"}


def imported_roots(path: Path) -> set[str]:
    """Top-level names a module imports (absolute imports only; the project uses no others)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_imports_point_down():
    problems = []
    for package, allowed in ALLOWED.items():
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            roots = imported_roots(path)
            upward = (roots & PACKAGES) - allowed - {package}
            forbidden = roots & FORBIDDEN.get(package, set())
            where = path.relative_to(REPO_ROOT)
            problems += [f"{where} imports {name}" for name in sorted(upward | forbidden)]
    assert not problems, "imports that run back up the layers:\n" + "\n".join(problems)


def test_the_import_check_catches_an_upward_import(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("import torch\nfrom client.request import CompletionRequest\n")
    assert imported_roots(module) == {"torch", "client"}


def test_the_contract_page_is_current():
    from contract.__main__ import render

    page = REPO_ROOT / "docs" / "contract.md"
    assert page.read_text() == render(), "run `make pbtxt` (python -m contract > docs/contract.md)"


def test_the_default_server_runs_one_engine():
    """The torch fallback (a second copy of the weights) is opt-in (issue 39): what the
    openvino pipeline cannot honour is refused by name, saying to set fallback "torch"."""
    params = model_config.parameters(load_config(ENGINE_MODEL))
    assert params["fallback"] == "none"


def test_ruff_format_decides_every_layout():
    """No skip markers or off/on blocks for the formatter: it lays out every file."""
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    markers = ("# fmt: " + "skip", "# fmt: " + "off", "# fmt: " + "on")  # not this file's own
    found = [
        f"{name}:{number}"
        for name in tracked
        for number, line in enumerate((REPO_ROOT / name).read_text().splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert not found, f"layout packed by hand, not left to ruff format: {found}"
