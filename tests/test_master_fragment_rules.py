"""A worker's resolvers tell the master which URLs keep their fragment (the worker's Auth carries the rules): the
master takes the ones its crawl.keep_fragment lacks, for good, and tells the workers already connected.

A real master in this process and workers spoken by hand (tests/fakes/rawpeer.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawler import protocol as p
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from scripts.cluster import read_secret, write_secret
from tests.fakes.rawpeer import RawPeer

CONFIGURED = r"^https?://configured\.test/item/"
SONGS = r"^https?://127\.0\.0\.1:9/song/"


@contextlib.asynccontextmanager
async def running_master(tmp_path: Path) -> AsyncIterator[tuple[Master, str, bytes]]:
    secret = tmp_path / "secret"
    if not secret.exists():
        write_secret(secret)
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["a", "b", "c"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(secret), "exit_when_done": False,
           "politeness": {"obey_robots": False}, "web": {"listen": "off"},
           "crawl": {"keep_fragment": [CONFIGURED]}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait_for(listening.wait(), 30)
    try:
        yield master, f"127.0.0.1:{master.port}", read_secret(secret)
    finally:
        master.stop()
        await asyncio.wait_for(serving, 30)


async def next_of(peer: RawPeer, kind: type[p.Message], timeout: float = 10) -> p.Message:
    while not isinstance(m := await peer.recv(timeout), kind):
        pass
    return m


async def test_a_joining_workers_rules_join_the_crawl_and_reach_the_workers_already_connected(tmp_path):
    async with running_master(tmp_path) as (master, addr, secret):
        a = await RawPeer.join(addr, "a", 4, secret)
        assert a.welcome is not None and a.welcome.keep_fragment == (CONFIGURED,)
        b = await RawPeer.join(addr, "b", 4, secret, keep_fragment=(SONGS, CONFIGURED))
        assert b.welcome is not None and b.welcome.keep_fragment == (CONFIGURED, SONGS)
        told = await next_of(a, p.FragmentRules)
        assert told.keep_fragment == (CONFIGURED, SONGS)
        # The master keys those URLs with their fragment now: a song named in it is one URL per song.
        assert master.crawl.seed_more(["http://127.0.0.1:9/song/#hash=A", "http://127.0.0.1:9/song/#hash=B",
                                       "http://127.0.0.1:9/page#top"])["added"] == 3
        assert master.store.url_info("http://127.0.0.1:9/song/#hash=A") is not None
        assert master.store.url_info("http://127.0.0.1:9/page") is not None
        a.close()
        b.close()
    # Kept in the store: a restarted master keys URLs as before, and says so to the first worker.
    async with running_master(tmp_path) as (master, addr, secret):
        c = await RawPeer.join(addr, "c", 4, secret)
        assert c.welcome is not None and c.welcome.keep_fragment == (CONFIGURED, SONGS)
        c.close()


@pytest.mark.parametrize("rule", ["(", "[a-"])
async def test_a_rule_that_is_not_a_regular_expression_refuses_that_worker_with_the_reason(tmp_path, rule):
    async with running_master(tmp_path) as (_master, addr, secret):
        with pytest.raises(p.PeerRefused, match="fragment rule of this worker's resolvers: .* not a valid regular"):
            await RawPeer.join(addr, "a", 4, secret, keep_fragment=(rule,))
        ok = await RawPeer.join(addr, "b", 4, secret)      # the crawl goes on for the others
        assert ok.welcome is not None and ok.welcome.keep_fragment == (CONFIGURED,)
        ok.close()
