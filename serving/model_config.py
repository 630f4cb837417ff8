"""A model's ``config.pbtxt``, read the way Triton reads it: protobuf's text format into
Triton's ``ModelConfig`` (the generated protos tritonclient ships).

The one reader for the models that read another model's config, the build tools and the tests:
a field, a parameter or a comment anywhere in the file parses as Triton would parse it, and a
config Triton would refuse is refused here with protobuf's message (line and column). A tool
that serves a changed copy reads it, changes the message and writes it back (:func:`write`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig
DataType = model_config_pb2.DataType
CONFIG_FILE = "config.pbtxt"


def parse(text: str) -> ModelConfig:
    """``text`` (a config.pbtxt's content) as a ``ModelConfig``; text_format.ParseError if it
    is not one."""
    return text_format.Parse(text, ModelConfig())


def read(path: Path) -> ModelConfig:
    """The config at ``path``: a ``config.pbtxt`` file, or a model folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return parse(path.read_text())


def parameters(config: ModelConfig) -> dict[str, str]:
    """The config's ``parameters``, as the strings it gives them."""
    return {key: value.string_value for key, value in config.parameters.items()}


def set_parameters(config: ModelConfig, values: Mapping[str, str]) -> None:
    """Give each named parameter its new value; KeyError naming one the config does not have
    (a setting meant for the server must never be silently ignored)."""
    if missing := sorted(set(values) - set(config.parameters)):
        raise KeyError(f"the {config.name} config has no parameter {', '.join(missing)}")
    for key, value in values.items():
        config.parameters[key].string_value = value


def write(path: Path, config: ModelConfig) -> None:
    """``config`` into ``path`` (a ``config.pbtxt`` file, or a model folder), in the text
    format Triton reads. The file's comments are not kept: for copies a tool or test serves."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    path.write_text(text_format.MessageToString(config))
