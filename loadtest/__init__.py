"""Load tests of the served ensemble, one subpackage per profile (docs/tooling.md has the map).
Importing this package imports nothing else: Locust patches the process with gevent."""

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
