"""Reading a test server's Prometheus endpoint, once for every test that counts on it."""

from __future__ import annotations

import re
import time
import urllib.request

from contract import metrics as names
from contract.tensors import ENGINE_MODEL

# Counters that move when a request is counted; gauges such as CPU use move on their own.
_COUNTERS = re.compile(r"^(nv_inference_(count|exec_count|request_\w+)|codegen_\w+_total)\{")


def scrape(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return response.read().decode()


def sample(text: str, name: str, model: str) -> float | None:
    """The value of ``name{model=...}`` in a scrape, or None when the server has none yet."""
    pattern = rf'^{re.escape(name)}{{[^}}]*model="{re.escape(model)}"[^}}]*}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


def cancels_sent(server, model: str) -> float:
    """How many cancellations ``model`` has passed on to the engine."""
    return sample(scrape(server), names.CANCELS_SENT, model) or 0.0


def settled_scrape(server, quiet: float = 0.3, timeout: float = 10.0) -> str:
    """A scrape once the request counters stopped moving for ``quiet`` seconds.

    Triton reports a decoupled model's request (the ``engine``) after its ``execute`` returns,
    which on a busy machine can come after its caller was answered: a test that compares
    counters before and after its own requests waits for the earlier ones to land first."""

    def counters(text: str) -> list[str]:
        return [line for line in text.splitlines() if _COUNTERS.match(line)]

    deadline = time.monotonic() + timeout
    text = scrape(server)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        again = scrape(server)
        if counters(again) == counters(text):
            return again
        text = again
    return text


def engine_counters(server) -> dict[str, float]:
    """The one engine's request, cancellation and token counters."""
    text = scrape(server)
    found = {}
    for name in (names.ENGINE_GENERATED_TOKENS, names.ENGINE_REQUESTS, names.ENGINE_CANCELLED):
        value = sample(text, name, ENGINE_MODEL)
        assert value is not None, f"{name} for {ENGINE_MODEL} missing from the metrics"
        found[name] = value
    return found


def dropped_since(server, before: dict[str, float]) -> bool:
    """Whether the engine dropped a sequence as cancelled since ``before`` (engine_counters)."""
    cancelled = names.ENGINE_CANCELLED
    return engine_counters(server)[cancelled] > before[cancelled]
