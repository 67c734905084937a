"""A worker's resolvers tell the master which URLs keep their fragment (the worker's Auth carries the rules): the
master takes the ones its crawl.keep_fragment lacks and the operator approved (crawl.approved_fragment_rules), for
good, and tells the workers already connected. Any other rule is ignored: never compiled, stored or passed on.

A real master in this process and workers spoken by hand (tests/fakes/rawpeer.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawler import protocol as p
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from testkit.cluster import read_secret, write_secret
from tests.fakes.rawpeer import RawPeer
from tests.store_reads import url_info

CONFIGURED = r"^https?://configured\.test/item/"
SONGS = r"^https?://127\.0\.0\.1:9/song/"
HOSTILE = r"/x/(a|a)+$"       # backtracks: 2^n steps on a URL of n 'a's that does not match


@contextlib.asynccontextmanager
async def running_master(tmp_path: Path) -> AsyncIterator[tuple[Master, str, bytes]]:
    secret = tmp_path / "secret"
    if not secret.exists():
        write_secret(secret)
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["a", "b", "c"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(secret), "exit_when_done": False,
           "politeness": {"obey_robots": False}, "web": {"listen": "off"},
           "crawl": {"keep_fragment": [CONFIGURED], "approved_fragment_rules": [SONGS]}}
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
        assert url_info(master.store, "http://127.0.0.1:9/song/#hash=A") is not None
        assert url_info(master.store, "http://127.0.0.1:9/page") is not None
        a.close()
        b.close()
    # Kept in the store: a restarted master keys URLs as before, and says so to the first worker.
    async with running_master(tmp_path) as (master, addr, secret):
        c = await RawPeer.join(addr, "c", 4, secret)
        assert c.welcome is not None and c.welcome.keep_fragment == (CONFIGURED, SONGS)
        c.close()


@pytest.mark.parametrize("rule", ["(", "[a-", HOSTILE])
async def test_a_rule_the_operator_did_not_approve_is_ignored_and_the_worker_joins(tmp_path, rule, caplog):
    async with running_master(tmp_path) as (master, addr, secret):
        a = await RawPeer.join(addr, "a", 4, secret)
        b = await RawPeer.join(addr, "b", 4, secret, keep_fragment=(rule, SONGS))
        assert b.welcome is not None and b.welcome.keep_fragment == (CONFIGURED, SONGS)
        told = await next_of(a, p.FragmentRules)           # the approved one reaches the others, the other not
        assert told.keep_fragment == (CONFIGURED, SONGS)
        assert master.crawl.norm.keep_fragment == (CONFIGURED, SONGS)
        assert master.store.get_meta("fragment_rules") == [SONGS]
        b.close()
        c = await RawPeer.join(addr, "b", 4, secret, keep_fragment=(rule,))    # the same again: no new line
        assert c.welcome is not None and c.welcome.keep_fragment == (CONFIGURED, SONGS)
        # The rule never runs on the master: a long link of 'a's is keyed at once, its fragment dropped.
        t0 = time.monotonic()
        assert master.crawl.seed_more(["http://127.0.0.1:9/x/" + "a" * 40 + "!#frag"])["added"] == 1
        assert time.monotonic() - t0 < 1
        assert url_info(master.store, "http://127.0.0.1:9/x/" + "a" * 40 + "!") is not None
        a.close()
        c.close()
    ignored = [r for r in caplog.records if "not in crawl.approved_fragment_rules" in r.getMessage()]
    assert len(ignored) == 1 and repr(rule) in ignored[0].getMessage()


async def test_a_rule_an_earlier_run_stored_is_dropped_unless_approved(tmp_path):
    async with running_master(tmp_path) as (master, addr, secret):
        # What a master before approval existed kept from a worker, beside an approved one.
        master.store.set_meta("fragment_rules", [HOSTILE, SONGS])
    async with running_master(tmp_path) as (master, addr, secret):
        assert master.crawl.norm.keep_fragment == (CONFIGURED, SONGS)
        a = await RawPeer.join(addr, "a", 4, secret)
        assert a.welcome is not None and a.welcome.keep_fragment == (CONFIGURED, SONGS)
        a.close()
