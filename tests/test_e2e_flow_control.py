"""A scripted worker speaks the protocol by hand to a real master process: credit bounds what it is sent."""

import pytest

from crawler import protocol as p
from testkit import cluster
from tests.fakes.rawpeer import RawPeer

pytestmark = pytest.mark.timeout(120)


async def test_master_never_exceeds_the_credit_and_refuses_credit_beyond_capacity(tmp_path):
    seeds = [f"http://127.0.0.1:9/page/{i}" for i in range(20)]      # never fetched: we answer ourselves
    config = cluster.master_config(tmp_path, seeds, ["w1"], exit_when_done=False,
                                   scheduling={"heartbeat_interval": 5.0, "heartbeat_timeout": 30.0})
    master = await cluster.start_master(config, tmp_path)
    try:
        secret = cluster.read_secret(tmp_path / "secret")
        w = await RawPeer.join(cluster.master_addr(config), "w1", capacity=5, secret=secret)
        w.send(p.Credit(3))
        first = await w.tasks(quiet=1.0)
        assert len(first) == 3, first
        # Two results back, two more credits: exactly two more tasks, never more.
        w.send(p.Report(tuple(p.Result(t.lease, t.url, p.DONE, 200) for t in first[:2])), p.Credit(2))
        second = await w.tasks(quiet=1.0)
        assert len(second) == 2 and not {t.url for t in second} & {t.url for t in first}
        # In flight now: 1 + 2 = 3 of a capacity of 5; a credit of 3 more would exceed it.
        w.send(p.Credit(3))
        with pytest.raises(ConnectionError):
            while True:
                await w.recv()
        # The master carries on: the same node may come back, and gets its unfinished tasks again.
        w2 = await RawPeer.join(cluster.master_addr(config), "w1", capacity=5, secret=secret)
        w2.send(p.Credit(5))
        again = await w2.tasks(quiet=1.0)
        assert {t.url for t in first[2:] + second} <= {t.url for t in again}
        assert len(again) == 5
    finally:
        await master.stop()
    assert "credit beyond the announced capacity" in master.log()
