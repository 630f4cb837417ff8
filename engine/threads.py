"""Keep the engine's thread the only long-lived thread that runs torch's parallel regions.

torch's CPU kernels use OpenMP (GNU libgomp in the PyPI wheels), which gives every thread that
opens a parallel region its own pool of worker threads, kept until that thread ends. Once a
process holds more pool threads than CPUs, libgomp stops letting idle workers spin and puts them
to sleep after each region, so every region of every pool pays a wake-up. A decode step opens a
few hundred regions: on the 2-core development machine a forward pass at 16 rows ran about 1.4x
slower in a thread when one other thread had ever run torch, even with that other thread idle
(measured side by side; see README "Engine speed").

So whatever loads weights or runs torch outside the engine's own thread does it in a thread
that ends when the work is done, taking its pool with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(work: Callable[[], T], name: str = "torch-passing") -> T:
    """Run ``work`` in a new thread, wait for it and return its result (or raise its error).

    The thread ends before this returns, so any OpenMP pool it opened is gone."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
