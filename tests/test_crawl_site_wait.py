"""A site whose login fails waits at the master (Crawl.site_wait, protocol.SiteWait): its URLs stay out of every
node's line and out of the level barrier, the other sites go on level by level, nothing of it fails or counts an
attempt, one of its URLs goes out as a probe when the login is due again, and a result of the site lets it go on.
A real store on disk, a simulated clock, no sockets."""

import logging
from pathlib import Path

from crawler import protocol as p
from crawler.bloom import BloomFilter
from crawler.master.config import MasterConfig
from crawler.master.crawl import MAX_WAIT, Crawl, waiting_node
from crawler.master.dedup import Dedup
from crawler.master.sitestats import SiteStats
from crawler.master.store import MasterStore
from crawler.politeness import HostGate, PolitenessConfig
from crawler.scheduler import NodeTable
from testkit.cluster import write_secret
from tests.store_reads import url_info

M = "http://members.example"     # behind a login
O = "http://other.example"       # no login


def make(tmp_path: Path, *, nodes=("a",), min_delay=0.0) -> Crawl:
    raw = {"listen": "127.0.0.1:1", "data_dir": str(tmp_path), "secret_file": str(write_secret(tmp_path / "s")),
           "nodes": list(nodes), "seeds": [M + "/", O + "/"], "crawl": {"max_depth": 5},
           "scheduling": {"lease_timeout": 60.0},
           "sites": {"members.example": {"login": {"url": M + "/login", "fields": {"user": "u", "password": "x"},
                                                   "success": "Log out"}}}}
    cfg = MasterConfig.from_mapping(raw, tmp_path)
    table = NodeTable(cfg.nodes)
    store = MasterStore(tmp_path / "m.db", slot_of=table.slot_of)
    dedup = Dedup(BloomFilter.for_capacity(10_000, 1e-6), (), store.known)
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=min_delay, obey_robots=False))
    c = Crawl(cfg, store, dedup, table, gate, None)
    c.seed(cfg.seeds)
    for node in nodes:
        c.node_up(node)
    return c


def done(task, links=()):
    return p.Result(task.lease, task.url, p.DONE, 200, task.url, "text/html", 100, None, tuple(links))


def _level(c: Crawl, tasks, now, width=3):
    """Each task reports width links one level deeper, on its own site, and one to the other site."""
    for t in tasks:
        site = M if t.url.startswith(M) else O
        name = t.url.rsplit("/", 1)[1] or "home"
        links = [f"{site}/d{t.depth + 1}/{name}-{i}" for i in range(width)] + [f"{M}/from-o/{name}-{t.depth}"]
        c.complete("a", (done(t, links),), now)


def _waits(caplog):
    return [r for r in caplog.records if "waits for its login" in r.getMessage()]


def test_a_site_whose_login_fails_holds_no_level_up_and_goes_on_when_its_login_works(tmp_path, caplog):
    caplog.set_level(logging.INFO, "crawler.master")
    c = make(tmp_path)
    home = {t.url: t for t in c.take("a", 10, 0.0)}
    assert set(home) == {M + "/", O + "/"}
    # The worker cannot log into the members site: its task comes back, the site waits 4 s for the next attempt.
    assert c.site_wait("a", [home[M + "/"].lease], "the answer lacks the success text", 4.0, now=0.5) == 1
    assert set(c.waiting) == {"members.example"} and c.in_flight("a") == 1    # the other site's home
    _level(c, [home[O + "/"]], 1.0)
    # The other site goes on, level by level, though the members site's home (level 0) still waits.
    now = 1.0
    seen = []
    for depth in (1, 2):
        tasks = c.take("a", 100, now)
        assert tasks and all(t.url.startswith(O) and t.depth == depth for t in tasks), [t.url for t in tasks]
        assert c.level == depth
        seen += tasks
        _level(c, tasks, now + 0.1)
        now += 0.2
        assert now < 4.5   # no probe yet
    # Its URLs, the links other pages found to it included, wait aside, not in any node's line.
    waiting = c.store.frontier_size(waiting_node("members.example"))
    assert waiting == 1 + 1 + 3 + 9, waiting
    assert c.store.frontier_size("a") == 27       # the other site's level 3
    # The attempt is due: one URL of the site at or above the level goes out as the probe (the home page).
    assert c.next_wake(now) == 4.5
    probe = [t for t in c.take("a", 100, 4.5) if t.url.startswith(M)]
    assert [t.url for t in probe] == [M + "/"]
    # It fails again (the worker backs off to 8 s): said once only, the probe back aside.
    c.site_wait("a", [probe[0].lease], "the answer lacks the success text", 8.0, now=4.6)
    assert len(_waits(caplog)) == 1
    assert not [t for t in c.take("a", 100, 10.0) if t.url.startswith(M)]
    probe = [t for t in c.take("a", 100, 12.6) if t.url.startswith(M)]
    assert [t.url for t in probe] == [M + "/"]
    # The login works: its result lets the site go on, said once, and its waiting URLs come at once, though
    # the level is past them (entries below the level are served first).
    c.complete("a", (done(probe[0], [f"{M}/d1/home-{i}" for i in range(3)]),), now=13.0)
    assert not c.waiting and c.store.frontier_size(waiting_node("members.example")) == 0
    goes_on = [r for r in caplog.records if "login works again" in r.getMessage()]
    assert len(goes_on) == 1 and "13 waiting URLs go on" in goes_on[0].getMessage(), goes_on[0].getMessage()
    back = c.take("a", 100, 13.0)
    assert {t.url for t in back if t.depth == 1} >= {f"{M}/d1/home-{i}" for i in range(3)}
    assert all(t.url.startswith(M) for t in back if t.depth < c.level)
    # Nothing of it failed, nor counted an attempt.
    assert c.store.status()["states"]["error"] == 0
    assert url_info(c.store, M + "/")["attempts"] == 0
    assert len(_waits(caplog)) == 1


