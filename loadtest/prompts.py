"""Moved to :mod:`contract.prompts`; this name stays for ``bench/traffic.py`` until it imports
from there (then delete this file)."""

from contract.prompts import code_prompts, stdlib_sources

__all__ = ["code_prompts", "stdlib_sources"]
