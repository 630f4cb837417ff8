"""``make loadtest PROFILE=editor``: the traffic editors send (see docs/editor-load.md).

One module per concern, in the order a run uses them:

- :mod:`loadtest.editor.typist`: where a simulated typist pauses in a real file, seeded.
- :mod:`loadtest.editor.window`: the prefix and suffix sent, clipped to the prompt budget.
- :mod:`loadtest.editor.protocols`: a request over the OpenAI API (SSE), a gRPC stream or
  llama.cpp's server, with the editor's stop rules, abandoned at the next keystroke.
- :mod:`loadtest.editor.suffix`: the probe that decides whether suffixes can be sent.
- :mod:`loadtest.editor.systems`: the servers measured, their counters and CPU.
- :mod:`loadtest.editor.drive`: one pause's request (and typist threads for ``make soak``).
- :mod:`loadtest.editor.users`: the typists as Locust users, window after window.
- :mod:`loadtest.editor.drill`: long completions abandoned at their first piece.
- :mod:`loadtest.editor.figures`: the figures, from the event table; :mod:`.compare`: the
  comparisons and the targets; :mod:`.report`: the run folder; :mod:`.run`: the command line.
"""
