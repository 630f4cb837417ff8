"""The window's figures from a real Prometheus that scrapes Triton, with prometheus-api-client.

Prometheus only knows the values at its scrape times, and ``increase(x[d])`` extrapolates to the
edges of ``[T - d, T]`` whenever its first and last samples are not on them. So the window is
aligned to scrape times: from the samples Prometheus holds for the target, ``T_start`` is the
first scrape at or after the window's start and ``T_end`` the last at or before its end, and the
query is ``increase(x[T_end - T_start])`` evaluated at ``T_end``. Both edge samples then sit
exactly on the range's ends (Prometheus 2.x ranges are closed), nothing is extrapolated, and
the result is the counter's exact increase between two scrapes, counter resets included. The
aligned window is up to one scrape interval shorter at each end than the sweep's own, which is
why the sweep opens and closes its window just around two scrapes.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect

from contract import metrics as names
from contract.tensors import ENSEMBLE_MODEL
from loadtest.metrics import Deltas
from reporting.triton import sample_name

# The counters the report reads (Prometheus stores them under their exposed names).
COUNTERS = (
    names.INFERENCE_COUNT, names.EXEC_COUNT, names.REQUEST_FAILURE, names.REQUEST_DURATION_US,
    names.QUEUE_DURATION_US, names.COMPUTE_INFER_DURATION_US, names.ENGINE_REQUESTS,
    names.ENGINE_QUEUE_DURATION_US, names.ENGINE_COMPUTE_DURATION_US, names.ENGINE_STEPS,
    names.ENGINE_STEP_ROWS, names.ENGINE_PROMPT_TOKENS, names.ENGINE_PROMPT_TOKENS_REUSED,
    names.ENGINE_GENERATED_TOKENS,
)  # fmt: skip


@dataclass(frozen=True)
class AlignedWindow:
    start: float  # Unix seconds of the first scrape in the window
    end: float  # ... and of the last
    scrapes: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


class PromSource:
    """Queries one Prometheus about one scrape target (``instance`` label)."""

    def __init__(self, url: str, instance: str | None = None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.instance = instance
        self.client = PrometheusConnect(url=self.url, disable_ssl=True)
        self.timeout = timeout

    def reachable(self) -> bool:
        """A quick readiness probe (the client's own check retries with back-off)."""
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets (prometheus-api-client has no call for this endpoint)."""
        response = requests.get(f"{self.url}/api/v1/targets", timeout=self.timeout)
        response.raise_for_status()
        return response.json()["data"]["activeTargets"]

    def find_instance(self, metrics_url: str) -> str | None:
        """The ``instance`` label of the target that scrapes ``metrics_url`` (matched on port,
        with localhost and 127.0.0.1 taken as the same host)."""
        wanted = urllib.parse.urlsplit(metrics_url)
        local = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
        for target in self.targets():
            scrape = urllib.parse.urlsplit(target.get("scrapeUrl", ""))
            hosts = {scrape.hostname, wanted.hostname}
            same_host = len(hosts) == 1 or hosts <= local
            if same_host and scrape.port == wanted.port:
                return target["labels"].get("instance")
        return None

    def _selector(self, metric: str, **labels: str) -> str:
        if self.instance:
            labels = {"instance": self.instance, **labels}
        matchers = ",".join(f'{key}="{value}"' for key, value in labels.items())
        return f"{metric}{{{matchers}}}" if matchers else metric

    def wait_for_scrapes(self, count: int, timeout: float = 30.0) -> None:
        """Wait until the target has ``count`` scrapes in the last 30 s (a Prometheus that has
        just started has none): windows are aligned to them."""
        deadline = time.monotonic() + timeout
        while len(self.scrape_times(time.time() - 30, time.time())) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus scraped {self.instance} fewer than {count} times")
            time.sleep(0.5)

    def scrape_times(self, start: float, end: float) -> list[float]:
        """Timestamps of the target's scrapes within [start, end], from the samples of the
        ensemble's request counter (so a scrape that failed is not taken as a window edge)."""
        span_ms = int((end - start) * 1000) + 1000
        series = self._selector(names.INFERENCE_COUNT, model=ENSEMBLE_MODEL)
        result = self.client.custom_query(f"{series}[{span_ms}ms]", params={"time": f"{end:.3f}"})
        times = sorted({float(t) for series in result for t, _ in series.get("values", [])})
        return [t for t in times if start <= t <= end]

    def next_scrape(self, after: float, history_s: float = 30.0) -> tuple[float, float]:
        """(time of the first scrape at or after ``after``, scrape interval), predicted from
        the target's recent scrapes: Prometheus scrapes a target at a fixed phase."""
        now = time.time()
        times = self.scrape_times(now - history_s, now)
        if len(times) < 3:
            raise RuntimeError(f"only {len(times)} recent scrapes of {self.instance}")
        interval = statistics.median(b - a for a, b in itertools.pairwise(times))
        steps = max(0, math.ceil((after - times[-1]) / interval))
        return times[-1] + steps * interval, interval

    def aligned_window(self, start: float, end: float) -> AlignedWindow:
        times = self.scrape_times(start, end)
        if len(times) < 2:
            raise RuntimeError(
                f"Prometheus has {len(times)} scrape(s) of {self.instance or 'the target'} in the "
                f"{end - start:.1f} s window: scrape more often or measure longer"
            )
        return AlignedWindow(times[0], times[-1], len(times))

    def increase(self, metric: str, window: AlignedWindow) -> dict[str, float]:
        """``increase()`` of one counter over the aligned window, summed by model."""
        range_ms = round(window.seconds * 1000)
        query = f"sum by (model) (increase({self._selector(metric)}[{range_ms}ms]))"
        result = self.client.custom_query(query, params={"time": f"{window.end:.3f}"})
        return {series["metric"].get("model", ""): float(series["value"][1]) for series in result}

    def window_deltas(self, start: float, end: float) -> tuple[Deltas, AlignedWindow]:
        """The same :class:`Deltas` as the direct reading, from Prometheus."""
        window = self.aligned_window(start, end)
        values: dict[tuple[str, str], float] = {}
        for metric in COUNTERS:
            for model, value in self.increase(metric, window).items():
                values[(sample_name(metric), model)] = value
        return Deltas(values, window.seconds), window
