"""The seed's load test, ``make loadtest``: a Locust sweep over output lengths.

- :mod:`loadtest.sweep.settings`: the command line and the typed settings.
- :mod:`loadtest.sweep.driver`: the per-length Locust driver (warm-up, window, streaming,
  drain), every request a row of :class:`reporting.events.EventLog`;
  :mod:`loadtest.sweep.run` runs a whole sweep (``python -m loadtest.sweep``).
- :mod:`loadtest.sweep.locustfile`: the users (HTTP, gRPC, streaming, the OpenAI API), their
  prompts from :mod:`contract.prompts`.
- :mod:`loadtest.sweep.report`: the report from the run folder's ``events.csv`` and
  ``run.json``, with :mod:`loadtest.sweep.charts` and :mod:`loadtest.sweep.markdown` (prose:
  ``loadtest/templates/report.md``).

Importing this package imports nothing else: Locust monkey-patches the process with gevent, so
only the run, its driver and the locustfile load it.
"""

# The streaming users' request names in the event table: one ``stream`` row per request (its
# first_token_ms and tokens), one ``stream inter-token`` row per gap between two pieces.
STREAM_NAME, ITL_NAME = "stream", "stream inter-token"
