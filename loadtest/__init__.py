"""Load tests of the served ensemble, one subpackage per profile (docs/tooling.md has the map):
:mod:`loadtest.sweep` (``make loadtest``), :mod:`loadtest.editor` (typists), :mod:`loadtest.soak`
(load and faults) and :mod:`loadtest.stress` (clients leaving at every point). What they share sits
here; importing this package imports nothing else (Locust patches the process with gevent)."""

import logging
import sys


def console() -> None:
    """A load test's progress on stdout, one ``[loadtest]`` line each."""
    logger = logging.getLogger("loadtest")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[loadtest] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
