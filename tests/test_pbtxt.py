"""The configs' tensor declarations are generated from the contract (contract/pbtxt.py): a
config that drifts fails here naming the command that fixes it, and a new option needs no hand
edit of any config.pbtxt."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from contract import pbtxt
from contract.parameters import FIM_ORDER, MODEL_PARAMETERS, TOKENIZER_PATH
from contract.tensors import (
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    MODEL_IO,
    MODEL_STAGE,
    OPTION_INPUTS,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
    TensorSpec,
)
from serving import model_config
from serving.paths import MODEL_REPOSITORY


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    copy = tmp_path / "model_repository"
    for model in MODEL_IO:
        (copy / model).mkdir(parents=True)
        shutil.copy(MODEL_REPOSITORY / model / "config.pbtxt", copy / model / "config.pbtxt")
    pbtxt.write(copy)  # current, whatever the checkout's state: each test starts from there
    return copy


def test_every_config_is_generated_from_the_contract():
    stale = pbtxt.drift(MODEL_REPOSITORY)
    assert not stale, pbtxt.drift_message(stale)


def test_a_hand_edit_is_drift_and_the_generator_undoes_it_keeping_the_rest(repository):
    path = repository / MODEL_STAGE / "config.pbtxt"
    original = path.read_text()
    path.write_text(
        original.replace('"temperature" data_type: TYPE_FP32', '"temperature" data_type: TYPE_FP64')
    )
    assert pbtxt.drift(repository) == [f"{MODEL_STAGE}/config.pbtxt"]
    assert "make pbtxt" in pbtxt.drift_message(pbtxt.drift(repository))
    assert pbtxt.main(["--check", "--repository", str(repository)]) == 1
    assert pbtxt.write(repository) == [f"{MODEL_STAGE}/config.pbtxt"]
    assert path.read_text() == original
    assert pbtxt.drift(repository) == []


def test_a_config_without_its_markers_is_refused_by_name(repository):
    path = repository / ENSEMBLE_MODEL / "config.pbtxt"
    path.write_text(path.read_text().replace("# END GENERATED options", "# end of the options"))
    with pytest.raises(
        pbtxt.PbtxtError, match=r"ensemble/config.pbtxt: no generated block options"
    ):
        pbtxt.drift(repository)
    assert pbtxt.main(["--repository", str(repository)]) == 2


def test_a_new_option_is_declared_and_wired_without_a_hand_edit(repository, monkeypatch):
    """What a contributor adding an option relies on: the contract change alone, then
    `make pbtxt`, declares it on every model that takes options and wires it through."""
    made_up = TensorSpec("made_up_option", "TYPE_FP32", (1,), optional=True, doc="invented here")
    options = (*OPTION_INPUTS, made_up)
    with_option = {
        model: (tuple(s for s in inputs if s not in OPTION_INPUTS) + options, outputs)
        if set(OPTION_INPUTS) <= set(inputs)
        else (inputs, outputs)
        for model, (inputs, outputs) in MODEL_IO.items()
    }
    monkeypatch.setattr(pbtxt, "OPTION_INPUTS", options)
    monkeypatch.setattr(pbtxt, "MODEL_IO", with_option)
    takers = sorted(m for m, (inputs, _) in with_option.items() if made_up in inputs)
    assert len(takers) == 4  # the two ensembles, the model stage and the engine (streams)
    assert pbtxt.write(repository) == [f"{m}/config.pbtxt" for m in takers]
    for model in takers:
        config = model_config.read(repository / model)
        declared = {t.name: t for t in config.input}
        assert declared["made_up_option"].optional
        assert declared["made_up_option"].data_type == model_config.DataType.Value("TYPE_FP32")
        assert "# invented here" in (repository / model / "config.pbtxt").read_text()
    steps = model_config.read(repository / ENSEMBLE_MODEL).ensemble_scheduling.step
    stage = next(s for s in steps if s.model_name == MODEL_STAGE)
    assert stage.input_map["made_up_option"] == "made_up_option"
    assert pbtxt.drift(repository) == []


def test_the_shared_parameters_reach_every_model_that_reads_them():
    """Triton reads the contract's value in each config: the models that tokenize agree on the
    checkpoint and the fill-in-the-middle order, and the engine loads that same checkpoint."""
    for model, shared in MODEL_PARAMETERS.items():
        params = model_config.parameters(model_config.read(MODEL_REPOSITORY / model))
        assert {p.key: params.get(p.key) for p in shared} == {p.key: p.value for p in shared}
    folders = {
        (MODEL_REPOSITORY / model / path).resolve()
        for model, shared in MODEL_PARAMETERS.items()
        for path in (p.value for p in shared if p.key in ("tokenizer_path", "checkpoint_path"))
    }
    assert len(folders) == 1


def test_a_shared_parameter_changes_in_the_contract_alone(repository, monkeypatch):
    """fim_order "psm", set once: both models that build prompts get it, nothing else changes,
    and a hand edit of one of them is drift the generator undoes."""
    psm = replace(FIM_ORDER, value="psm")
    changed = {
        m: tuple(psm if p == FIM_ORDER else p for p in ps) for m, ps in MODEL_PARAMETERS.items()
    }
    monkeypatch.setattr(pbtxt, "MODEL_PARAMETERS", changed)
    assert pbtxt.write(repository) == [
        f"{m}/config.pbtxt" for m in (ENGINE_MODEL, PREPROCESSING_MODEL)
    ]
    for model in (ENGINE_MODEL, PREPROCESSING_MODEL):
        assert model_config.parameters(model_config.read(repository / model))["fim_order"] == "psm"
    path = repository / POSTPROCESSING_MODEL / "config.pbtxt"
    path.write_text(path.read_text().replace(TOKENIZER_PATH.value, "../elsewhere"))
    assert pbtxt.drift(repository) == [f"{POSTPROCESSING_MODEL}/config.pbtxt"]
    pbtxt.write(repository)
    assert (
        model_config.parameters(model_config.read(path))["tokenizer_path"] == TOKENIZER_PATH.value
    )
