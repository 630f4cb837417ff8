"""Token healing on the openvino backend: OpenVINO GenAI has no per-request logit mask, so the
held-back token's text becomes a structured-output grammar (its xgrammar backend): the answer
must start with that text, then anything. The grammar masks every token the answer could not
start with; after the held-back text it allows the whole vocabulary. It has no bias toward the
held-back token (transformers' +1, engine/sampling.py), so a greedy answer can differ from the
torch engine's where another extension is within one logit of it (docs/generation.md)."""

from __future__ import annotations


def healing_grammar(text: str):
    """A StructuredOutputConfig: the output starts with ``text``, then any text."""
    import openvino_genai

    config = openvino_genai.StructuredOutputConfig
    grammar = config.Concat(config.ConstString(text), config.AnyText())
    return config(structural_tags_config=grammar)
