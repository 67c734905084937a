"""A worker SIGKILLed in the middle of an audio download resumes it from its partial file after a restart."""

import hashlib
import random

import pytest

from testkit import cluster
from tests.fakes.rangeserver import RangeServer

pytestmark = pytest.mark.timeout(180)


def partial_size(tmp) -> int:
    parts = list((tmp / "worker-w1" / "audio" / "partial").glob("*.part"))
    return max((p.stat().st_size for p in parts), default=0)


async def test_worker_killed_mid_download_resumes_after_restart(tmp_path, master_store):
    audio = b"ID3\x04\0\0\0\0\0\0" + random.Random(5).randbytes(3 * 1024 * 1024)
    page = (b'<html><head><title>Big</title><meta property="og:title" content="Long Song">'
            b'<meta property="music:musician" content="Slow Band"></head>'
            b'<body><a href="/big.mp3">download</a></body></html>')
    async with RangeServer() as srv:
        srv.add("/", page, content_type="text/html")
        big = srv.add("/big.mp3", audio)
        big.pause_at = 1024 * 1024                 # the link stalls here until the worker is gone
        config = cluster.master_config(tmp_path, [srv.url("/")], ["w1"],
                                       scheduling={"heartbeat_interval": 0.5, "heartbeat_timeout": 8.0}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        worker = await cluster.start_worker(addr, "w1", tmp_path)
        await cluster.until(lambda: partial_size(tmp_path) >= 512 * 1024, 60, "the download to reach the stall")
        kept = partial_size(tmp_path)              # on disk when the worker dies (it may still grow a little)
        worker.kill()
        await worker.wait(10)
        big.pause_at = None
        srv.release()
        worker = await cluster.start_worker(addr, "w1", tmp_path)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0
        served = srv.served("/big.mp3")

    # The restarted worker was handed the work again: the download itself, pending at the master, when its page
    # had reported before the kill (a page does not wait for its downloads), else the page's lease.
    text = master.log()
    assert "node w1 joined: 1 of its pending downloads sent to it again" in text or "1 of its leases sent again" in text
    rows = cluster.catalogue(tmp_path)
    assert len(rows) == 1
    assert rows[0]["sha256"] == hashlib.sha256(audio).hexdigest()
    assert (rows[0]["title"], rows[0]["artist"]) == ("Long Song", "Slow Band")
    # Resumed, not restarted: the file crossed the wire once, plus what the server had sent beyond what was on
    # disk at the kill (in the socket's buffers or the dead worker's memory: up to the stall, 1 MiB), plus at most
    # one checkpoint interval (256 KiB) the resume may start before the end of the partial file.
    assert served <= len(audio) + (1024 * 1024 - kept) + 256 * 1024, (served, kept)
