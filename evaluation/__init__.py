"""Completion quality through the served path, against the same checkpoint run alone.

``python -m evaluation`` (``make eval``) scores HumanEval pass@1, next-line accuracy and
single-line infilling through any OpenAI-compatible completions API, runs the same HumanEval
prompts through transformers on the checkpoint at float32, and lists every problem whose two
completions differ: a served model that scores lower than itself alone is a serving bug, not a
weaker model. docs/eval.md describes the method.

Modules: :mod:`evaluation.problems` (the cases and how a completion is cut),
:mod:`evaluation.sandbox` (runs a program in a subprocess), :mod:`evaluation.served` (the HTTP
client), :mod:`evaluation.local` (transformers), :mod:`evaluation.launch` (starts the API and
Triton when no URL is given), :mod:`evaluation.run` (the sections) and :mod:`evaluation.report`.
"""
