"""Load test of the served ensemble: a Locust sweep over output lengths (``make loadtest``).

Modules: :mod:`loadtest.prompts` (varied code prompts), :mod:`loadtest.locustfile` (the users),
:mod:`loadtest.metrics` (Triton metric snapshots and the window arithmetic),
:mod:`loadtest.prom` (the same figures from a real Prometheus), :mod:`loadtest.sweep` (the
driver), :mod:`loadtest.report` (summary.json, report.md, charts) and
:mod:`loadtest.run_prometheus` (``make prometheus``). Importing this package imports nothing
else: Locust monkey-patches the process with gevent, so only the sweep and the locustfile load it.
"""
