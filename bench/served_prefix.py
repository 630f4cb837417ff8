"""The prefix section through the server: an editor resending its file to Triton.

Two measurements, each on a Triton of its own serving the openvino backend (its dtype as the
traffic sections use it, prefix cache on, as served by default), after the bare prefix rows:

- the 350M shape through ``ensemble_stream``: a cold 1,000-token prompt, then the same prompt
  with 3 more tokens; the time to the first streamed piece and to the 16-token answer;
- the default model through the unary ``ensemble``: a 650-token prompt of real source, then the
  same text with its next 3 characters; the time to the 16-token answer, cold over resent.

Medians over ``repeats`` windows, after one warm-up window. The end token is kept out by the
stand-in end id (bench/ov.py), and every answer is checked to hold 16 tokens.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ov import served_dtype, stand_in_end_id

STREAM_PROMPT, UNARY_PROMPT, MORE, NEW = 1000, 650, 3, 16


def word_text(ids: list[int], eos: int) -> str:
    """The 350M shape's word-level text of ``ids`` (bench/models.py: one ``t<id>`` word per
    id); the end token, which has another name there, is replaced by its neighbour."""
    return " ".join(f"t{i if i != eos else i + 1}" for i in ids)


def _stream_once(client: Any, prompt: str, end_id: int) -> tuple[float, float, int]:
    """(seconds to the first piece, seconds to the end, tokens generated) of one stream."""
    started = time.perf_counter()
    first = None
    stream = client.stream(prompt, NEW, end_id=end_id)
    for _ in stream:
        first = first if first is not None else time.perf_counter() - started
    total = time.perf_counter() - started
    completion = stream.completion
    made = completion.completion_tokens if completion is not None else 0
    return (first if first is not None else total), total, int(made or 0)


def _unary_once(client: Any, prompt: str, end_id: int, prompt_tokens: int) -> tuple[float, int]:
    started = time.perf_counter()
    completion = client.complete(prompt, NEW, end_id=end_id)
    return time.perf_counter() - started, completion.total_tokens - prompt_tokens


def _check(made: int, what: str) -> None:
    if made != NEW:
        raise RuntimeError(f"{what}: the server generated {made} tokens of {NEW}")


def run_served_prefix(
    paths: dict[str, Path], repeats: int, out: Path, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The served prefix rows: ``350m`` streamed, ``default`` unary (whichever are in
    ``paths``)."""
    from transformers import PreTrainedTokenizerFast

    from bench.models import CACHE
    from bench.prefix import windows
    from bench.server import running_server
    from client import CodegenClient
    from engine import ModelShape

    dtype = served_dtype()
    rows = []
    for key, path in paths.items():
        shape = ModelShape.read(path)
        end_id = stand_in_end_id(shape.vocab_size, shape.eos_token_id)
        length = STREAM_PROMPT if key == "350m" else UNARY_PROMPT
        ids = windows(length, repeats + 1, shape.vocab_size)
        log(f"prefix served: {key} model, openvino {dtype}, {length}-token prompts ...")
        with running_server(
            path, CACHE / "serving", out / f"tritonserver-prefix-{key}.log", "cpu",
            backend="openvino", parameters={"dtype": dtype},
        ) as server:  # fmt: skip
            client = CodegenClient(server.grpc_url, "grpc")
            try:
                if key == "350m":
                    row = _streamed(client, ids, length, shape.eos_token_id, end_id)
                else:
                    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
                    row = _unary(client, tokenizer, ids, length, end_id)
            finally:
                client.close()
        rows.append({"model": key, "dtype": dtype, "prompt_tokens": length, "new": NEW, **row})
        log("  " + ", ".join(f"{k} {v * 1000:,.0f} ms" for k, v in row.items() if k.endswith("_s")))
    return rows


def _streamed(client: Any, ids: list[list[int]], length: int, eos: int, end_id: int) -> dict:
    cold, resent = [], []
    for i, window in enumerate(ids):
        first = _stream_once(client, word_text(window[:length], eos), end_id)
        again = _stream_once(client, word_text(window[: length + MORE], eos), end_id)
        _check(first[2], "350m cold stream")
        _check(again[2], "350m resent stream")
        if i:  # the first window warms the server up
            cold.append(first)
            resent.append(again)
    return {
        "path": "ensemble_stream",
        "cold_first_s": statistics.median(c[0] for c in cold),
        "cold_total_s": statistics.median(c[1] for c in cold),
        "resent_first_s": statistics.median(r[0] for r in resent),
        "resent_total_s": statistics.median(r[1] for r in resent),
    }


def served_prompt_tokens(tokenizer: Any, text: str) -> int:
    """How many tokens the server makes of ``text``: what the tokenizer's rules put before a
    prompt (a Llama BOS, or nothing) and the text's own, never an end token after it."""
    from contract.model_tokens import prompt_head

    return len(prompt_head(tokenizer)) + len(tokenizer.encode(text, add_special_tokens=False))


def _unary(client: Any, tokenizer: Any, ids: list[list[int]], length: int, end_id: int) -> dict:
    cold, resent = [], []
    for i, window in enumerate(ids):
        text = tokenizer.decode(window[:length])
        more = tokenizer.decode(window[length:])[:MORE]
        longer = text + more
        first = _unary_once(client, text, end_id, served_prompt_tokens(tokenizer, text))
        again = _unary_once(client, longer, end_id, served_prompt_tokens(tokenizer, longer))
        _check(first[1], "default cold request")
        _check(again[1], "default resent request")
        if i:
            cold.append(first[0])
            resent.append(again[0])
    cold_s, resent_s = statistics.median(cold), statistics.median(resent)
    return {
        "path": "ensemble (unary)",
        "cold_total_s": cold_s,
        "resent_total_s": resent_s,
        "cold_over_resent": cold_s / resent_s,
    }


def served_prefix_table(rows: list[dict[str, Any]]) -> tuple[str, str, list[str], list[list[str]]]:
    """(title, context, headers, rows) in the bench report's table form."""

    def ms(row: dict[str, Any], name: str) -> str:
        return f"{row[name] * 1000:,.0f} ms" if name in row else "—"

    body = [
        [
            r["model"], r["path"], r["dtype"], str(r["prompt_tokens"]), ms(r, "cold_first_s"),
            ms(r, "cold_total_s"), ms(r, "resent_first_s"), ms(r, "resent_total_s"),
            f"{r['cold_total_s'] / r['resent_total_s']:.1f}x",
        ]
        for r in rows
    ]  # fmt: skip
    headers = ["model", "path", "dtype", " prompt", " cold first", " cold total",
               " resent first", " resent total", " cold/resent"]  # fmt: skip
    context = (
        f"Triton serving the openvino backend (prefix cache on); a prompt, then the same with "
        f"{MORE} more tokens (350m) or characters (default); {NEW} greedy tokens each; medians "
        "after a warm-up window; each server alone."
    )
    return "Prefix through the server: a long prompt resent", context, headers, body
