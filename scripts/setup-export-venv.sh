#!/usr/bin/env bash
# Create .venv-export, where `make model` exports checkpoints to OpenVINO IR (modelbuild/openvino_export.py).
#
# The export needs optimum-intel, which requires transformers<5.6 while .venv (the server, the
# torch engine and its exactness tests against transformers) runs the newest transformers; and
# optimum-intel lists torchvision, whose wheel does not match the pinned CPU torch (importing
# transformers' processors then fails: "operator torchvision::nms does not exist"). The export
# uses neither vision nor processors, so optimum-intel is installed here without its dependency
# list, and its other dependencies are named below. The OpenVINO pins match pyproject.toml's.
# TORCH_INDEX_URL=<index> installs torch from there first (the CPU build: docker/Dockerfile.cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
STAMP=.venv-export/.setup-export
REQUIREMENTS=(
    "torch==2.13.0"
    "transformers>=4.51,<5.6"
    "optimum==2.3.0"
    "nncf>=3.3.0"
    "openvino==2026.4.1"
    "openvino-tokenizers==2026.4.1.0"
    "huggingface-hub>=0.23.2,<1.22"
    "requests>=2.33,<3"
    "safetensors>=0.4"
    "numpy<2"
    "setuptools"
)
if [ ! -f "$STAMP" ] || [ "$0" -nt "$STAMP" ]; then
    [ -x .venv-export/bin/python ] || "$PYTHON" -m venv .venv-export
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        .venv-export/bin/pip install --quiet "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
    fi
    .venv-export/bin/pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
    .venv-export/bin/pip install --quiet --disable-pip-version-check --no-deps "optimum-intel==2.2.0"
    touch "$STAMP"
fi
.venv-export/bin/python -c 'import optimum.intel, transformers, openvino; import importlib.metadata as m; print("export venv: optimum-intel", m.version("optimum-intel"), "transformers", transformers.__version__, "openvino", openvino.__version__)'
