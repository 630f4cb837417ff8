"""Train the default GPT-J on the standard library and write a Hugging Face checkpoint.

Deterministic for a fixed seed and step count (a step count, not a time budget, decides when
training stops). The default is sized to take about five minutes on two cores; ``steps`` buys a
better model for longer (see the model card it writes).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from transformers import GPTJConfig as HFGPTJConfig
from transformers import GPTJForCausalLM

from modelbuild.corpus import read_texts, split
from modelbuild.fim import FimTransform, middle_windows
from modelbuild.tokenizer import END_OF_TEXT, train_tokenizer

CARD_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "    def __repr__(self):\n",
    "for i in range(",
)


@dataclass(frozen=True)
class BuildConfig:
    name: str = "codegen-stdlib-gptj"
    vocab_size: int = 4096
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    rotary_dim: int = 16
    n_positions: int = 1024
    block_size: int = 256  # twice as fast as 512 here: attention memory traffic dominates
    batch_size: int = 32
    steps: int = 250
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    seed: int = 1234
    tokenizer_chars: int = 6_000_000  # text the tokenizer learns merges from
    eval_windows: int = 32
    eval_points: int = 4  # held-out loss measured this many times during training
    bf16: bool | None = None  # bfloat16 autocast; None: only where the CPU does it natively
    # Share of training documents turned into fill-in-the-middle examples (modelbuild/fim.py),
    # half of them in SPM order: SantaCoder's and StarCoder's rates. The model card states what
    # it costs in left-to-right loss (python -m modelbuild.fim_cost measures it).
    fim_rate: float = 0.5
    fim_spm_rate: float = 0.5
    # The prompt order a server asks this model in (``fim_order`` "auto"): SPM, whose prompt
    # ends at the cursor, so an editor's resent prompt is all in the prefix cache but its end;
    # the tokenizer keeps that ending a token the model trained on (docs/fim.md measures both).
    fim_order: str = "spm"

    @property
    def train_tokens(self) -> int:
        return self.steps * self.batch_size * self.block_size


def _progress(message: str) -> None:
    print(f"[make model] {message}", flush=True)


def _take_chars(texts, limit: int) -> list[str]:
    taken, total = [], 0
    for text in texts:
        taken.append(text)
        total += len(text)
        if total >= limit:
            break
    return taken


def _tokens(tokenizer, texts: list[str], limit: int) -> np.ndarray:
    """Concatenated token ids of texts (end-of-text between files), up to ``limit`` tokens."""
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    ids: list[int] = []
    for start in range(0, len(texts), 64):
        for row in tokenizer(texts[start : start + 64], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(eos)
        if len(ids) >= limit:
            break
    return np.array(ids[:limit], dtype=np.int64)


def _lr(config: BuildConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(
    data: np.ndarray, rng: np.random.Generator, config: BuildConfig, fim: FimTransform
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of one step: random windows, some of their documents made FIM."""
    starts = rng.integers(0, len(data) - config.block_size - 1, size=config.batch_size)
    windows = [data[s : s + config.block_size] for s in starts]
    if config.fim_rate > 0:
        pairs = [fim.window(w) for w in windows]
        return tuple(torch.from_numpy(np.stack(column)) for column in zip(*pairs, strict=True))
    batch = torch.from_numpy(np.stack(windows))
    return batch, batch


