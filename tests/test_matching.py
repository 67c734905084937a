"""The master's matcher (crawler/master/matching.py) with a fake index (tests/fakes/identify.py): new fingerprints
matched, works added later matched against what was stored before (retroactive), recordings grouped, removed works
forgotten, batches bounded."""

from __future__ import annotations

import asyncio

from crawler.master.matching import Matcher
from crawler.master.store import MasterStore, Reference
from tests.fakes.identify import FakeIndex, StrictIndex, fingerprint_of


def run(coro):
    return asyncio.run(coro)


async def drain(m: Matcher, now: float) -> list[dict]:
    rows = []
    while True:
        n, fresh = await m.step(now)
        rows += fresh
        if not n:
            return rows


def test_new_and_retroactive_matches_and_recordings(tmp_path):
    store = MasterStore(tmp_path / "m.db")
    store.add_references([Reference("w1", fingerprint_of("a", "b", "c", "d"), "One")], 1.0)
    store.add_fingerprints([
        ("http://x/copy1.mp3", fingerprint_of("n", "b", "c", "d")),        # w1 from 1 s in
        ("http://y/copy2.mp3", fingerprint_of("q", "n", "b", "c", "d")),   # the same recording, elsewhere
        ("http://z/other.mp3", fingerprint_of("e", "f", "g", "h")),        # a work added later
        ("http://z/noise.mp3", fingerprint_of("z", "z2", "z3")),           # nothing
    ], 2.0)
    m = Matcher(store, FakeIndex, batch=2)

    async def go() -> None:
        await m.load()
        first = await drain(m, 3.0)
        assert {(r["url"], r["work"], r["offset"]) for r in first} == {
            ("http://x/copy1.mp3", "w1", 1.0), ("http://y/copy2.mp3", "w1", 1.0)}
        assert m.matched == 4
        # A work added while running: every stored fingerprint is matched against it, once.
        store.add_references([Reference("w2", fingerprint_of("e", "f", "g"))], 4.0)
        later = await drain(m, 5.0)
        assert [(r["url"], r["work"], r["matched_at"]) for r in later] == [("http://z/other.mp3", "w2", 5.0)]
        assert await drain(m, 6.0) == []
        # Removed: no longer in the index, its matches gone.
        store.remove_reference("w2")
        store.add_fingerprints([("http://z/other2.mp3", fingerprint_of("e", "f", "g"))], 7.0)
        assert await drain(m, 8.0) == []

    run(go())
    m.close()
    store.commit()
    rows = {r["url"]: r for r in store.identify.export_matches()}
    assert set(rows) == {"http://x/copy1.mp3", "http://y/copy2.mp3"}
    assert rows["http://x/copy1.mp3"]["recording"] == rows["http://y/copy2.mp3"]["recording"]
    recs = {u: r for u, r, _ in store.recordings()}
    assert "http://z/other.mp3" in recs and "http://z/noise.mp3" in recs
    # copy1 and copy2 are one recording, other and other2 another, noise its own.
    assert len(set(recs.values())) == 3 and "http://z/other2.mp3" not in recs
    store.close()


def test_a_restart_builds_the_indexes_from_the_store(tmp_path):
    store = MasterStore(tmp_path / "m.db")
    store.add_references([Reference("w1", fingerprint_of("a", "b", "c"))], 1.0)
    store.add_fingerprints([("http://x/1.mp3", fingerprint_of("a", "b", "c"))], 1.0)
    m = Matcher(store, FakeIndex)

    async def first() -> None:
        await m.load()
        await drain(m, 2.0)

    run(first())
    m.close()
    store.commit()
    m2 = Matcher(store, FakeIndex)
    store.add_fingerprints([("http://y/2.mp3", fingerprint_of("k", "a", "b", "c"))], 3.0)

    async def second() -> list[dict]:
        await m2.load()
        assert len(m2.works) == 1 and len(m2.recordings) == 1
        return await drain(m2, 4.0)

    rows = run(second())
    m2.close()
    assert [(r["url"], r["work"]) for r in rows] == [("http://y/2.mp3", "w1")]
    recs = dict((u, r) for u, r, _ in store.recordings())
    assert list(recs) == ["http://x/1.mp3"]      # the new copy joined the recording of the first
    store.close()


def test_refused_fingerprint_is_not_retried_for_ever(tmp_path):
    class Refusing(FakeIndex):
        def match(self, fingerprint: bytes):
            from crawler.identify import IdentifyError
            raise IdentifyError("unreadable")

    store = MasterStore(tmp_path / "m.db")
    store.add_references([Reference("w1", fingerprint_of("a", "b", "c"))], 1.0)
    store.add_fingerprints([("http://x/1.mp3", b"garbage")], 1.0)
    m = Matcher(store, Refusing)

    async def go() -> None:
        await m.load()
        assert await drain(m, 2.0) == []
        assert (await m.step(3.0))[0] == 0

    run(go())
    m.close()
    store.close()


