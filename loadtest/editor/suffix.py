"""Whether the server takes a suffix, decided by one probe: answered, suffixes go on; refused
naming ``suffix`` (no FIM tokens), the run goes on prefix-only and says so loudly; any other
failure stops the run (a server that cannot answer a probe gives no meaningful figure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from loadtest.editor.protocols import SUFFIX, Exchange

PROBE_PREFIX, PROBE_SUFFIX = "def add(a, b):\n    ", "\n\n\nprint(add(1, 2))\n"
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SuffixMode:
    requested: bool  # --no-suffix: False
    send: bool  # whether requests carry a suffix
    note: str  # a sentence for the progress lines and the report
    refused: bool = False  # requested, and the server refused it: a loud prefix-only run


class ProbeError(RuntimeError):
    """The probe failed for another reason than the suffix: the run cannot go on."""


def probe(open_exchange: Callable[[str, str, int], Exchange], requested: bool) -> SuffixMode:
    """Send one request with a suffix (when ``requested``) and decide from its outcome."""
    if not requested:
        return SuffixMode(False, False, "prefix only (--no-suffix): no suffix is sent")
    exchange = open_exchange(PROBE_PREFIX, PROBE_SUFFIX, 0)
    exchange.wait(time.monotonic() + PROBE_TIMEOUT_S)
    if not exchange.over:
        exchange.abandon()
        raise ProbeError(f"the suffix probe got no answer within {PROBE_TIMEOUT_S:.0f} s")
    if exchange.finished and not exchange.error:
        return SuffixMode(True, True, "suffix sent with every request (the server takes it)")
    if SUFFIX in exchange.error.lower():
        note = "SUFFIX REFUSED by the server, so this run is PREFIX-ONLY (no fill-in-the-middle)"
        return SuffixMode(True, False, f"{note}; the server said: {exchange.error}", True)
    raise ProbeError(f"the suffix probe failed for another reason: {exchange.error}")
