"""``python -m loadtest``: the default load test, the sweep over output lengths (the same as
``python -m loadtest.sweep``). The other profiles have their own entry points:
``python -m loadtest.editor`` (typists), ``python -m loadtest.soak`` (load and faults) and
``python -m loadtest.stress`` (clients leaving at every point)."""

import sys

from loadtest.sweep.run import main

sys.exit(main())
