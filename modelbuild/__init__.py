"""Builds the embedded default model offline: a tokenizer and a small GPT-J trained on the
Python standard library, written as a Hugging Face checkpoint where the model repository reads
it. Also imports real checkpoints and exports FasterTransformer layouts (see ``__main__``)."""
