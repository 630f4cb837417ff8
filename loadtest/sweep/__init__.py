"""The seed's load test, ``make loadtest``: a Locust sweep over output lengths. Importing this
package imports nothing else: Locust patches the process with gevent."""

# The streaming users' request names in the event table: one ``stream`` row per request (its
# first_token_ms and tokens), one ``stream inter-token`` row per gap between two pieces.
STREAM_NAME, ITL_NAME = "stream", "stream inter-token"
