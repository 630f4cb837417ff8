"""``make bench``: one run, one machine, the engine side by side with its alternatives.

Sections (``python -m bench --only ...``):

- ``kernels``: static batches through this engine, transformers' ``generate`` and CTranslate2's
  ``Generator.generate_batch``, greedy and sampled, per model and dtype; plus the engine's
  sampled-step over greedy-step cost.
- ``arrivals``: N closed-loop clients against the bare engine, the running Triton server, and
  the same engine fed whole static batches.
- ``mixed``: short requests next to long ones, their latency against alone.
- ``single``: one request alone, served minus bare latency.

Results land in ``bench/results/<timestamp>/`` (markdown, JSON, a PNG chart). The engine is
used through its public API only, so the benchmark keeps working while its internals change.
"""
