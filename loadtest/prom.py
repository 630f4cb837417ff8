"""Triton's counters over a window from a Prometheus that scrapes it (prometheus-api-client), as
the same :class:`loadtest.metrics.Deltas` two ``/metrics`` readings give: the raw samples at its
first and last scrape inside the window (docs/loadtest.md, "Prometheus")."""

from __future__ import annotations

import itertools
import math
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from contract import metrics as names
from contract.tensors import ENSEMBLE_MODEL
from loadtest.metrics import Deltas, snapshot_deltas
from loadtest.run_prometheus import INSTALL_HINT, PrometheusServer, find_binary
from reporting.triton import LOCAL_HOSTS, Endpoints, Snapshot, sample_name
from serving.process import free_port

# The counters the report reads (Prometheus stores them under their exposed names).
COUNTERS = (
    names.INFERENCE_COUNT,
    names.EXEC_COUNT,
    names.REQUEST_FAILURE,
    names.REQUEST_DURATION_US,
    names.QUEUE_DURATION_US,
    names.COMPUTE_INFER_DURATION_US,
    names.ENGINE_REQUESTS,
    names.ENGINE_QUEUE_DURATION_US,
    names.ENGINE_COMPUTE_DURATION_US,
    names.ENGINE_STEPS,
    names.ENGINE_STEP_ROWS,
    names.ENGINE_PROMPT_TOKENS,
    names.ENGINE_PROMPT_TOKENS_REUSED,
    names.ENGINE_GENERATED_TOKENS,
)


def _times(series: list[dict], start: float, end: float) -> list[float]:
    return sorted({float(t) for s in series for t, _ in s["values"] if start <= float(t) <= end})


class AlignedWindow(NamedTuple):
    start: float  # Unix seconds of the first scrape in the window
    end: float  # ... and of the last
    scrapes: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


class PromSource:
    """Queries one Prometheus about one scrape target (``instance`` label)."""

    def __init__(self, url: str, instance: str | None = None) -> None:
        self.url, self.instance = url.rstrip("/"), instance
        # one retry, at once: a Prometheus that is not there is found out in milliseconds
        self.client = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(1), timeout=10)

    def find_instance(self, target: str) -> str | None:
        """The ``instance`` that scrapes ``target`` (host:port; local names taken as one), or
        None, also when no Prometheus answers."""
        host, _, port = target.rpartition(":")
        try:
            instances = {s["metric"].get("instance", "") for s in self.client.custom_query("up")}
        except Exception:
            return None
        for instance in sorted(instances):
            other, _, other_port = instance.rpartition(":")
            if other_port == port and (other == host or {other, host} <= LOCAL_HOSTS):
                return instance
        return None

    def _samples(self, names_: str, start: float, end: float, **labels: str) -> list[dict]:
        """The raw samples of the metrics matching ``names_`` (a regex) in [start, end]."""
        labels = {"instance": self.instance, **labels} if self.instance else labels
        matchers = "".join(f',{key}="{value}"' for key, value in labels.items())
        query = f'{{__name__=~"{names_}"{matchers}}}[{int((end - start) * 1000) + 1000}ms]'
        return self.client.custom_query(query, params={"time": f"{end:.3f}"})

    def scrape_times(self, start: float, end: float) -> list[float]:
        """The target's scrapes within [start, end], from the ensemble's request counter (so a
        scrape that failed is not taken as a window edge)."""
        series = self._samples(names.INFERENCE_COUNT, start, end, model=ENSEMBLE_MODEL)
        return _times(series, start, end)

    def wait_for_scrapes(self, count: int, timeout: float = 30.0) -> None:
        """Until the target has ``count`` scrapes in the last 30 s: windows are aligned to them."""
        deadline = time.monotonic() + timeout
        while len(self.scrape_times(time.time() - 30, time.time())) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus scraped {self.instance} fewer than {count} times")
            time.sleep(0.5)

    def next_scrape(self, after: float, history_s: float = 30.0) -> tuple[float, float]:
        """(the first scrape at or after ``after``, the scrape interval), predicted from the
        recent scrapes: Prometheus scrapes a target at a fixed phase."""
        times = self.scrape_times(time.time() - history_s, time.time())
        if len(times) < 3:
            raise RuntimeError(f"only {len(times)} recent scrapes of {self.instance}")
        interval = statistics.median(b - a for a, b in itertools.pairwise(times))
        return times[-1] + max(0, math.ceil((after - times[-1]) / interval)) * interval, interval

    def window_deltas(self, start: float, end: float) -> tuple[Deltas, AlignedWindow]:
        """Every counter's increase from the first scrape in [start, end] to the last."""
        series = self._samples("|".join(COUNTERS), start, end)
        times = _times(series, start, end)
        if len(times) < 2:
            raise RuntimeError(
                f"Prometheus has {len(times)} scrape(s) of {self.instance or 'the target'} in the "
                f"{end - start:.1f} s window: scrape more often or measure longer"
            )
        edges: tuple[dict, dict] = ({}, {})
        for s in series:
            labels = dict(s["metric"])
            key = (sample_name(labels.pop("__name__")), tuple(sorted(labels.items())))
            values = {float(t): float(v) for t, v in s["values"]}
            for edge, at in zip(edges, (times[0], times[-1]), strict=True):
                if at in values:
                    edge[key] = values[at]
        deltas = snapshot_deltas(Snapshot(times[0], edges[0]), Snapshot(times[-1], edges[1]))
        return deltas, AlignedWindow(times[0], times[-1], len(times))


class PrometheusChoice(NamedTuple):
    source: PromSource | None  # None: Triton's metrics port, read at both ends of a window
    note: str  # which one, in a sentence for the log and the report


@contextmanager
def prometheus_for(
    choice: str, endpoints: Endpoints, folder: Path | None = None
) -> Iterator[PrometheusChoice]:
    """The Prometheus Triton's figures come from (``--prometheus``: off, a URL, or auto: one
    that scrapes this Triton, else one started for the run in ``folder``, else none)."""
    if choice == "off":
        yield PrometheusChoice(None, "Prometheus: off (--prometheus off)")
        return
    default = os.environ.get("PROMETHEUS_URL") or "http://127.0.0.1:9090"
    url = default if choice == "auto" else choice
    target, source = endpoints.metrics_target, PromSource(url)
    source.instance = source.find_instance(target)
    if source.instance:
        yield PrometheusChoice(source, f"Prometheus at {url} (target {source.instance})")
        return
    note = f"no Prometheus at {url} scrapes {endpoints.metrics_url}"
    if choice != "auto":
        raise SystemExit(note)
    if folder is None or find_binary() is None:
        yield PrometheusChoice(None, f"{note}: Triton's metrics port instead ({INSTALL_HINT})")
        return
    with PrometheusServer(target, free_port(), folder / "prometheus", interval="1s") as server:
        own = PromSource(server.url, instance=target)
        own.wait_for_scrapes(3)  # the windows are aligned to its scrapes
        yield PrometheusChoice(
            own, f"Prometheus started for this run at {server.url} (target {target}, every 1s)"
        )
