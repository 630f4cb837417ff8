"""The seed's load test, ``make loadtest``: a Locust sweep over output lengths (:mod:`.run`, with
its command line in :mod:`.settings`, its users in :mod:`.locustfile` and its report in
:mod:`.report`). Importing this package imports nothing else: Locust patches the process with
gevent, so only the run and the locustfile load it."""

# The streaming users' request names in the event table: one ``stream`` row per request (its
# first_token_ms and tokens), one ``stream inter-token`` row per gap between two pieces.
STREAM_NAME, ITL_NAME = "stream", "stream inter-token"
