"""``python -m loadtest.soak``: one soak run."""

import sys

from loadtest.soak.run import main

sys.exit(main())
