"""The machine a run was measured on, so that no figure travels without it."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def cpu_model(cpuinfo: str) -> str:
    """The ``model name`` of /proc/cpuinfo's first processor ("unknown CPU" if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model name") and value.strip():
            return value.strip()
    return "unknown CPU"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe(device: str = "cpu") -> dict[str, Any]:
    """Cores, CPU model, torch threads, the GPU when used, and the libraries' versions."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": cpu_model(cpuinfo) if cpuinfo else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "gpu": None,
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    for package in ("torch", "transformers", "ctranslate2", "tritonclient", "nvidia-pytriton",
                    "openvino", "openvino-genai"):  # fmt: skip
        info[package] = _version(package)
    from bench.ov import bf16_native, cpu_flags

    info["cpu_flags"] = cpu_flags(cpuinfo)
    info["bf16_native"] = bf16_native(info["cpu_flags"])
    return info


def load_average() -> str:
    """``uptime``'s 1, 5 and 15 minute load averages ("?" where /proc/loadavg is missing)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def machine_label(info: dict[str, Any]) -> str:
    """One line for every table and chart: cores, CPU, threads (and GPU)."""
    text = f"{info['cores']} cores, {info['cpu']}, torch threads {info['torch_threads']}"
    if info.get("cpu_flags"):
        text += f", flags {' '.join(info['cpu_flags'])}"
    if info.get("gpu"):
        text += f", GPU {info['gpu']}"
    return text
