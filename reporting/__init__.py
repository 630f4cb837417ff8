"""Tables and charts for the project's run reports, in one neutral place.

The load test's sweep and editor profile, the soak and the benchmark write Markdown reports
with PNG charts; they format numbers, lay out tables, fill template prose and save figures
through :mod:`reporting.tables` and :mod:`reporting.charts`. It imports nothing of the project
(figures come in as plain values), so any of them may import it.
"""
