"""``make bench``: one run, one machine, the engine side by side with its alternatives.

Sections (``python -m bench --only ...``, bench/cli.py): ``kernels`` (static batches), ``arrivals``,
``mixed`` and ``single`` (traffic, bare and served), ``beams``, ``prefix`` (a long prompt resent)
and ``llama`` (beside llama.cpp's server). The report ends with the bench's targets, each a ratio
from the run with PASS / FAIL (bench/targets.py). The engines are used through their public API
only, so the benchmark keeps working while their internals change.
"""
