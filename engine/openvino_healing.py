"""Token healing on the openvino backend: OpenVINO GenAI has no per-request logit mask, so the
held-back token's text becomes a structured-output grammar (its xgrammar backend): the answer
must start with that text, then anything. The grammar masks every token the answer could not
start with; after the held-back text it allows the whole vocabulary. It has no bias toward the
held-back token (transformers' +1, engine/sampling.py), so a greedy answer can differ from the
torch engine's where another extension is within one logit of it (docs/generation.md)."""

from __future__ import annotations

from pathlib import Path

from engine.interface import GenerationRequest, NotHonouredError

# What the pipeline needs to read a grammar: the export's own tokenizer (make model writes it).
DETOKENIZER = "openvino_detokenizer.xml"


def refuse_healing_without_tokenizer(request: GenerationRequest, model_dir: Path) -> None:
    """An export written before token healing has no tokenizer for the grammar: such a request
    goes to the torch fallback (or is refused), never runs unhealed."""
    if request.held_back is not None and not (model_dir / DETOKENIZER).is_file():
        raise NotHonouredError(
            f"token healing on the openvino backend needs the export's tokenizer ({DETOKENIZER} "
            f"in {model_dir}), which this export predates: export again (`python -m "
            "modelbuild.openvino_export --force CHECKPOINT`), send token_healing false, or set "
            'fallback "torch" or backend "torch" (engine/config.pbtxt)',
            "token_healing",
        )


def healing_grammar(text: str):
    """A StructuredOutputConfig: the output starts with ``text``, then any text."""
    import openvino_genai

    config = openvino_genai.StructuredOutputConfig
    grammar = config.Concat(config.ConstString(text), config.AnyText())
    return config(structural_tags_config=grammar)
