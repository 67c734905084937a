"""A master started as a process (testkit/cluster.py) takes the windows a worker records of live streams, spoken
by hand as a worker would (tests/fakes/rawpeer.py): the windows kept as the items' history, each window matched
for real against the works (a synthesised station recording, tests/test_recordings.py), /metrics counting the
windows, and the operator's exports saying what was played where and when. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from crawler import protocol as p
from crawler.items import AudioItem
from crawler.master.store import MasterStore, Reference
from testkit import cluster
from tests.fakes.rawpeer import RawPeer
from tests.test_master_fingerprints_wire import SEED, _task
from tests.test_recordings import HEARD, RECORDED_AT, SPAN_TOLERANCE, _live, station  # noqa: F401 (a fixture)


def _metric(config, name: str) -> float | None:
    with urllib.request.urlopen(cluster.web_url(config) + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


async def test_a_master_process_keeps_a_workers_windows_and_says_when_each_work_played(tmp_path, station,
                                                                                       master_store):
    config = cluster.master_config(tmp_path, [SEED], ["w1"], exit_when_done=False, **master_store)
    (tmp_path / "master").mkdir()
    with MasterStore(cluster.store_of(config)) as s:       # the works, added before the master starts
        s.add_references([Reference(n, fp, f"Work {n}") for n, fp in station["works"].items()], 1.0)
    master = await cluster.start_master(config, tmp_path)
    peer = None
    try:
        peer = await RawPeer.join(cluster.master_addr(config), "w1", 8, cluster.read_secret(tmp_path / "secret"))
        peer.keep_alive(0.5)
        task = await _task(peer)
        url, other = "http://radio.test/stream", "http://tv.test/live.m3u8"
        # A station's window in the page's report; another stream on the page recorded apart (pending, then its
        # outcome): the two ways a window reaches the master.
        first = _live(url, task.url, "a" * 64, RECORDED_AT, 0, fingerprint=station["recording"],
                      played=[{"offset": 0.0, "title": "Ann - One"}, {"offset": 34.5, "title": "Bob - Two"}])
        pending = AudioItem(url=other, page=task.url, status="pending")
        peer.send(p.Report((p.Result(task.lease, task.url, p.DONE, 200, content_type="text/html", size=10,
                                     audio=(first, pending)),)))
        second = _live(other, task.url, "b" * 64, RECORDED_AT + 600, 0, title=None, fingerprint=station["other"])
        peer.send(p.DownloadReport(((other, second),)))

        async def counted() -> bool:
            return await asyncio.to_thread(_metric, config, "crawler_recordings_total") == 2.0

        async def matched() -> bool:
            return (await asyncio.to_thread(_metric, config, "crawler_matches_total") or 0) >= 4

        for check, what in ((counted, "both windows counted"), (matched, "the windows matched")):
            for _ in range(1200):
                if await check():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"timed out waiting for {what}; master log:\n{master.log()[-3000:]}")
        assert not await peer.closed_by_peer(0.2)
    finally:
        if peer is not None:
            peer.close()
        await master.stop()
    assert master.proc.returncode == 0, master.log()[-3000:]
    windows = [json.loads(x) for x in
               (await asyncio.to_thread(cluster.operator, "export", config, "--recordings")).splitlines()]
    assert [(w["url"], w["sha256"], w["recorded_at"], w["node"], w["title"], w["format"]) for w in windows] == [
        (url, "a" * 64, "2025-12-06T05:46:40Z", "w1", "Radio One", "icy"),
        (other, "b" * 64, "2025-12-06T05:56:40Z", "w1", None, "icy")]
    assert windows[0]["played"][1] == {"offset": 34.5, "title": "Bob - Two"}
    matches = [json.loads(x) for x in
               (await asyncio.to_thread(cluster.operator, "export", config, "--matches")).splitlines()]
    plays = sorted((m["window"], m["work"]) for m in matches)
    assert plays == [(windows[0]["window"], "A"), (windows[0]["window"], "B"), (windows[0]["window"], "C"),
                     (windows[1]["window"], "B")]
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        when = {(m["window"], m["work"]): m for m in store.export_matches()}
    for name, (at, _length, _offset) in HEARD.items():
        m = when[(windows[0]["window"], name)]
        assert abs(m["played_at"] - (RECORDED_AT + at)) <= SPAN_TOLERANCE, m
        assert m["live"] and m["station"] == "Radio One" and m["page"] == SEED
    assert abs(when[(windows[1]["window"], "B")]["played_at"] - (RECORDED_AT + 610)) <= SPAN_TOLERANCE
    catalogue = [json.loads(x) for x in
                 (await asyncio.to_thread(cluster.operator, "export", config)).splitlines()]
    assert sorted((r["url"], r["status"], r["extra"]["live"]) for r in catalogue) == [
        (url, "ok", True), (other, "ok", True)]
