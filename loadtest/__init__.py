"""Load test of the served ensemble: a Locust sweep over output lengths (``make loadtest``).

One module per concern, in the order a run uses them (docs/loadtest.md has the map):

- :mod:`loadtest.settings`: the command line and the typed settings.
- :mod:`loadtest.targets`: what is loaded (one entry per protocol) and which Prometheus
  watches it; found, waited for or started with the launcher's process management.
- :mod:`loadtest.sweep`: the per-length Locust driver (warm-up, window, streaming, drain);
  :mod:`loadtest.main` runs the whole thing (``python -m loadtest.sweep``).
- :mod:`loadtest.locustfile` (the users) and :mod:`loadtest.prompts` (their prompts).
- :mod:`loadtest.metrics`: Triton's metrics over a window; :mod:`loadtest.prom`: the same
  from Prometheus, and how the two agree.
- :mod:`loadtest.results`: the typed results, the schema of summary.json.
- :mod:`loadtest.report`: the run folder's report, from :mod:`loadtest.charts` and
  :mod:`loadtest.markdown` (its prose: ``loadtest/templates/report.md``).
- :mod:`loadtest.run_prometheus`: a Prometheus server (``make prometheus``).

Importing this package imports nothing else: Locust monkey-patches the process with gevent, so
only the sweep, its runner and the locustfile load it.
"""
