"""``python -m loadtest.soak``: one soak run (:func:`loadtest.soak.run.main`)."""

import sys

from loadtest.soak.run import main

sys.exit(main())
