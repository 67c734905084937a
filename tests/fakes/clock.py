"""Time for tests that must not wait for it: a fake monotonic clock, and a poll for conditions nothing signals.

``FakeClock`` offers what code taking an event loop's clock reads of it (``time()``, ``call_at()``), so a
deadline is tested by moving time on, not by sleeping past it:

    clock = FakeClock()
    dl = Downloader(client, tmp, cfg, deadline_clock=clock)
    ...
    clock.advance(2.0)          # the callbacks due by then run, in time order, at their own times

``until`` waits for a condition another task, thread or process brings about and that has no event of its own
(a file grows): checked often, with a deadline, so a test waits only as long as the condition takes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable


class FakeAlarm:
    """A callback set for a time on a FakeClock (asyncio.TimerHandle's ``when`` and ``cancel``)."""

    __slots__ = ("_when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self._when, self.callback, self.cancelled = when, callback, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A monotonic clock that moves only when told to; callbacks set on it run as it passes their times."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._alarms: list[tuple[float, int, FakeAlarm]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeAlarm:
        alarm = FakeAlarm(when, callback)
        heapq.heappush(self._alarms, (when, next(self._order), alarm))
        return alarm

    def alarms(self) -> list[float]:
        """The times callbacks are set for (cancelled ones left out), earliest first."""
        return sorted(when for when, _, alarm in self._alarms if not alarm.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, running each callback due meanwhile at its own time, in time order
        (callbacks they set that fall due within the step run as well)."""
        target = self.now + seconds
        while self._alarms and self._alarms[0][0] <= target:
            when, _, alarm = heapq.heappop(self._alarms)
            if alarm.cancelled:
                continue
            self.now = max(self.now, when)
            alarm.callback()
        self.now = target


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0,
                what: str = "the condition", *, interval: float = 0.005) -> None:
    """Return once predicate() holds (it may be a coroutine function: an HTTP look, say); AssertionError if it still
    does not after ``timeout`` seconds. ``interval``: the pause between looks, longer for a look that costs."""
    deadline = time.monotonic() + timeout
    while True:
        held = predicate()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)
