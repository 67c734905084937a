"""The single-writer rule of the master's store, kept by structure rather than by each task remembering it.

The running master ends its store's transactions on a thread of its own (the COMMIT, and on SQLite the WAL
checkpoint it runs every few thousand pages: 80-100 ms on a big crawl), so the event loop keeps serving the
workers meanwhile. The store's connection must then be used by that thread alone until the COMMIT has ended.

Two things make that so:

- every task of the master that uses the store runs through ``StoreGate.guard``: the guarded coroutine is resumed
  only while no commit runs (a resumption that falls in one waits for its end; a cancellation that falls in one
  is delivered after it), so the code between two awaits never meets a commit in progress, whatever it calls;
- while the commit thread holds the store, the store is lent (``StoreCore.lend``): any use of it from the loop
  raises StoreInUse at once instead of interleaving statements with the COMMIT. Only a task started without the
  gate can meet it, and it is a bug to say loudly.

The cost is one flag test per resumption of a guarded task (never per URL), and nothing on the store's own paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from crawler.master.store import MasterStore

T = TypeVar("T")


class StoreGate:
    """Owns the commit thread, and lets the master's tasks run only while that thread does not hold the store."""

    def __init__(self, store: MasterStore) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-commit")
        self._free = asyncio.Event()
        self._free.set()
        self._ending: Future[None] | None = None

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work` (a coroutine, in the calling task) so that none of its steps begins while a commit holds
        the store."""
        return await _Guarded(self._free, work)

    async def end_transaction(self) -> None:
        """End the store's open transaction on the commit thread (prepare_commit() has staged it). The store is
        lent to the thread meanwhile, and the gate opens when the COMMIT has ended, even if the task awaiting it
        is cancelled (a stop): the thread's use of the store is never overlapped."""
        self._free.clear()
        self.store.core.lend()
        self._ending = self._thread.submit(self._end)
        ending = asyncio.wrap_future(self._ending)
        ending.add_done_callback(lambda _: self._free.set())
        await asyncio.shield(ending)

    def _end(self) -> None:
        try:
            self.store.end_transaction()
        finally:
            self.store.core.take_back()

    def wait_ended(self) -> None:
        """A commit still running on the commit thread ends first (at start-up and shutdown, on the loop's thread,
        when no task runs)."""
        if self._ending is not None:
            futures.wait([self._ending])


class _Guarded(Generic[T]):
    """An awaitable that drives another step by step, each step begun only once `free` is set."""

    __slots__ = ("_coro", "_free")

    def __init__(self, free: asyncio.Event, work: Awaitable[T]) -> None:
        self._free = free
        self._coro = work.__await__()

    def __await__(self) -> Generator[Any, Any, T]:
        coro, free = self._coro, self._free
        value: Any = None
        error: BaseException | None = None
        while True:
            while not free.is_set():
                try:
                    yield from free.wait().__await__()
                except asyncio.CancelledError as e:
                    # Delivered once the commit has ended: the task's own handlers may use the store.
                    error = error or e
            try:
                if error is None:
                    step = coro.send(value)
                else:
                    step, error = coro.throw(error), None
            except StopIteration as e:
                result: T = e.value
                return result
            try:
                value = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:
                value, error = None, e