def test_fingerprints_reported_with_items_and_with_downloads_are_kept(tmp_path):
    from crawler import protocol as p
    from crawler.items import OK, PENDING
    from tests.test_pending_downloads import SONG, _item, _lease_song
    from tests.test_crawl_state import make

    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    task = _lease_song(c, "a")
    stored = _item(1).replace(status=OK, sha256="ab" * 32, fingerprint=fingerprint_of("a", "b", "c"))
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=(stored, _item(2))),), 2.0)
    assert [(u, fp) for u, fp, *_ in c.store.to_match(0, 10)] == [(stored.url, b"a b c")]
    done = _item(2).replace(status=OK, sha256="cd" * 32, fingerprint=fingerprint_of("d", "e", "f"))
    assert _item(2).status == PENDING
    c.settle("a", ((done.url, done),), 3.0)
    assert sorted(u for u, *_ in c.store.to_match(0, 10)) == sorted([stored.url, done.url])
    # The catalogue rows never carry the fingerprint.
    assert all("fingerprint" not in r and "fingerprint" not in r["extra"] for r in c.store.catalogue())


async def test_the_running_master_matches_what_is_due_and_a_work_added_while_it_runs(tmp_path, until):
    from crawler.master.config import MasterConfig
    from crawler.master.server import Master
    from testkit.cluster import write_secret

    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(write_secret(tmp_path / "s")),
           "exit_when_done": False, "politeness": {"obey_robots": False}, "web": {"listen": "off"},
           "dedup": {"expected_urls": 1000}}
    (tmp_path / "m").mkdir()
    with MasterStore(tmp_path / "m" / "master.db") as s:
        s.add_audio([{"url": "http://x/1.mp3", "page": "http://x/", "node": "w1", "found_at": 1.0},
                     {"url": "http://x/2.mp3", "page": "http://x/", "node": "w1", "found_at": 1.0}])
        s.add_references([Reference("w1", fingerprint_of("a", "b", "c"))], 1.0)
        s.add_fingerprints([("http://x/1.mp3", fingerprint_of("z", "a", "b", "c")),
                            ("http://x/2.mp3", fingerprint_of("d", "e", "f", "g"))], 1.0)
    master = Master(MasterConfig.from_mapping(raw, tmp_path), new_index=FakeIndex)
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait({serving, asyncio.create_task(listening.wait())}, return_when=asyncio.FIRST_COMPLETED)
    try:
        await until(lambda: master.store.match_count() == 1, 20, "the match of a fingerprint stored before start")
        async def add() -> None:   # between the master's commits, as its own tasks write
            master.store.add_references([Reference("w2", fingerprint_of("e", "f", "g"))], 2.0)

        await master.store_gate.guard(add())
        await until(lambda: master.store.match_count() == 2, 20, "the retroactive match of a work added later")
    finally:
        master.stop()
        await serving
    with MasterStore.open_readonly(tmp_path / "m" / "master.db") as s:
        assert sorted((m["url"], m["work"]) for m in s.export_matches()) == [("http://x/1.mp3", "w1"),
                                                                            ("http://x/2.mp3", "w2")]


def test_a_pending_item_with_a_fingerprint_is_kept_pending_without_it(tmp_path):
    from crawler import protocol as p
    from tests.test_pending_downloads import SONG, _item, _lease_song
    from tests.test_crawl_state import make

    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    task = _lease_song(c, "a")
    odd = _item(1).replace(fingerprint=b"\xff\x00")     # a peer's oddity: not JSON, not refused for it
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=(odd,)),), 2.0)
    assert c.store.pending_count() == 1


def test_a_recordings_index_that_refuses_takes_no_work_match_away(tmp_path):
    class WorksOnly(FakeIndex):
        made = 0

        def __init__(self) -> None:
            super().__init__()
            WorksOnly.made += 1
            self.refuses = WorksOnly.made == 2      # the matcher makes the works index first, then the recordings'

        def add(self, work: str, fingerprint: bytes) -> None:
            if self.refuses:
                from crawler.identify import IdentifyError
                raise IdentifyError("not built")
            super().add(work, fingerprint)

    store = MasterStore(tmp_path / "m.db")
    store.add_references([Reference("w1", fingerprint_of("a", "b", "c"))], 1.0)
    store.add_fingerprints([("http://x/1.mp3", fingerprint_of("a", "b", "c"))], 1.0)
    m = Matcher(store, WorksOnly)

    async def go() -> list[dict]:
        await m.load()
        return await drain(m, 2.0)

    assert [r["work"] for r in run(go())] == ["w1"]
    m.close()
    store.close()


def test_works_added_again_replace_their_fingerprint_in_the_index(tmp_path):
    store = MasterStore(tmp_path / "m.db")
    store.add_references([Reference("w1", fingerprint_of("a", "b", "c")), Reference("w2", fingerprint_of("d", "e", "f"))],
                         1.0)
    m = Matcher(store, StrictIndex)

    async def go() -> None:
        await m.load()
        store.add_references([Reference("w1", fingerprint_of("x", "y", "z"))], 2.0)
        store.remove_reference("w2")
        await m.step(3.0)
        assert m.works.works == {"w1": ["x", "y", "z"]}

    run(go())
    m.close()
    store.close()
