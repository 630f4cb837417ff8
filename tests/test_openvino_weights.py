"""`make model WEIGHTS=int8|int4`: the export compresses the weights with NNCF, records the
format, counts another format as not current, and the backend serves what it wrote."""

from __future__ import annotations

from pathlib import Path

import openvino
import pytest
from engine_runs import random_gptj

from engine.interface import GenerationRequest
from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import (
    MODEL_FILE,
    ModelShape,
    export_dir,
    export_problem,
    export_weights,
    require_export,
)
from modelbuild.openvino_export import ensure_export

# what each format's weights are stored as, among the IR's constants
STORED = {"float32": set(), "int8": {"u8"}, "int4": {"i4"}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weights-gptj")
    random_gptj().save_pretrained(path)
    return path


def constant_types(path: Path) -> set[str]:
    model = openvino.Core().read_model(str(export_dir(path) / MODEL_FILE))
    return {
        op.get_output_element_type(0).get_type_name()
        for op in model.get_ops()
        if op.get_type_name() == "Constant"
    }


@pytest.mark.parametrize("weights", ["int8", "int4", "float32"])
def test_each_format_is_written_recorded_and_served(checkpoint, weights):
    ensure_export(checkpoint, weights=weights)
    assert export_weights(checkpoint) == weights
    assert export_problem(checkpoint, weights) is None
    compressed = {"u8", "i8", "u4", "i4"} & constant_types(checkpoint)
    assert compressed >= STORED[weights] and (weights != "float32" or not compressed)
    other = "int8" if weights != "int8" else "float32"
    assert f"has {weights} weights, not {other}" in export_problem(checkpoint, other)
    assert ensure_export(checkpoint) and export_weights(checkpoint) == weights  # kept as it is
    engine = OpenVINOBackend(
        require_export(checkpoint), ModelShape.read(checkpoint), max_batch_size=2
    ).start()
    try:
        result = engine.generate(GenerationRequest([5, 17, 99, 23], 8))
    finally:
        engine.stop()
    assert result.finish_reason in ("length", "end_id") and len(result.output_ids) <= 8
