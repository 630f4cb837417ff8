"""This machine, as a run's report describes it (CPU, cores, memory, library versions).

Free of Locust, so that every load generator of the project can describe its machine.
"""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from loadtest.results import MachineInfo, ModelInfo


def machine_info() -> MachineInfo:
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return MachineInfo(
        cpu=cpu,
        cores=os.cpu_count(),
        memory_gib=memory_gib,
        gpu="none" if shutil.which("nvidia-smi") is None else "present",
        os=platform.platform(),
        python=platform.python_version(),
        torch=version("torch"),
        locust=version("locust"),
        tritonclient=version("tritonclient"),
    )


def machine_lines(m: MachineInfo, model: ModelInfo) -> list[str]:
    """The machine and the served model, as a report's bullet list."""
    lines = [
        f"- CPU: {m.cpu} ({m.cores} cores)",
        f"- GPU: {m.gpu}",
        f"- RAM: {m.memory_gib} GiB",
        f"- OS: {m.os}; Python {m.python}, torch {m.torch}, Locust {m.locust}, "
        f"tritonclient {m.tritonclient}",
        f"- Triton Inference Server {model.triton_version or '?'} (CPU only)",
    ]
    c = model.checkpoint
    if c:
        family = {"gptj": "GPT-J", "llama": "Llama"}.get(c.family or "gptj", c.family)
        loss = f" (held-out loss {c.held_out_loss})" if c.held_out_loss is not None else ""
        lines.append(
            f"- Model: `{c.name}` {family}, {c.layers} layers x {c.width} wide, {c.heads} heads, "
            f"context {c.context}, vocabulary {c.vocab}, {(c.parameters or 0) / 1e6:.2f}M "
            f"parameters{loss}"
        )
    if model.stage_parameters:
        lines.append(
            f"- Engine (model `{ENGINE_MODEL}`, behind `{MODEL_STAGE}`): continuous batching, "
            + ", ".join(
                f"{k}={v}"
                for k, v in sorted(model.stage_parameters.items())
                if k != "checkpoint_path"
            )
        )
    return lines
