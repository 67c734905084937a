"""The downloads' deadlines under one timer, driven by a fake clock: no test here waits for time to pass."""

from __future__ import annotations

import asyncio

import pytest

from crawler.worker.downloader import DownloadConfig, _Deadlines
from crawler.worker.transfer import Deadline
from tests.fakes.clock import FakeClock

CFG = DownloadConfig(deadline_base=10.0, min_rate=1000.0)


async def _held(started: asyncio.Event, release: asyncio.Event, clock: FakeClock, deadlines: _Deadlines,
                box: list[Deadline]) -> str:
    """A download's task: its deadline kept while it waits; what ended it."""
    deadline = Deadline(clock.time(), CFG)
    box.append(deadline)
    deadlines.keep(deadline)
    started.set()
    try:
        await release.wait()
        return "done"
    except asyncio.CancelledError:
        if not deadline.timed_out():
            raise
        return "timed out"
    finally:
        deadlines.drop(deadline)


async def _start(clock: FakeClock, deadlines: _Deadlines, release: asyncio.Event
                 ) -> tuple[asyncio.Task[str], Deadline]:
    started, box = asyncio.Event(), []
    task = asyncio.create_task(_held(started, release, clock, deadlines, box))
    await started.wait()
    return task, box[0]


async def test_one_timer_keeps_every_deadline_and_fires_only_the_due_ones():
    clock, release = FakeClock(), asyncio.Event()
    deadlines = _Deadlines(clock)
    first, d1 = await _start(clock, deadlines, release)
    clock.advance(3)
    second, d2 = await _start(clock, deadlines, release)
    assert clock.alarms() == [d1.at] == [clock.now - 3 + 10]      # one timer, for the earliest
    clock.advance(6.9)
    await asyncio.sleep(0)
    assert not first.done()
    clock.advance(0.2)        # the first is due; the timer moves on to the second
    assert await first == "timed out"
    assert clock.alarms() == [d2.at] and not second.done()
    release.set()
    assert await second == "done"


async def test_a_stretched_deadline_is_checked_again_not_expired():
    clock, release = FakeClock(), asyncio.Event()
    deadlines = _Deadlines(clock)
    task, deadline = await _start(clock, deadlines, release)
    deadline.stretch(50_000, 0)           # 50 s more at min_rate
    clock.advance(20)
    await asyncio.sleep(0)
    assert not task.done() and clock.alarms() == [deadline.at] == [clock.now - 20 + 60]
    clock.advance(40)
    assert await task == "timed out"
    assert clock.alarms() == []


async def test_an_earlier_deadline_rearms_the_timer_a_stretched_one_holds():
    clock, release = FakeClock(), asyncio.Event()
    deadlines = _Deadlines(clock)
    big, far = await _start(clock, deadlines, release)
    far.stretch(1_000_000, 0)             # 1,000 s for its size
    clock.advance(11)                     # its first deadline passed: the timer moves ~1,000 s ahead
    await asyncio.sleep(0)
    assert clock.alarms() == [far.at]
    small, near = await _start(clock, deadlines, release)
    assert clock.alarms() == [near.at]    # set for the newer, earlier deadline
    clock.advance(10)
    assert await small == "timed out"
    assert not big.done() and clock.alarms() == [far.at]
    release.set()
    assert await big == "done"


async def test_a_dropped_deadline_never_expires_and_a_cancel_from_outside_propagates():
    clock, release = FakeClock(), asyncio.Event()
    deadlines = _Deadlines(clock)
    task, deadline = await _start(clock, deadlines, release)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    clock.advance(100)                    # the timer fires with nothing left to expire
    assert not deadline.expired and clock.alarms() == []


async def test_a_cancel_from_outside_with_the_deadline_still_propagates():
    clock, release = FakeClock(), asyncio.Event()
    deadlines = _Deadlines(clock)
    task, _ = await _start(clock, deadlines, release)
    clock.advance(10)                     # the deadline cancels the task ...
    task.cancel()                         # ... and so does its owner, before it runs
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_a_clock_the_running_loops_time_is_used():
    deadlines = _Deadlines()
    loop = asyncio.get_running_loop()
    before = loop.time()
    assert before <= deadlines.now() <= loop.time()


def test_the_fake_clock_runs_what_falls_due_in_time_order_at_its_own_time():
    clock, ran = FakeClock(start=0.0), []
    clock.call_at(3.0, lambda: ran.append(("c", clock.time())))
    clock.call_at(1.0, lambda: (ran.append(("a", clock.time())), clock.call_at(2.0, lambda: ran.append(("b", 2.0)))))
    clock.call_at(2.5, lambda: ran.append(("never", clock.time()))).cancel()
    clock.advance(2.0)
    assert ran == [("a", 1.0), ("b", 2.0)] and clock.time() == 2.0
    assert clock.alarms() == [3.0]
    clock.advance(5.0)
    assert ran[-1] == ("c", 3.0) and clock.time() == 7.0 and clock.alarms() == []
