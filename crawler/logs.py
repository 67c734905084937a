"""The daemons' logging: one line a record on stderr (time, level, logger, message), alike for both daemons."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: far too much for a crawler's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
