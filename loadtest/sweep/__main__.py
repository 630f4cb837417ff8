"""``python -m loadtest.sweep``: one whole sweep (:func:`loadtest.sweep.run.main`)."""

import sys

from loadtest.sweep.run import main

sys.exit(main())
