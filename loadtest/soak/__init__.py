"""``make soak``: bounded load and faults at twice the saturation, on Locust
(:mod:`loadtest.soak.run`, which ``python -m loadtest.soak`` runs).

:mod:`~loadtest.soak.settings` (command line), :mod:`~loadtest.soak.cases` (the kinds, invalid
and hostile cases, error classes, verdicts), :mod:`~loadtest.soak.send` (one request of any
kind, as a Locust request event), :mod:`~loadtest.soak.plan` (the phases as load-shape stages),
:mod:`~loadtest.soak.users` (the Locust users, the shape and the editor phase's typists),
:mod:`~loadtest.soak.drill` (the stub-kill drill), :mod:`~loadtest.soak.server` (RSS, engine
gauges, the stub), :mod:`~loadtest.soak.checks` (figures and checks from the event table) and
:mod:`~loadtest.soak.report` (the run folder).
"""
