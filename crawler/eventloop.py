"""Running a daemon's main coroutine on the fastest event loop available.

uvloop (libuv) cuts the event loop's own cost per network event by a large factor, and a crawler is little more
than network events; the daemons fall back to asyncio's loop where uvloop is not installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
    uvloop = None  # type: ignore[assignment]


def run(main: Coroutine[Any, Any, int]) -> int:
    if uvloop is not None:
        return uvloop.run(main)
    return asyncio.run(main)
