"""Load tests of the served ensemble, one subpackage per profile (docs/loadtest.md has the map):

- :mod:`loadtest.sweep`: ``make loadtest``, a Locust sweep over output lengths
  (``python -m loadtest`` or ``python -m loadtest.sweep``).
- :mod:`loadtest.editor`: ``make loadtest PROFILE=editor``, simulated typists.
- :mod:`loadtest.soak`: ``make soak``, bounded load and faults at twice the saturation.
- :mod:`loadtest.stress`: clients abandoning requests at every point.

What they share sits here: :mod:`loadtest.targets` (what is loaded and which Prometheus watches
it), :mod:`loadtest.api_process` (the OpenAI API in front), :mod:`loadtest.metrics` (Triton's
metrics over a window), :mod:`loadtest.prom` (the same from Prometheus when one runs),
:mod:`loadtest.results` (the machine and model a report header names) and
:mod:`loadtest.run_prometheus` (``make prometheus``), and :func:`console` below. Every request
of a profile is a row of the one event table, :mod:`reporting.events`. The server, the machine
and the drain are every tool's (:mod:`reporting.triton`, :mod:`reporting.machine`); the
requests travel on the client's transport (:mod:`client.transport`); the prompts come from
:mod:`contract.prompts`.

Importing this package imports nothing else: Locust monkey-patches the process with gevent, so
only the sweep's run, its driver and the locustfile load it.
"""

import logging
import sys


def console() -> None:
    """A load test's progress on stdout, one ``[loadtest]`` line each (Locust's own logging
    stays off, as the sweep drives it through its API)."""
    logger = logging.getLogger("loadtest")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[loadtest] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
