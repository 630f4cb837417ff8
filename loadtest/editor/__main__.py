"""``python -m loadtest.editor``: see :mod:`loadtest.editor.run`."""

import sys

from loadtest.editor.run import main

sys.exit(main())
