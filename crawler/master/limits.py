"""The crawl's limits (crawl.max_pages, crawl.max_bytes, crawl.max_duration): which one, if any, ends the crawl.

Pure: the figures and the time come in, the key of the limit reached goes out. The daemon ends the crawl on it (or
pauses it, with exit_when_done off), and says which key did in the log and in `status --json` ("limit").

| limit               | reached when                                                     | counted over       |
|---------------------|------------------------------------------------------------------|--------------------|
| crawl.max_pages     | this many pages were handed out                                  | this run           |
| crawl.max_bytes     | the workers reported this many bytes fetched (pages and audio)   | the whole crawl    |
| crawl.max_duration  | this many seconds passed since the crawl first started          | the whole crawl    |

When several are reached at once, the first in this table is named.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PAGES, MAX_BYTES, MAX_DURATION = "crawl.max_pages", "crawl.max_bytes", "crawl.max_duration"
# The meta key under which the store keeps when the crawl first started (epoch seconds), so that max_duration
# survives a restart of the master.
STARTED_META = "crawl_started"
# The meta key of the limit that ended (or paused) the crawl: what `status --json` shows as "limit".
LIMIT_META = "limit"


@dataclass(frozen=True)
class Limits:
    max_pages: int | None = None
    max_bytes: int | None = None
    max_duration: float | None = None


def limit_reached(limits: Limits, *, pages: int, bytes_fetched: int, started: float, now: float) -> str | None:
    """The key of the first limit reached (pages handed out this run, bytes fetched, the crawl's start), or None."""
    if limits.max_pages is not None and pages >= limits.max_pages:
        return MAX_PAGES
    if limits.max_bytes is not None and bytes_fetched >= limits.max_bytes:
        return MAX_BYTES
    if limits.max_duration is not None and now - started >= limits.max_duration:
        return MAX_DURATION
    return None
