"""The engine package's public API is what its users outside the serving path import.

The benchmarks drive the engine the way an embedding program would, so they may import only
the names ``engine/__init__.py`` exports: a refactor of the engine's modules (the scheduler,
the batch, the step runner) then cannot break them, and what they measure is the public
behaviour. The exports load lazily, so importing ``engine.interface`` stays free of torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import engine
from serving.paths import REPO_ROOT


def engine_imports(path: Path) -> list[str]:
    """Every way a module reaches into ``engine`` other than its public names, as text."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            problems += [
                f"import {alias.name}" for alias in node.names if alias.name.startswith("engine.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("engine."):
                problems.append(f"from {node.module} import ...")
            elif node.module == "engine":
                problems += [
                    f"from engine import {alias.name} (not in engine.__all__)"
                    for alias in node.names
                    if alias.name not in engine.__all__
                ]
    return problems


def test_bench_imports_only_the_engine_packages_public_api():
    problems = [
        f"{path.relative_to(REPO_ROOT)}: {problem}"
        for path in sorted((REPO_ROOT / "bench").rglob("*.py"))
        for problem in engine_imports(path)
    ]
    assert not problems, "bench reaches into engine's modules:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source",
    [
        "from engine.gptj import KVCache\n",
        "import engine.batch\n",
        "from engine import Batch\n",
    ],
)
def test_the_check_catches_a_reach_into_the_modules(tmp_path, source):
    module = tmp_path / "bad.py"
    module.write_text(source)
    assert engine_imports(module)


def test_every_public_name_resolves():
    missing = [name for name in engine.__all__ if not hasattr(engine, name)]
    assert not missing, f"engine.__all__ names that do not import: {missing}"
    with pytest.raises(AttributeError, match="no attribute 'Batch'"):
        engine.Batch  # noqa: B018 (an internal name is not exported)


def test_the_interface_imports_without_torch():
    """The Triton models that only call the engine import engine.interface: no torch there."""
    code = "import sys, engine.interface, engine.scheduler; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
