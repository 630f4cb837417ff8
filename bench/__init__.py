"""``make bench``: one run, one machine, the engine side by side with its alternatives.

Sections (``python -m bench --only ...``):

- ``kernels``: static batches through the torch engine, the openvino backend, transformers'
  ``generate`` and CTranslate2's ``Generator.generate_batch``, greedy and sampled, per model
  and dtype; plus the engine's sampled-step over greedy-step cost.
- ``arrivals``: N closed-loop clients against each backend (torch, openvino) bare and through
  the running Triton server, the torch engine fed whole static batches, and, at output 128,
  transformers' static ``generate`` and the OpenVINO pipeline's own ``generate``.
- ``mixed``: short requests next to long ones, their latency against all clients asking short.
- ``single``: one request alone, served minus bare latency, per backend.
- ``beams``: beam search widths side by side with transformers.
- ``prefix``: a long prompt resent with a few more tokens, bare per system, then through the
  server (the openvino backend's prefix cache).
- ``llama``: the project served (Triton + OpenAI API) beside llama.cpp's ``llama-server`` on
  the GGUF the default model was made from, the same one-line requests at 1, 4 and 16
  clients (bench/peer.py); by default only where ``make llama-server`` has built it.

The report ends with the bench's targets, each a ratio from the run with PASS / FAIL
(bench/targets.py). Results land in ``bench/results/<timestamp>/`` (markdown, JSON, a PNG
chart). The engines are used through their public API only, so the benchmark keeps working
while their internals change.
"""
