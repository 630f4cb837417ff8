"""What every tool (load test, soak, benchmark) shares: the Triton it measures and this machine.

:mod:`reporting.triton` finds or starts the server, describes it and waits for it to drain;
:mod:`reporting.machine` describes the machine; :mod:`reporting.tables` and
:mod:`reporting.charts` lay out the Markdown reports and their PNG charts. It imports only
``contract`` and ``serving`` of the project, so every tool may import it.
"""
