"""The tests' tiny checkpoint with a chat template, as the API's ``--checkpoint``: the same
tokenizer as the served one (so the API trusts it), plus a template whose turns end with a
special token of the tiny vocabulary that is not its end token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEMPLATE = (
    "{% for message in messages %}{{ '### ' + message['role'] + '\n' + message['content'] + "
    "'<fim_middle>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '### assistant\n' }}"
    "{% endif %}"
)
END_OF_TURN = "<fim_middle>"


def with_chat_template(checkpoint: Path, folder: Path) -> Path:
    """A copy of ``checkpoint`` (without its OpenVINO export) with TEMPLATE as its template."""
    shutil.copytree(checkpoint, folder, ignore=shutil.ignore_patterns("openvino*"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
