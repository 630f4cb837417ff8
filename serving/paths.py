"""Where things are on disk: the repository, the model repository and the served checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

from contract.tensors import MODEL_STAGE

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
BUILD_DIR = REPO_ROOT / "build"
# The runtime copy of tritonserver (serving/triton.py); images point it where a read-only root
# filesystem still allows it, or prepare it at build time.
TRITON_WORKDIR = Path(os.environ.get("CODEGEN_RUNTIME_DIR") or REPO_ROOT / ".triton")


def checkpoint_dir(model_repository: Path = MODEL_REPOSITORY) -> Path:
    """The Hugging Face folder the model stage serves (``checkpoint_path`` in its config)."""
    return Path(model_repository) / MODEL_STAGE / "1" / "checkpoint"


DEFAULT_CHECKPOINT = checkpoint_dir()
