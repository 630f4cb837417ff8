"""Load tests of the served ensemble, one subpackage per profile (docs/loadtest.md has the map):

- :mod:`loadtest.sweep`: ``make loadtest``, a Locust sweep over output lengths
  (``python -m loadtest`` or ``python -m loadtest.sweep``).
- :mod:`loadtest.editor`: ``make loadtest PROFILE=editor``, simulated typists.
- :mod:`loadtest.soak`: ``make soak``, bounded load and faults at twice the saturation.
- :mod:`loadtest.stress`: clients abandoning requests at every point.

What they share sits here: :mod:`loadtest.targets` (what is loaded and which Prometheus watches
it), :mod:`loadtest.api_process` (the OpenAI API in front), :mod:`loadtest.metrics` (Triton's
metrics over a window), :mod:`loadtest.prom` (the same from Prometheus),
:mod:`loadtest.results` (typed results), :mod:`loadtest.machine` (this machine, as a report
says it) and :mod:`loadtest.run_prometheus` (``make prometheus``). Their prompts come from
:mod:`contract.prompts`; their tables and charts from :mod:`reporting`.

Importing this package imports nothing else: Locust monkey-patches the process with gevent, so
only the sweep's run, its driver and the locustfile load it.
"""
