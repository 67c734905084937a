"""The store gate (crawler/master/storegate.py): while a commit holds the store on the commit thread, a guarded
task does not run, a cancellation waits for the commit's end, and an unguarded use of the store raises."""

from __future__ import annotations

import asyncio
import threading

import pytest

from crawler.master.store import MasterStore, StoreInUse
from crawler.master.storegate import StoreGate


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A store whose COMMIT on the commit thread waits until the test lets it go."""
    release = threading.Event()
    committing = threading.Event()
    real_end = MasterStore.end_transaction

    def held_end(self: MasterStore) -> None:
        committing.set()
        release.wait(10)
        real_end(self)

    monkeypatch.setattr(MasterStore, "end_transaction", held_end)
    store = MasterStore(tmp_path / "m.db")
    yield store, committing, release
    release.set()
    store.close()


async def _committing(gate: StoreGate, store: MasterStore, committing: threading.Event) -> asyncio.Task[None]:
    store.push([("http://s/1", 0, 0, "n", None)])
    assert store.prepare_commit()
    commit = asyncio.create_task(gate.end_transaction())
    await asyncio.to_thread(committing.wait, 10)
    return commit


async def test_a_guarded_task_waits_for_the_commit_and_the_store_refuses_others(held):
    store, committing, release = held
    gate = StoreGate(store)
    seen: list[int] = []
    step = asyncio.Event()

    async def task() -> None:
        await step.wait()
        seen.append(len(store.known(["http://s/1"])))      # never mid-commit

    guarded = asyncio.create_task(gate.guard(task()))
    await asyncio.sleep(0)
    commit = await _committing(gate, store, committing)
    assert not gate._free.is_set()
    with pytest.raises(StoreInUse):
        store.known(["http://s/1"])              # an unguarded use meets the lent store
    step.set()
    await asyncio.sleep(0.05)
    assert seen == []                            # resumed only once the commit has ended
    release.set()
    await commit
    await guarded
    assert seen == [1] and gate._free.is_set()


async def test_a_cancellation_during_a_commit_is_delivered_after_it(held):
    store, committing, release = held
    gate = StoreGate(store)
    cleaned: list[bool] = []

    async def task() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(gate._free.is_set())
            store.known(["http://s/1"])          # its cleanup uses the store: after the commit

    guarded = asyncio.create_task(gate.guard(task()))
    await asyncio.sleep(0)
    commit = await _committing(gate, store, committing)
    guarded.cancel()
    await asyncio.sleep(0.05)
    assert not guarded.done() and cleaned == []
    release.set()
    await commit
    with pytest.raises(asyncio.CancelledError):
        await guarded
    assert cleaned == [True]


async def test_a_guarded_coroutine_returns_its_value_and_raises_its_errors(tmp_path):
    with MasterStore(tmp_path / "m.db") as store:
        gate = StoreGate(store)

        async def value() -> int:
            await asyncio.sleep(0)
            return 7

        async def fails() -> None:
            await asyncio.sleep(0)
            raise KeyError("x")

        assert await gate.guard(value()) == 7
        with pytest.raises(KeyError):
            await gate.guard(fails())
