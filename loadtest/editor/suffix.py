"""Whether the server takes a suffix (fill in the middle), decided by one probe at the start:
answered, suffixes go on; refused with an error naming ``suffix`` (a model without FIM tokens),
the run goes on prefix-only and says so loudly; any other failure stops the run, since every
figure of a server that cannot answer a probe would be meaningless.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from loadtest.editor.protocols import SUFFIX, Exchange

PROBE_PREFIX = "def add(a, b):\n    "
PROBE_SUFFIX = "\n\n\nprint(add(1, 2))\n"
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SuffixMode:
    """What the run sends after the probe."""

    requested: bool  # --suffix (the default) or --no-suffix
    send: bool  # whether requests carry a suffix
    note: str  # a sentence for the progress lines and the report

    @property
    def refused(self) -> bool:
        return self.requested and not self.send


class ProbeError(RuntimeError):
    """The probe failed for another reason than the suffix: the run cannot go on."""


def decide(requested: bool, probe: Exchange | None) -> SuffixMode:
    """The mode from the probe's outcome (``probe`` None: not probed, as with --no-suffix)."""
    if not requested:
        return SuffixMode(False, False, "prefix only (--no-suffix): no suffix is sent")
    if probe is None or not probe.over:
        raise ProbeError(f"the suffix probe got no answer within {PROBE_TIMEOUT_S:.0f} s")
    if probe.finished and not probe.error:
        return SuffixMode(True, True, "suffix sent with every request (the server takes it)")
    if SUFFIX in probe.error.lower():
        return SuffixMode(True, False, "SUFFIX REFUSED by the server, so this run is PREFIX-ONLY "
                          f"(no fill-in-the-middle); the server said: {probe.error}")  # fmt: skip
    raise ProbeError(f"the suffix probe failed for another reason: {probe.error}")


def probe(open_exchange: Callable[[str, str, int], Exchange], requested: bool) -> SuffixMode:
    """Send one request with a suffix (when ``requested``) and decide from its outcome."""
    if not requested:
        return decide(False, None)
    exchange = open_exchange(PROBE_PREFIX, PROBE_SUFFIX, 0)
    try:
        exchange.wait(time.monotonic() + PROBE_TIMEOUT_S)
    finally:
        if not exchange.over:
            exchange.abandon()
    return decide(True, exchange)
