"""Running several engine requests at once, as concurrent clients would (shared by the tests)."""

from __future__ import annotations

import threading

from engine import GenerationRequest, GenerationResult, TorchEngine


def run_concurrently(
    engine: TorchEngine, requests: list[GenerationRequest]
) -> list[GenerationResult]:
    """Submit every request from its own thread; the results in the requests' order."""
    results: list[GenerationResult | None] = [None] * len(requests)

    def one(i: int) -> None:
        results[i] = engine.generate(requests[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
