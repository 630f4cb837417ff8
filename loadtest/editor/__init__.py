"""``make loadtest PROFILE=editor``: the traffic editors send (see docs/loadtest.md and
docs/editor-load.md).

One module per concern, in the order a run uses them:

- :mod:`loadtest.editor.typist`: where a simulated typist pauses in a real file, seeded.
- :mod:`loadtest.editor.window`: the prefix and suffix sent, clipped to the model's context.
- :mod:`loadtest.editor.protocols`: a request over the OpenAI API (SSE) or a gRPC stream, which
  a typist waits on until its next keystroke and then abandons.
- :mod:`loadtest.editor.suffix`: the probe that decides whether suffixes can be sent.
- :mod:`loadtest.editor.drive`: typist threads for a bounded time (shared with ``make soak``).
- :mod:`loadtest.editor.drill`: long completions abandoned at their first piece (tokens
  generated after a client left).
- :mod:`loadtest.editor.figures`: records and figures; :mod:`loadtest.editor.report`: the run
  folder; :mod:`loadtest.editor.compare`: prefix cache on vs off, the targets;
  :mod:`loadtest.editor.run`: the command line (the comparison, or one run).

Nothing here imports Locust: the typists are plain threads.
"""
