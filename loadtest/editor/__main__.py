"""``python -m loadtest.editor``: see :mod:`loadtest.editor.run`."""

from loadtest.editor.run import main

raise SystemExit(main())
