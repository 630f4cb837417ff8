"""The one config.pbtxt reader (serving/model_config.py) reads what Triton reads: a commented-out
setting is no setting, a config Triton would refuse is refused, and the callers of the engine
take its limits from the engine's config through it."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types

import pytest
from google.protobuf import text_format

from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from serving import model_config
from serving.paths import MODEL_REPOSITORY

SETTING = 'parameters { key: "max_beam_width" value: { string_value: "%s" } }'


def test_a_commented_out_setting_is_not_read():
    # a regex over the text finds both, and the commented-out one last
    text = "\n".join(
        ['name: "engine"', SETTING % 4, "# to try: " + SETTING % 99, "max_batch_size: 8"]
    )
    config = model_config.parse(text)
    assert model_config.parameters(config) == {"max_beam_width": "4"}
    assert config.max_batch_size == 8


def test_a_config_triton_would_refuse_is_refused_with_its_line():
    with pytest.raises(text_format.ParseError, match=r"^2:"):
        model_config.parse('name: "engine"\nmax_batch_size: "many"\n')


def test_a_changed_copy_keeps_every_other_setting_and_refuses_an_unknown_parameter(tmp_path):
    folder = tmp_path / ENGINE_MODEL
    shutil.copytree(MODEL_REPOSITORY / ENGINE_MODEL, folder, ignore=shutil.ignore_patterns("1"))
    original = model_config.read(folder)
    config = model_config.read(folder)
    model_config.set_parameters(config, {"dtype": "bfloat16"})
    with pytest.raises(KeyError, match="no parameter no_such_setting"):
        model_config.set_parameters(config, {"no_such_setting": "1"})
    model_config.write(folder, config)
    written = model_config.read(folder / "config.pbtxt")
    assert model_config.parameters(written) == model_config.parameters(original) | {
        "dtype": "bfloat16"
    }
    written.parameters["dtype"].string_value = original.parameters["dtype"].string_value
    assert written == original


def test_the_engines_callers_read_its_limits_from_its_config(monkeypatch, tmp_path):
    """What gptj checks a request against before it can queue: the
    checkpoint the engine's config names, and its max_beam_width."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 2
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "backend.io", raising=False)
    io = importlib.import_module("backend.io")
    sys.modules.pop("backend.io", None)
    engine = tmp_path / ENGINE_MODEL
    engine.mkdir()
    config = model_config.read(MODEL_REPOSITORY / ENGINE_MODEL)
    model_config.set_parameters(config, {"checkpoint_path": "../elsewhere", "max_beam_width": "3"})
    model_config.write(engine, config)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(
        json.dumps({"vocab_size": 77, "n_positions": 128})
    )
    args = {"model_repository": str(tmp_path / MODEL_STAGE)}  # the caller's own folder
    limits = io.engine_limits(args)
    assert (limits.vocab_size, limits.context, limits.max_beam_width) == (77, 128, 3)
