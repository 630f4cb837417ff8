"""Whether the server takes a suffix (fill in the middle), decided once at the start of a run.

The profile sends suffixes by default. A server without fill-in-the-middle refuses a request
that carries one, with an error naming ``suffix`` (the API's 400 with ``param: suffix``;
Triton's "unexpected inference input 'suffix'" for ``ensemble_stream``). One probe request tells
which: answered, suffixes go on; refused naming ``suffix``, the run goes on prefix-only and
says so loudly in its progress and its report; any other failure stops the run, because a server
that cannot answer a probe would make every figure of the run meaningless.
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


def names_suffix(error: str) -> bool:
    return SUFFIX in error.lower()


def decide(requested: bool, probe: Exchange | None) -> SuffixMode:
    """The mode from the probe's outcome (``probe`` None: not probed, as with --no-suffix)."""
    if not requested:
        return SuffixMode(False, False, "prefix only (--no-suffix): no suffix is sent")
    if probe is None or not probe.over:
        raise ProbeError(f"the suffix probe got no answer within {PROBE_TIMEOUT_S:.0f} s")
    if probe.finished and not probe.error:
        return SuffixMode(True, True, "suffix sent with every request (the server takes it)")
    if names_suffix(probe.error):
        return SuffixMode(
            True,
            False,
            "SUFFIX REFUSED by the server, so this run is PREFIX-ONLY (no fill-in-the-middle); "
            f"the server said: {probe.error}",
        )
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
