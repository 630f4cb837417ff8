"""The seed's load test, ``make loadtest``: a Locust sweep over output lengths.

- :mod:`loadtest.sweep.settings`: the command line and the typed settings.
- :mod:`loadtest.sweep.driver`: the per-length Locust driver (warm-up, window, streaming,
  drain); :mod:`loadtest.sweep.run` runs a whole sweep (``python -m loadtest.sweep``, or
  ``python -m loadtest``).
- :mod:`loadtest.sweep.locustfile` (the users; :mod:`loadtest.sweep.openai_protocol` for the
  OpenAI API), their prompts from :mod:`contract.prompts`.
- :mod:`loadtest.sweep.report`: the run folder's report, from :mod:`loadtest.sweep.charts` and
  :mod:`loadtest.sweep.markdown` (prose: ``loadtest/templates/report.md``), through the shared
  :mod:`reporting` helpers.

Importing this package imports nothing else: Locust monkey-patches the process with gevent, so
only the run, its driver and the locustfile load it.
"""
