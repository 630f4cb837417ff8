"""GPT-J generation: the model (gptj), batched sampling, and the continuous-batching engine.

Imports only torch and :mod:`contract`; the Triton adapters and the benchmarks use it.
"""
