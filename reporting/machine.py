"""The machine a run was measured on, so that no figure travels without it: CPU model and the
flags that decide its speed, cores, memory, load, OS and library versions. Every tool's
report describes its machine through :func:`describe`."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

# the vector-instruction flags that decide the engine's speed (bfloat16, int8), lscpu's names
CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_int8",
)
VERSIONS = (
    "torch",
    "transformers",
    "tritonclient",
    "nvidia-pytriton",
    "locust",
    "openvino",
    "openvino-genai",
)


def _read(path: str) -> str:
    return Path(path).read_text() if Path(path).is_file() else ""


def _field(cpuinfo: str, *keys: str) -> str:
    """The first non-empty value of one of ``keys`` in /proc/cpuinfo's text ("" if none)."""
    pairs = (line.partition(":")[::2] for line in cpuinfo.splitlines())
    return next((v.strip() for k, v in pairs if k.strip() in keys and v.strip()), "")


def cpu_model(cpuinfo: str) -> str:
    """The ``model name`` of /proc/cpuinfo's first processor ("unknown CPU" if none)."""
    return _field(cpuinfo, "model name", "Model name") or "unknown CPU"


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (/proc/cpuinfo's ``flags``)."""
    present = _field(_read("/proc/cpuinfo") if cpuinfo is None else cpuinfo, "flags").split()
    return [flag for flag in CPU_FLAGS if flag in present]


def bf16_native(flags: list[str] | None = None) -> bool:
    """Whether the CPU computes bfloat16 natively (AVX-512 BF16 or AMX)."""
    found = cpu_flags() if flags is None else flags
    return "avx512_bf16" in found or "amx_bf16" in found


def load_average() -> str:
    """``uptime``'s 1, 5 and 15 minute load averages ("?" where /proc/loadavg is missing)."""
    return " ".join(_read("/proc/loadavg").split()[:3]) or "?"


def version(package: str) -> str | None:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(package)
    return None


def describe() -> dict[str, Any]:
    """This machine now: CPU, flags, cores, memory, load average, OS, library versions."""
    cpuinfo = _read("/proc/cpuinfo")
    memory = [
        line.split()[1]
        for line in _read("/proc/meminfo").splitlines()
        if line.startswith("MemTotal")
    ]
    flags = cpu_flags(cpuinfo)
    return {
        "cpu": cpu_model(cpuinfo) if cpuinfo else platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory[0]) / 2**20, 1) if memory else None,
        "cpu_flags": flags,
        "bf16_native": bf16_native(flags),
        "gpu": "none" if shutil.which("nvidia-smi") is None else "present",
        "load_average": load_average(),
        "os": platform.platform(),
        "python": platform.python_version(),
        **{package: version(package) for package in VERSIONS},
    }


def machine_lines(m: dict[str, Any]) -> list[str]:
    """The machine, as a report's bullet list."""
    return [
        f"- CPU: {m['cpu']} ({m['cores']} cores); flags {' '.join(m.get('cpu_flags') or [])}",
        f"- GPU: {m['gpu']}",
        f"- RAM: {m['memory_gib']} GiB",
        f"- OS: {m['os']}; Python {m['python']}, torch {m.get('torch')}, Locust "
        f"{m.get('locust')}, tritonclient {m.get('tritonclient')}",
    ]


def tree_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of each process in ``pids`` and all its descendants:
    what a server under test has used, whatever processes it is made of."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += sum(process.cpu_times()[:2])  # user + system
    return total
