"""GPT-J generation behind one interface (interface): the torch engine (the model in gptj,
batched sampling, the continuous-batching engine) and OpenVINO GenAI's continuous-batching
pipeline (openvino_backend).

Imports only torch, OpenVINO and :mod:`contract`; the Triton adapters and the benchmarks use it.
"""
