#!/usr/bin/env bash
# Create .venv-scan with checkov, the static security scanner used by tests/test_deploy.py.
#
# checkov pins old versions of packaging, networkx and importlib-metadata, which would downgrade
# what torch and transformers use in .venv, so it lives in a venv of its own. tests/test_deploy.py
# finds it at .venv-scan/bin/checkov (or on PATH) and skips the scan when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv-scan/bin/checkov ]; then
    "$PYTHON" -m venv .venv-scan
    .venv-scan/bin/pip install --quiet --upgrade pip
    .venv-scan/bin/pip install --quiet "checkov==3.3.30"
fi
.venv-scan/bin/checkov --version
