"""The daemons' logging: one line a record (time, level, logger, message), alike for both daemons.

Times are ISO-8601 in UTC with milliseconds (2026-12-02T17:20:01.123Z): the master and its workers run on
machines in different time zones, and their logs are read side by side.

Records go to stderr (the journal, under systemd) or to --log-file. On SIGHUP the daemons call reopen_logs(), so
logrotate can move the file away and the daemon carries on in a fresh one.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def iso_utc(t: float | None) -> str | None:
    """An epoch time as ISO-8601 UTC (seconds), as logs and exports print it; None stays None."""
    if t is None:
        return None
    return _iso_second(math.floor(t))


@functools.lru_cache(maxsize=256)
def _iso_second(second: int) -> str:
    # Cached: an export or a busy catalogue writes thousands of rows stamped with the same few seconds.
    return datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_time(text: str) -> float:
    """An operator's time as epoch seconds: ISO-8601 (a time without an offset is UTC) or epoch seconds.
    ValueError with a one-line reason otherwise."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time (e.g. 2026-12-02T20:00:00Z) or epoch seconds") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


class ReopenableFileHandler(logging.FileHandler):
    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            if old is not None:
                old.close()
        finally:
            self.release()


def setup_logging(level: str, log_file: Path | None = None) -> None:
    """Raises OSError when the log file cannot be opened (the CLI reports it as one line)."""
    handler: logging.Handler
    if log_file is not None:
        handler = ReopenableFileHandler(log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(UTCFormatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # httpx logs every request at INFO: far too much for a crawler's log. aiohttp.web logs every request too.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def write_summary(text: str, log_file: Path | None) -> None:
    """A daemon's end summary: into the log file when there is one (where the operator reads that run), else on
    standard output."""
    if log_file is None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        logging.getLogger("crawler").info("%s", text)


def reopen_logs() -> None:
    """Reopen the log file (after logrotate moved it); nothing to do when logging to stderr."""
    for h in logging.getLogger().handlers:
        if isinstance(h, ReopenableFileHandler):
            h.reopen()
    logging.getLogger("crawler").info("log file reopened")
