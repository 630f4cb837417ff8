"""This machine, as a run's report describes it (CPU, cores, memory, library versions).

Free of Locust, so that every load generator of the project can describe its machine.
"""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

from loadtest.results import MachineInfo


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