def test_a_waiting_sites_entries_held_by_politeness_go_aside_and_other_sites_are_untouched(tmp_path):
    c = make(tmp_path, min_delay=10.0)
    home = {t.url: t for t in c.take("a", 10, 0.0)}
    c.complete("a", (done(home[M + "/"], [f"{M}/p{i}" for i in range(5)]),
                     done(home[O + "/"], [f"{O}/p{i}" for i in range(5)])), now=1.0)
    first = c.take("a", 100, 11.0)     # one of each site; the rest held back by the 10 s delay
    assert sorted(t.url.rsplit("/", 1)[0] for t in first) == sorted([M, O])
    assert len(c.held["a"]) == 8
    m = next(t for t in first if t.url.startswith(M))
    c.site_wait("a", [m.lease], "HTTP 500", 30.0, now=12.0)
    assert len(c.held["a"]) == 4 and all(h.url.startswith(O) for h in c.held["a"])
    assert c.store.frontier_size(waiting_node("members.example")) == 5
    # A hand-back is neither an attempt nor a failure, and the node is not faulted: it keeps taking work.
    assert url_info(c.store, m.url)["attempts"] == 0 and "a" in c.table.live
    assert not [t for t in c.take("a", 100, 25.0) if t.url.startswith(M)]


def test_a_workers_word_on_the_next_attempt_is_bounded_and_unknown_leases_are_ignored(tmp_path):
    c = make(tmp_path)
    home = {t.url: t for t in c.take("a", 10, 0.0)}
    assert c.site_wait("a", [10**9], "x", 5.0, now=0.0) == 0 and not c.waiting
    c.site_wait("a", [home[M + "/"].lease], "down", 1e9, now=0.0)
    assert c.next_wake(0.0) == MAX_WAIT


def test_a_disk_fault_is_still_the_nodes_own_not_a_sites_wait(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    tasks = c.take("a", 10, 0.0) + c.take("b", 10, 0.0)
    for node in ("a", "b"):
        mine = [t for t in tasks if t.lease in c.leases_by_node.get(node, set())]
        if mine:
            c.node_fault(node, [t.lease for t in mine], now=1.0)
            assert node not in c.table.live and not c.waiting
            return


def test_the_status_shows_a_waiting_site():
    from crawler.sites import parse_sites

    table = parse_sites("sites", {"members.example": {"login": {"url": M + "/login", "fields": {"u": "1"},
                                                               "success": "ok"}},
                                  "other.example": {"max_depth": 2}}, Path("."))
    view = SiteStats(table).view(None, None, {"members.example": {"reason": "HTTP 500", "waiting_s": 3.0,
                                                                  "next_try_s": 1.0}})
    assert view["members.example"]["login_waiting"]["reason"] == "HTTP 500"
    assert view["other.example"]["login_waiting"] is None



def test_the_worker_hands_a_sites_tasks_back_in_one_site_wait_a_site():
    from crawler.worker.server import SiteBack, _site_wait_frames

    backs = [SiteBack(1, "members.example", "HTTP 503", 4.0), SiteBack(2, "other.example", "no text", 8.0),
             SiteBack(3, "members.example", "HTTP 503", 2.0)]
    d = p.FrameDecoder()
    d.feed(_site_wait_frames(backs, p.DEFAULT_MAX_FRAME))
    assert d.messages() == [p.SiteWait("members.example", "HTTP 503", 2.0, (1, 3)),
                            p.SiteWait("other.example", "no text", 8.0, (2,))]
    assert _site_wait_frames([], p.DEFAULT_MAX_FRAME) == b""


def test_a_waiting_site_left_with_only_deeper_urls_is_probed_once_nothing_else_is_left(tmp_path):
    from crawler.master.store_core import PageOutcome
    from crawler.master.store_frontier import ROBOTS_BLOCKED

    c = make(tmp_path)
    home = {t.url: t for t in c.take("a", 10, 0.0)}
    c.site_wait("a", [home[M + "/"].lease], "HTTP 503", 1.0, now=0.5)
    c.complete("a", (done(home[O + "/"], [M + "/d1/x"]),), now=1.0)     # found while the site waits: aside
    # The site's only URL of the level leaves the line without a result of the site (robots.txt refused it
    # when it went out): what is left of the site is deeper than the level, which nothing else can raise.
    (row,) = c.store.pop(waiting_node("members.example"), 1, 1.2, max_depth=0)
    c.store.finish([PageOutcome(row[0], ROBOTS_BLOCKED, None, None, None, None, "robots.txt", "a", 1.2)])
    assert c.take("a", 10, 1.3) == [] and c.level == 0
    # The attempt is due: the crawl has nothing else to do, so the deeper URL goes out as the probe.
    assert [t.url for t in c.take("a", 10, 1.6)] == [M + "/d1/x"]
