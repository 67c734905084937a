"""The daemons' logging: one line a record on stderr (time, level, logger, message), alike for both daemons.

Times are ISO-8601 in UTC with milliseconds (2026-12-02T17:20:01.123Z): the master and its workers run on
machines in different time zones, and their logs are read side by side.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime


class UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def iso_utc(t: float | None) -> str | None:
    """An epoch time as ISO-8601 UTC (seconds), as logs and exports print it; None stays None."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(UTCFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # httpx logs every request at INFO: far too much for a crawler's log. aiohttp.web logs every request too.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
