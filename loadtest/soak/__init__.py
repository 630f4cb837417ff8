"""``make soak``: bounded load and faults at twice the saturation (:mod:`loadtest.soak.run`).

One module per concern: :mod:`~loadtest.soak.settings` (command line),
:mod:`~loadtest.soak.cases` (the kinds, invalid and hostile cases, error classes),
:mod:`~loadtest.soak.clients` (one worker per client thread), :mod:`~loadtest.soak.phases`
(ramp and soak), :mod:`~loadtest.soak.editor_phase` (the typists), :mod:`~loadtest.soak.drill`
(the stub-kill drill), :mod:`~loadtest.soak.server` (find or start the server, RSS, engine
gauges), :mod:`~loadtest.soak.stall` (the stall bound), :mod:`~loadtest.soak.results` (the
ledger and the checks) and :mod:`~loadtest.soak.report` (the run folder, through the shared
:mod:`reporting` helpers). ``python -m loadtest.soak`` runs it.
"""
