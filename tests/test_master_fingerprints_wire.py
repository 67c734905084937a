"""A real master in this process takes fingerprints from a worker spoken by hand (tests/fakes/rawpeer.py): on
items in page reports (pending ones too, which it keeps as JSON), on download outcomes and on their repeats (a
fingerprint made after its outcome went), and the fingerprint backlog of the heartbeats, shown per node; a
fingerprint past the limit closes the connection, as any over-limit field."""

from __future__ import annotations

import asyncio

import msgpack

from crawler import protocol as p
from crawler.identify import MAX_FINGERPRINT_BYTES
from crawler.items import AudioItem
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from crawler.master.store import MasterStore
from testkit.cluster import read_secret, write_secret
from tests.fakes.rawpeer import RawPeer

SEED = "http://127.0.0.1:9/p0"


async def _master(tmp_path):
    secret = write_secret(tmp_path / "secret")
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"], "seeds": [SEED],
           "secret_file": str(secret), "exit_when_done": False, "politeness": {"obey_robots": False},
           "web": {"listen": "off"}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait_for(listening.wait(), 30)
    peer = await RawPeer.join(f"127.0.0.1:{master.port}", "w1", 8, read_secret(secret))
    return master, serving, peer


async def _task(peer: RawPeer) -> p.Task:
    peer.send(p.Credit(8))
    while True:
        m = await peer.recv()
        if isinstance(m, p.Assign) and m.tasks:
            return m.tasks[0]


async def test_the_master_takes_fingerprints_and_the_backlog(tmp_path, until):
    master, serving, peer = await _master(tmp_path)
    try:
        peer.keep_alive(0.5)
        task = await _task(peer)
        ok = AudioItem(url="http://cdn/ok.mp3", page=task.url, sha256="aa" * 32, size=3, path="audio/ok.mp3",
                       fingerprint=b"\x00fp-ok\xff")
        # A pending item with a fingerprint: a worker of ours never sends one, a peer may.
        pending = AudioItem(url="http://cdn/later.mp3", page=task.url, status="pending", fingerprint=b"\x01\x02")
        peer.send(p.Report((p.Result(task.lease, task.url, p.DONE, 200, content_type="text/html", size=10,
                                     audio=(ok, pending)),)))
        done = pending.replace(status="ok", sha256="bb" * 32, size=4, path="audio/later.mp3", fingerprint=b"fp")
        peer.send(p.DownloadReport((("http://cdn/later.mp3", done),)))
        # Its fingerprint made late: the same outcome again, which the master takes as a repeat.
        peer.send(p.DownloadReport((("http://cdn/later.mp3", done.replace(fingerprint=b"fp2")),)))
        peer.send(p.Heartbeat(1.0, (), 5))
        await until(lambda: any(n["fingerprint_backlog"] == 5 for n in master.observer.status()["nodes"]), 10,
                    "the heartbeat's backlog in the status")
        await until(lambda: master.statistics().run_pages >= 1, 10, "the page recorded")
        assert not await peer.closed_by_peer(0.3)
    finally:
        peer.close()
        master.stop()
        await asyncio.wait_for(serving, 30)
    with MasterStore.open_readonly(master.cfg.store_location) as store:
        assert store.status()["audio"].get("ok", 0) == 2, store.status()["audio"]
        kept = dict(store.db.execute("SELECT url, fingerprint FROM fingerprints").fetchall())
    # The repeat's fingerprint replaced the first: the late one is the file's and is what gets matched.
    assert {u: bytes(f) for u, f in kept.items()} == {"http://cdn/ok.mp3": b"\x00fp-ok\xff",
                                                      "http://cdn/later.mp3": b"fp2"}


async def test_a_fingerprint_past_the_limit_closes_the_connection(tmp_path):
    master, serving, peer = await _master(tmp_path)
    try:
        task = await _task(peer)
        item = {"url": "http://cdn/x.mp3", "page": task.url, "status": "ok",
                "fingerprint": b"\x01" * (MAX_FINGERPRINT_BYTES + 1)}
        payload = msgpack.packb([24, [["http://cdn/x.mp3", item]]], use_bin_type=True)
        peer.send_frames(len(payload).to_bytes(4, "big") + payload)
        assert await peer.closed_by_peer(10)
    finally:
        peer.close()
        master.stop()
        await asyncio.wait_for(serving, 30)
