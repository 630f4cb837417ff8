"""What one run measures, the full plan or the ``--quick`` one: everything that sets the run's
length, decided in one place, so every table can print the settings it was measured with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from reporting.llama_server import checkpoint_gguf, llama_server_binary
from serving.paths import DEFAULT_CHECKPOINT

SECTIONS = ("kernels", "arrivals", "mixed", "single", "beams", "prefix", "llama")
DTYPES = ("float32", "bfloat16", "int8")
SYSTEMS = ("engine", "openvino", "transformers")
# the engine model's two backends, in the traffic sections' order (openvino, the CPU default,
# first: a run cut short still has its figures)
BACKENDS = ("openvino", "torch")
MODELS = ("default", "350m")

Progress = Callable[[str], None]  # where a section says what it is doing
# The load test's sampling (loadtest/locustfile.py SAMPLING): what a completion service sends.
SAMPLED = {"top_k": 40, "top_p": 0.95, "temperature": 0.8}


@dataclass(frozen=True)
class KernelPlan:
    """Static-batch generation for one model: which batches, how many tokens."""

    batches: tuple[int, ...]
    new_tokens: int
    prompt_tokens: int = 32
    min_tokens: int = 8  # the time guard never cuts a cell below this many new tokens
    cell_budget_s: float = 25.0  # a slow cell (bf16 without native support) gets fewer tokens
    min_cell_s: float = 1.0  # fast cells repeat until they have run this long (at most 5 times)


FULL_KERNELS = {
    "default": KernelPlan(batches=(1, 16, 64), new_tokens=64, cell_budget_s=6.0),
    "350m": KernelPlan(batches=(1, 16), new_tokens=16, min_tokens=4, cell_budget_s=8.0),
}
QUICK_KERNELS = {
    "default": KernelPlan(batches=(1, 16), new_tokens=16, cell_budget_s=4.0, min_cell_s=0.3),
    "350m": KernelPlan(batches=(1,), new_tokens=8, min_tokens=4, cell_budget_s=6.0, min_cell_s=0.3),
}


@dataclass(frozen=True)
class Plan:
    """One run's settings (the full run's by default); :func:`make_plan` builds it."""

    quick: bool = False
    sections: tuple[str, ...] = SECTIONS
    device: str = "cpu"
    models: tuple[str, ...] = MODELS
    dtypes: tuple[str, ...] = DTYPES
    systems: tuple[str, ...] = SYSTEMS
    kernels: dict[str, KernelPlan] = field(default_factory=lambda: FULL_KERNELS)
    clients: int = 16  # closed-loop clients for ``arrivals``
    lengths: tuple[int, ...] = (8, 32, 128, 512)  # output lengths for ``arrivals``
    window_s: float = 10.0  # shortest measured window per arrivals/mixed cell
    max_window_s: float = 25.0  # longest, however slow a request is
    warmup_cap_s: float = 60.0  # longest wait for every client's first request
    mixed_short: int = 8
    mixed_long: int = 512
    mixed_clients: int = 8  # of each kind
    single_tokens: int = 8
    single_repeats: int = 20
    backends: tuple[str, ...] = BACKENDS  # traffic sections: each backend bare, then served
    prefix_repeats: int = 3  # prefix section: resent-prompt windows per system
    seed: int = 0
    step_batches: tuple[int, ...] = (16, 64)  # sampled/greedy step cost reported at these
    beam_widths: tuple[int, ...] = (1, 4, 8)
    beam_prompts: int = 4  # requests at once, each a beam search of the width
    beam_prompt_tokens: int = 32
    beam_tokens: int = 64
    peer_half_window_s: float = 10.0  # llama section: each system's half window per client count

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_list(text: str | None, allowed: tuple[str, ...], what: str) -> tuple[str, ...] | None:
    """``"a,b"`` -> ``("a", "b")`` in ``allowed``'s order; None for no text."""
    items = [item.strip().lower() for item in (text or "").split(",") if item.strip()]
    if unknown := [item for item in items if item not in allowed]:
        raise ValueError(f"unknown {what} {unknown}: choose from {', '.join(allowed)}")
    return tuple(item for item in allowed if item in items) if items else None


def make_plan(
    quick: bool = False,
    only: str | None = None,
    device: str = "cpu",
    models: str | None = None,
    dtypes: str | None = None,
    systems: str | None = None,
    backends: str | None = None,
    lengths: str | None = None,
    llama_available: bool | None = None,
    checkpoint: Path = DEFAULT_CHECKPOINT,
) -> Plan:
    """The full plan, or the quick one (the same sections, each smaller), narrowed by the
    command line's choices. The ``llama`` section runs by default only where ``llama-server``
    is built (None: look); asked for by name without it, the error names the fix."""
    plan = Plan(device=device)
    if quick:
        plan = replace(
            plan,
            quick=True,
            models=("default",),
            kernels=QUICK_KERNELS,
            lengths=(8, 32),
            window_s=3.0,
            max_window_s=5.0,
            warmup_cap_s=10.0,
            mixed_long=128,
            single_repeats=6,
            beam_tokens=16,
            prefix_repeats=1,
            peer_half_window_s=4.0,
        )
    changes: dict[str, Any] = {}
    for name, text, allowed in (
        ("sections", only, SECTIONS),
        ("models", models, MODELS),
        ("dtypes", dtypes, DTYPES),
        ("systems", systems, SYSTEMS),
        ("backends", backends, BACKENDS),
    ):
        if (chosen := parse_list(text, allowed, name)) is not None:
            changes[name] = chosen
    if "llama" in changes.get("sections", plan.sections):
        try:
            if llama_available is False:
                raise FileNotFoundError("no llama-server: run `make llama-server` first")
            if llama_available is None:  # the binary, and the GGUF the checkpoint was made from
                llama_server_binary()
                checkpoint_gguf(checkpoint)
        except FileNotFoundError as exc:
            if only:  # asked for by name: refused, not skipped
                raise ValueError(str(exc)) from exc
            changes["sections"] = tuple(s for s in plan.sections if s != "llama")
    if device.startswith("cuda") and "openvino" in changes.get("backends", plan.backends):
        if backends:  # asked for by name: refused, not skipped
            raise ValueError("backend openvino runs on the CPU only: leave it out on cuda")
        changes["backends"] = tuple(b for b in plan.backends if b != "openvino")
    if lengths:
        values = tuple(int(x) for x in lengths.split(",") if x.strip())
        if not values or min(values) < 1:
            raise ValueError(f"lengths must be positive integers, got {lengths!r}")
        changes["lengths"] = values
    return replace(plan, **changes)
