"""The machine of the master and of its PostgreSQL is lost mid-crawl: a synchronous standby is promoted and a new
master, with a data dir of its own (another machine), carries the crawl on from it. Real processes throughout:
two PostgreSQL servers, the master, the workers, a local site."""

import json
from collections import Counter
from pathlib import Path

import pytest

from testkit import cluster, sitegen, siteserver
from testkit.pgcluster import PgCluster

pytestmark = pytest.mark.timeout(420)



async def test_standby_promoted_after_the_primary_and_master_die_and_a_new_master_finishes_the_crawl(tmp_path):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=120)
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.1}, record_log=True)
    concurrency = 4
    with PgCluster.start() as primary:
        dsn = primary.create_database("crawl")
        standby = primary.start_standby()
        try:
            async with await siteserver.start(site_dir, behaviour=slow) as server:
                listen = f"127.0.0.1:{cluster.free_port()}"     # the address the workers know, moved with the service
                config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], listen=listen,
                                               crawl={"max_depth": manifest.max_depth + 3}, store=dsn)
                master = await cluster.start_master(config, tmp_path)
                addr = cluster.master_addr(config)
                opts = ["--concurrency", str(concurrency)]
                workers = [await cluster.start_worker(addr, n, tmp_path, extra=opts) for n in ("w1", "w2")]
                html = sum(1 for p in manifest.pages if p.endswith(".html"))
                await cluster.until(lambda: sum(e.path.endswith(".html") for e in server.log) >= html // 3, 120,
                                    "a third of the pages")
                master.kill()                   # the master's machine is gone: no commit, no goodbye
                await master.wait(10)
                primary.kill()                  # and its database server with it
                before = sum(e.path.endswith(".html") for e in server.log)
                standby.promote()
                # The new master: same service address, nothing of the old machine's data dir.
                config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], listen=listen,
                                               crawl={"max_depth": manifest.max_depth + 3},
                                               data_dir=str(tmp_path / "master2"),
                                               store=standby.dsn("crawl"))
                master = await cluster.start_master(config, tmp_path, log_name="master2.log")
                assert await master.wait(240) == 0, master.log()[-3000:]
                for w in workers:
                    assert await w.wait(60) == 0, w.log()[-2000:]
                log = list(server.log)
        finally:
            standby.remove()

    assert before < html, "the crawl finished before the failover"
    assert "Bloom filter rebuilt from the URL table" in master.log()
    gets = Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".html"))
    lost = [p for p in manifest.pages if p.endswith(".html") and gets[p] == 0]
    assert not lost, f"{len(lost)} pages lost, e.g. {lost[:5]}"
    # Fetched twice: at most what was in flight at the kill (every worker's credit), as on one machine.
    twice = sum(c - 1 for c in gets.values() if c > 1)
    assert twice <= 2 * (2 * concurrency + 2 * 8), twice   # 8 downloads each
    catalogue = Path(tmp_path / "master2" / "catalog.jsonl").read_text().splitlines()
    keys = Counter((r["url"], r["page"]) for r in map(json.loads, catalogue))
    assert len(keys) == len(manifest.audio) and max(keys.values()) == 1, "catalogue rows lost or repeated"
