"""``python -m loadtest``: the sweep over output lengths, as ``python -m loadtest.sweep``."""

import sys

from loadtest.sweep.run import main

sys.exit(main())
