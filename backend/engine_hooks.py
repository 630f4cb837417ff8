"""A seam in the engine model for code plugged in from outside the product: called after each
engine step and around each submission. Nothing is plugged in by default.

The engine model's ``hooks_file`` parameter names a python file whose ``install(model_name)``
returns the hooks. The tests' repository plugs in tests/engine_hold_hook.py, which holds the
engine still on the tests' word, so that a test's condition is true by construction rather
than by the machine's speed; the product carries no such control of its own.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Protocol


class EngineHooks(Protocol):
    def after_step(self, before_pausing: Callable[[], None]) -> None:
        """(the engine's thread) After each step; a hook that pauses the engine calls
        ``before_pausing`` first (the figures so far reach the server)."""

    def before_submit(self, client_left: Callable[[], bool]) -> None:
        """(the submitting thread) Before a request's rows are submitted to the engine;
        ``client_left`` asks Triton whether its client went away."""

    def on_submitted(self) -> None:
        """(the submitting thread) Once they were."""

    def close(self) -> None: ...


class NoHooks:
    """The default: nothing plugged in."""

    def after_step(self, before_pausing: Callable[[], None]) -> None:
        return None

    def before_submit(self, client_left: Callable[[], bool]) -> None:
        return None

    def on_submitted(self) -> None:
        return None

    def close(self) -> None:
        return None


def load_hooks(path: str, model_name: str) -> EngineHooks:
    """The hooks ``path`` installs (``install(model_name)``), or :class:`NoHooks` for ""."""
    if not path:
        return NoHooks()
    spec = importlib.util.spec_from_file_location("codegen_engine_hooks", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"hooks_file {path!r} is not a python file (engine/config.pbtxt)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.install(model_name)
