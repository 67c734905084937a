"""The running master ends its store's transactions on a thread of its own: a slow disk (the WAL written, a
checkpoint with its fsyncs) holds neither the event loop nor, while it runs, any use of the store from the loop.

A real master in this process, a worker spoken by hand (tests/fakes/rawpeer.py) reporting pages as fast as they
are assigned, and a store whose COMMIT takes SLOW seconds. Every statement the loop's thread sends to the database
while a COMMIT is under way on the commit thread is recorded: there must be none (the store gate), and the loop
must stay responsive (its lag probe) although every commit takes far longer than the 50 ms bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from crawler import protocol as p
from crawler.master.backend import SqliteBackend
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from crawler.master.store import MasterStore
from testkit.cluster import read_secret, write_secret
from tests.fakes.rawpeer import RawPeer

SLOW = 0.3        # seconds each COMMIT takes
TRAFFIC = 2.5     # seconds of reports


async def test_a_slow_commit_holds_neither_the_event_loop_nor_the_store(tmp_path, monkeypatch, until):
    committing = threading.Event()     # set while a COMMIT runs on a thread other than the loop's
    commits: list[float] = []
    overlaps: list[str] = []
    real_end = MasterStore.end_transaction

    def slow_end(self: MasterStore) -> None:
        if threading.current_thread() is threading.main_thread():
            real_end(self)   # at start-up and shutdown, when the loop does nothing else
            return
        committing.set()
        try:
            time.sleep(SLOW)     # the behaviour under test: a slow disk's COMMIT
            real_end(self)
        finally:
            committing.clear()
            commits.append(time.monotonic())

    real_execute, real_many = SqliteBackend.execute, SqliteBackend.executemany

    def watched_execute(self: SqliteBackend, sql: str, args: Any = ()) -> Any:
        if committing.is_set() and threading.current_thread() is threading.main_thread():
            overlaps.append(sql[:60])
        return real_execute(self, sql, args)

    def watched_many(self: SqliteBackend, sql: str, rows: Any) -> None:
        if committing.is_set() and threading.current_thread() is threading.main_thread():
            overlaps.append(sql[:60])
        real_many(self, sql, rows)

    monkeypatch.setattr(MasterStore, "end_transaction", slow_end)
    monkeypatch.setattr(SqliteBackend, "execute", watched_execute)
    monkeypatch.setattr(SqliteBackend, "executemany", watched_many)

    secret = write_secret(tmp_path / "secret")
    seeds = [f"http://127.0.0.1:9/p{i}" for i in range(200)]
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"], "seeds": seeds,
           "secret_file": str(secret), "exit_when_done": False, "politeness": {"obey_robots": False},
           "web": {"listen": "off"}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait_for(listening.wait(), 30)
    peer = await RawPeer.join(f"127.0.0.1:{master.port}", "w1", 64, read_secret(secret))
    reported: set[str] = set()
    try:
        peer.keep_alive(0.5)
        peer.send(p.Credit(64))
        traffic_ends = time.monotonic() + TRAFFIC
        while time.monotonic() < traffic_ends:
            try:
                m = await peer.recv(timeout=0.5)
            except TimeoutError:
                continue
            if not isinstance(m, p.Assign):
                continue
            # Each page done with two new links: the frontier, the URL table and the counters all written.
            peer.send(p.Report(tuple(
                p.Result(t.lease, t.url, p.DONE, 200, size=100, content_type="text/html",
                         links=(f"{t.url}/a", f"{t.url}/b"))
                for t in m.tasks)), p.Credit(len(m.tasks)))
            reported.update(t.url for t in m.tasks)
        await until(lambda: master.statistics().run_pages >= len(reported), 30, "the last reports recorded")
    finally:
        peer.close()
        master.stop()
        await asyncio.wait_for(serving, 30)

    assert len(commits) >= 4, f"only {len(commits)} commits ran during the traffic"
    assert len(reported) > 1000, "too little traffic to overlap the commits"
    assert overlaps == [], f"{len(overlaps)} statements ran on the loop during a commit: {overlaps[:5]}"
    # A commit on the loop would have held it SLOW seconds each time.
    assert master.summary.loop_lag_worst < SLOW / 2, master.summary.loop_lag_worst
    with MasterStore.open_readonly(master.cfg.store_location) as store:
        assert store.status()["states"].get("done", 0) == len(reported)