@torch.no_grad()
def evaluate(model: GPTJForCausalLM, data: np.ndarray, config: BuildConfig) -> float:
    """Mean next-token cross-entropy (nats) over fixed held-out windows."""
    model.eval()
    count = min(config.eval_windows, max(1, (len(data) - 1) // config.block_size))
    losses = []
    for i in range(count):
        window = torch.from_numpy(data[i * config.block_size : (i + 1) * config.block_size])[None]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            losses.append(model(window, labels=window).loss.float().item())
    model.train()
    return float(np.mean(losses))


@torch.no_grad()
def evaluate_middles(model: GPTJForCausalLM, windows, config: BuildConfig) -> float:
    """Mean cross-entropy (nats) of the middles of held-out FIM examples, given their prefix
    and suffix (``modelbuild.fim.middle_windows``)."""
    model.eval()
    losses = []
    for tokens, labels in windows:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            out = model(torch.from_numpy(tokens)[None], labels=torch.from_numpy(labels)[None])
        losses.append(out.loss.float().item())
    model.train()
    return float(np.mean(losses))


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 itself (AVX512-BF16 or AMX). Elsewhere (AVX2 only)
    autocast emulates it and a training step runs about 10 times slower than in float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def build(out_dir: Path, config: BuildConfig = BuildConfig()) -> dict:
    """Train tokenizer and model; write the checkpoint and MODEL_CARD.md into ``out_dir``."""
    if config.bf16 is None:
        config = replace(config, bf16=native_bf16())
    started = time.perf_counter()
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    out_dir = Path(out_dir)

    train_files, valid_files = split()
    _progress(f"corpus: {len(train_files)} training / {len(valid_files)} held-out stdlib files")
    tokenizer_texts = _take_chars(read_texts(train_files), config.tokenizer_chars)
    tokenizer = train_tokenizer(tokenizer_texts, config.vocab_size)
    _progress(
        f"tokenizer: byte-level BPE, {len(tokenizer)} tokens ({time.perf_counter() - started:.0f}s)"
    )

    needed = config.train_tokens + config.block_size + 1
    rng_files = random.Random(config.seed)
    shuffled = list(train_files)
    rng_files.shuffle(shuffled)
    train_data = _tokens(tokenizer, list(read_texts(shuffled)), max(needed, 4 * needed // 3))
    valid_data = _tokens(
        tokenizer, list(read_texts(valid_files)), config.eval_windows * config.block_size + 1
    )
    _progress(
        f"data: {len(train_data):,} training tokens available, "
        f"{len(valid_data):,} held-out ({time.perf_counter() - started:.0f}s)"
    )

    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    hf_config = HFGPTJConfig(
        vocab_size=len(tokenizer),
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        rotary_dim=config.rotary_dim,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    model = GPTJForCausalLM(hf_config)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    _progress(
        f"model: GPT-J {config.n_layer} layers x {config.n_embd} wide, {params / 1e6:.2f}M "
        f"parameters; training {config.steps} steps of {config.batch_size}x"
        f"{config.block_size} tokens"
    )
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(config.seed)
    fim = FimTransform(tokenizer, config.fim_rate, config.fim_spm_rate, random.Random(config.seed))
    train_started = time.perf_counter()
    loss_value = float("nan")
    curve: list[tuple[int, float]] = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, step)
        batch, labels = _batch(train_data, rng, config, fim)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            loss = model(batch, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.9 * loss_value + 0.1 * loss.item() if step else loss.item()
        if (step + 1) % max(1, config.steps // config.eval_points) == 0 and step + 1 < config.steps:
            curve.append((step + 1, round(evaluate(model, valid_data, config), 4)))
            _progress(f"step {step + 1}: held-out loss {curve[-1][1]:.3f}")
        if step % 10 == 0 or step == config.steps - 1:
            elapsed = time.perf_counter() - train_started
            rate = (step + 1) * config.batch_size * config.block_size / elapsed
            eta = (config.steps - step - 1) * elapsed / (step + 1)
            _progress(
                f"step {step + 1}/{config.steps}  loss {loss_value:.3f}  "
                f"{rate:,.0f} tokens/s  eta {eta:.0f}s"
            )
    train_seconds = time.perf_counter() - train_started
    held_out = evaluate(model, valid_data, config)
    curve.append((config.steps, round(held_out, 4)))
    _progress(f"held-out loss {held_out:.3f} (perplexity {math.exp(held_out):.1f})")
    middles = middle_windows(
        tokenizer, valid_data, config.block_size, config.eval_windows, config.seed
    )
    middle_loss = evaluate_middles(model, middles, config)
    _progress(f"held-out fill-in-the-middle loss (middles only) {middle_loss:.3f}")

    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    completions = _greedy_completions(out_dir)
    facts = {
        "name": config.name,
        "parameters": params,
        "training_tokens": config.train_tokens,
        "train_seconds": round(train_seconds, 1),
        "held_out_loss": round(held_out, 4),
        "held_out_curve": curve,
        "held_out_middle_loss": round(middle_loss, 4),
        "build": asdict(config),
    }
    (out_dir / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
    (out_dir / "MODEL_CARD.md").write_text(model_card(facts, completions))
    _progress(f"wrote {out_dir} in {time.perf_counter() - started:.0f}s")
    return facts


def _greedy_completions(checkpoint: Path, max_new_tokens: int = 40) -> list[tuple[str, str]]:
    """Greedy completions with the serving engine itself, as the server would produce them."""
    from engine import GenerationRequest, TorchEngine
    from engine.gptj import GPTJ
    from postprocessing.detokenize import Postprocessor
    from preprocessing.tokenize import Preprocessor

    pre, post = Preprocessor(checkpoint), Postprocessor(checkpoint)
    engine = TorchEngine(GPTJ.from_checkpoint(checkpoint)).start()
    try:
        results = [
            engine.generate(GenerationRequest(pre.encode(p), max_new_tokens)) for p in CARD_PROMPTS
        ]
    finally:
        engine.stop()
    return [(p, post.decode(r.output_ids)) for p, r in zip(CARD_PROMPTS, results, strict=True)]


def model_card(facts: dict, completions: list[tuple[str, str]]) -> str:
    build = facts["build"]
    lines = [
        f"# {facts['name']}",
        "",
        "A small GPT-J (transformers `GPTJForCausalLM` format) trained by `make model` on this "
        "machine's Python standard library, so the project serves a real model with no download.",
        "It writes Python-looking code; it is far too small to write correct programs.",
        "",
        "| | |",
        "|---|---|",
        f"| parameters | {facts['parameters']:,} ({facts['parameters'] / 1e6:.2f}M) |",
        f"| architecture | {build['n_layer']} layers, {build['n_embd']} wide, {build['n_head']} "
        f"heads, rotary dim {build['rotary_dim']}, context {build['n_positions']} |",
        f"| tokenizer | byte-level BPE, {build['vocab_size']} tokens; newlines and indentation "
        "are tokens of their own (`modelbuild/tokenizer.py`) |",
        f"| training | {build['steps']} steps x {build['batch_size']} x {build['block_size']} "
        f"tokens = {facts['training_tokens']:,} tokens, {facts['train_seconds']:.0f}s, "
        f"seed {build['seed']} |",
        f"| held-out loss | {facts['held_out_loss']:.3f} nats/token "
        f"(perplexity {math.exp(facts['held_out_loss']):.1f}) on stdlib files never trained on, "
        "left to right |",
        f"| fill-in-the-middle | StarCoder sentinels `<fim_prefix>` `<fim_suffix>` `<fim_middle>`;"
        f" each document (or piece of one) in a training window made a FIM example with "
        f"probability {build['fim_rate']:.0%} ({build['fim_spm_rate']:.0%} of those in SPM "
        "order, the rest PSM; `modelbuild/fim.py`); held-out loss of "
        f"a middle given its prefix and suffix {facts['held_out_middle_loss']:.3f} nats/token; "
        f"served in {build.get('fim_order', 'psm').upper()} order (`fim_order` auto) |",
        "",
        "## Greedy completions (40 tokens, the serving engine, no penalties)",
        "",
    ]
    for prompt, completion in completions:
        lines += ["```python", prompt + completion, "```", ""]
    curve = " | ".join(f"{step}: {loss:.3f}" for step, loss in facts["held_out_curve"])
    lines += [
        "## Budget",
        "",
        f"Held-out loss during training (step: loss): {curve}.",
        "",
        "The default `make model` is sized for about five minutes on two cores. The loss is "
        "still falling at the end (see above), so a longer budget buys a better model: "
        "`make model STEPS=1000 FORCE=1` trains four times as long. At this size greedy "
        "output soon repeats itself; a repetition penalty (e.g. 1.2) or sampling helps. "
        f"Positions past the trained window ({build['block_size']} tokens) were never "
        "trained, so quality drops on longer contexts.",
        "",
    ]
    return "\n".join(lines)
