"""GPT-J generation: the model (gptj), per-row sampling, and the continuous-batching engine.

Import submodules directly; this package module stays free of torch so that clients can use
``engine.params`` and ``engine.metrics`` without it.
"""
