"""The OpenVINO export (`make model`) sends the libraries' output to a log file under build/
and shows one line per step; a failed step names the log. A fake optimum-intel stands in for
the real one (which lives in .venv-export), so these tests take no time: its "conversion" warns
as torch.jit tracing does, logs, prints, and writes to file descriptor 2 as C++ code does."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
import warnings
from pathlib import Path

import pytest

from modelbuild import openvino_export
from modelbuild.openvino_export import QuietSteps

NOISE = (
    "TracerWarning: Converting a tensor to a Python boolean",
    "transformers says: `torch_dtype` is deprecated",
    "printed by the library",
    "written by C++ to fd 2",
)


class TracerWarning(Warning):
    """As torch.jit's (a plain Warning subclass)."""


def _noisy() -> None:
    warnings.warn("Converting a tensor to a Python boolean", TracerWarning, stacklevel=1)
    logging.getLogger("fake_transformers").warning("transformers says: `torch_dtype` is deprecated")
    print("printed by the library")
    os.write(2, b"written by C++ to fd 2\n")


class FakeOVModel:
    fail: bool = False

    @classmethod
    def from_pretrained(cls, checkpoint: Path, **options: object) -> FakeOVModel:
        _noisy()
        if cls.fail:
            raise RuntimeError("conversion broke")
        return cls()

    def save_pretrained(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "openvino_model.xml").write_text("<net/>")


@pytest.fixture
def fake_optimum(monkeypatch, tmp_path) -> Path:
    """optimum.intel replaced by the fake; logs under tmp_path; a checkpoint to export."""
    intel = types.ModuleType("optimum.intel")
    intel.OVModelForCausalLM = FakeOVModel
    optimum = types.ModuleType("optimum")
    optimum.intel = intel
    monkeypatch.setitem(sys.modules, "optimum", optimum)
    monkeypatch.setitem(sys.modules, "optimum.intel", intel)
    monkeypatch.setattr(openvino_export, "_has_optimum_intel", lambda: True)
    monkeypatch.setattr(openvino_export, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(FakeOVModel, "fail", False)
    # a library's handler on a logger that does not propagate, made before the export with
    # the stderr of `python -m modelbuild.openvino_export`: a stream on file descriptor 2
    library = logging.getLogger("fake_transformers")
    library.propagate = False
    stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    handler = logging.StreamHandler(stderr)
    library.addHandler(handler)
    yield _checkpoint(tmp_path / "checkpoint")
    library.removeHandler(handler)


def _checkpoint(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gptj"}))
    return folder


def _log(tmp_path: Path) -> str:
    (log,) = (tmp_path / "logs").glob("openvino-export-*.log")
    return log.read_text()


def test_the_libraries_output_goes_to_the_log_not_the_terminal(fake_optimum, tmp_path, capfd):
    assert openvino_export.main([str(fake_optimum)]) == 0
    terminal = capfd.readouterr()
    said = terminal.out + terminal.err
    assert not [noise for noise in NOISE if noise in said], said
    logged = _log(tmp_path)
    assert all(noise in logged for noise in NOISE), logged
    lines = terminal.out.splitlines()
    steps = [line for line in lines if "export: " in line]
    assert len(steps) == 3 and all(line.endswith(" s") for line in steps), lines
    assert "converting it to OpenVINO IR" in steps[1]
    assert str(next((tmp_path / "logs").iterdir())) in lines[-1]
    assert (fake_optimum / "openvino" / "source.json").is_file()


def test_a_failed_step_prints_the_error_and_the_log_path(fake_optimum, tmp_path, capfd):
    FakeOVModel.fail = True
    assert openvino_export.main([str(fake_optimum)]) == 1
    terminal = capfd.readouterr()
    (log,) = (tmp_path / "logs").glob("openvino-export-*.log")
    assert "converting it to OpenVINO IR ... failed" in terminal.out
    assert "RuntimeError: conversion broke" in terminal.err
    assert str(log) in terminal.err
    assert not [noise for noise in NOISE if noise in terminal.out + terminal.err]
    logged = log.read_text()
    assert "Traceback" in logged and "RuntimeError: conversion broke" in logged
    assert all(noise in logged for noise in NOISE)
    assert not (fake_optimum / "openvino").exists()


def test_output_after_the_steps_reaches_the_terminal_again(tmp_path, capfd):
    """The descriptors and streams are put back, also after a failed step."""
    steps = QuietSteps(tmp_path / "steps.log")
    assert steps.run("a step", lambda: _noisy() or 7) == 7
    with pytest.raises(
        openvino_export.ExportStepError, match="a failing step: ValueError: invalid"
    ):
        steps.run("a failing step", lambda: (_noisy(), int("no")))
    print("after the steps")
    os.write(2, b"fd 2 after the steps\n")
    terminal = capfd.readouterr()
    assert "after the steps" in terminal.out and "fd 2 after the steps" in terminal.err
    assert "a step ... " in terminal.out and "a failing step ... failed" in terminal.out
    assert (tmp_path / "steps.log").read_text().count("printed by the library") == 2
