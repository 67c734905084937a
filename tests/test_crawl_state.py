"""The master's crawl state on its own: a real store on disk, a simulated clock, no sockets."""

import itertools

import msgspec
import pytest

from crawler import protocol as p
from crawler.bloom import BloomFilter
from crawler.items import AudioItem, LinkMeta
from crawler.master.config import MasterConfig
from crawler.master.crawl import Crawl
from crawler.master.dedup import Dedup
from crawler.master.store import MasterStore
from crawler.politeness import SLACK_CAP, HostGate, PolitenessConfig
from crawler.scheduler import NodeTable
from testkit.cluster import write_secret
from tests.store_reads import url_info

SITE = "http://music.example.org"


def make(tmp_path, *, nodes=("a", "b"), min_delay=0.0, max_per_host=None, **crawl):
    raw = {"listen": "127.0.0.1:1", "data_dir": str(tmp_path), "secret_file": str(write_secret(tmp_path / "s")),
           "nodes": list(nodes), "seeds": [SITE + "/"], "crawl": crawl,
           "scheduling": {"lease_timeout": 60.0}}
    cfg = MasterConfig.from_mapping(raw, tmp_path)
    table = NodeTable(cfg.nodes)
    store = MasterStore(tmp_path / "m.db", slot_of=table.slot_of)
    dedup = Dedup(BloomFilter.for_capacity(10_000, 1e-6), (), store.known)
    gate = HostGate(PolitenessConfig(max_per_host=max_per_host, min_delay=min_delay, obey_robots=False))
    crawl_state = Crawl(cfg, store, dedup, table, gate, None)
    crawl_state.seed(cfg.seeds)
    return crawl_state


def done(task, links=(), audio=()):
    return p.Result(task.lease, task.url, p.DONE, 200, task.url, "text/html", 100, None, tuple(links), tuple(audio))


def test_links_are_normalised_deduplicated_scoped_and_counted(tmp_path):
    c = make(tmp_path, nodes=("a",), max_depth=3)
    c.node_up("a")
    (home,) = c.take("a", 10, now=0.0)
    links = [SITE + "/x", SITE + "/x#frag", "HTTP://MUSIC.example.org:80/x", SITE + "/y?utm_source=z",
             "http://elsewhere.example/", SITE + "/" + "a" * 300, "mailto:x@y", SITE + "/__==__==__.html"]
    c.complete("a", (done(home, links),), now=1.0)
    urls = sorted(t.url for t in c.take("a", 10, now=2.0))
    assert urls == [SITE + "/x", SITE + "/y"]
    assert c.discards == {"out_of_scope": 1, "too_long": 1, "scheme": 1, "generated_name": 1}


def test_stale_and_foreign_results_are_not_counted(tmp_path):
    c = make(tmp_path)
    c.node_up("a")
    c.node_up("b")
    tasks = c.take("a", 5, now=0.0) + c.take("b", 5, now=0.0)
    assert len(tasks) == 1
    t = tasks[0]
    owner = "a" if c.in_flight("a") else "b"
    other = "b" if owner == "a" else "a"
    c.complete(other, (done(t),), now=1.0)              # a node reporting a lease it does not hold
    assert c.totals.pages == 0 and c.totals.stale_results == 1
    c.complete(owner, (done(t),), now=1.0)
    c.complete(owner, (done(t),), now=1.5)              # the same result twice
    assert c.totals.pages == 1 and c.totals.stale_results == 2
    item = AudioItem(url=SITE + "/a.mp3", page=SITE + "/", title="T", artist="A")
    assert c.complete(owner, (p.Result(t.lease, t.url, p.DONE, audio=(item,)),), now=2.0) == []


def test_min_delay_holds_across_nodes_with_a_simulated_clock(tmp_path):
    c = make(tmp_path, min_delay=1.0)
    c.node_up("a")
    c.node_up("b")
    (home,) = c.take("a", 5, 0.0) or c.take("b", 5, 0.0)
    owner = "a" if c.in_flight("a") else "b"
    c.complete(owner, (done(home, [f"{SITE}/p{i}" for i in range(10)]),), now=0.1)
    starts = []
    now = 0.1
    while len(starts) < 10 and now < 30:
        for node in ("a", "b"):
            for t in c.take(node, 5, now):
                starts.append(now)
                c.complete(node, (done(t),), now)
        now = round(now + 0.25, 2)
    assert len(starts) == 10
    # Starts are booked when due, so a start made late lends the next one at most the gate's slack.
    assert all(b - a >= 1.0 - SLACK_CAP for a, b in itertools.pairwise(starts))
    assert starts[-1] - starts[0] >= 9 * 1.0 - SLACK_CAP


def test_a_node_that_drops_out_gets_its_leases_back_within_grace_or_loses_them(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(20)]),), now=0.5)
    held = c.take("a", 4, 1.0)
    assert len(held) == 4
    c.node_away("a", now=2.0, grace=5.0)
    assert c.in_flight("a") == 4 and not c.done()   # away, not gone: its leases still count
    resent = c.node_up("a")                          # back within the grace period
    assert sorted(t.lease for t in resent) == sorted(t.lease for t in held)
    c.node_away("a", now=3.0, grace=5.0)
    c.node_up("b")
    c.expire_away(now=7.9)
    assert c.in_flight("a") == 4
    c.expire_away(now=8.1)                           # grace over: the work moves to b
    assert c.in_flight("a") == 0
    got = set()
    while batch := c.take("b", 50, 9.0):
        got |= {t.url for t in batch}
    assert {t.url for t in held} <= got and len(got) == 20


def test_a_hosts_next_request_is_chained_after_one_in_flight_and_takes_its_slot_when_it_ends(tmp_path):
    c = make(tmp_path, nodes=("a",), max_per_host=1)
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(10)]),), now=0.5)
    first, second = c.take("a", 5, 1.0)          # one in flight, one chained after it; no more
    assert first.after is None and second.after == first.lease
    assert c.gate.in_flight(SITE) == 1 and c.take("a", 5, 1.0) == []
    # The first request ends: the worker starts the second at once, the slot passes to it.
    c.fetched("a", (p.PageFetch(first.lease, 200, None, 0.05),), now=1.1)
    assert c.gate.in_flight(SITE) == 1
    (third,) = c.take("a", 5, 1.1)
    assert third.after == second.lease
    c.complete("a", (done(first),), now=1.2)
    assert c.gate.in_flight(SITE) == 1
    # The second is answered 429: the slot goes back, the host pauses, the third is returned unstarted and goes
    # back in line without costing an attempt.
    c.fetched("a", (p.PageFetch(second.lease, 429, 5.0, 0.01),), now=1.3)
    assert c.gate.in_flight(SITE) == 0 and c.gate.paused_until(SITE) == pytest.approx(6.3)
    c.complete("a", (p.Result(second.lease, second.url, p.RETRY, 429),
                     p.Result(third.lease, third.url, p.RETRY, 429, error="not started")), now=1.4)
    assert c.take("a", 5, 2.0) == [] and c.wake_at["a"] == pytest.approx(6.3)
    again = c.take("a", 5, 6.3)
    assert again[0].after is None and {second.url, third.url} <= {t.url for t in c.leases.values()} | {
        h.url for h in c.held["a"]}
    assert url_info(c.store, third.url)["attempts"] == 0


def test_nothing_is_chained_where_a_delay_must_be_kept(tmp_path):
    c = make(tmp_path, nodes=("a",), max_per_host=1, min_delay=0.5)
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(10)]),), now=0.5)
    assert len(c.take("a", 5, 1.0)) == 1
    assert c.take("a", 5, 1.6) == []             # the slot is busy: waits for the release, not chained


def test_urls_held_back_by_politeness_cost_no_attempt_when_their_node_goes(tmp_path):
    c = make(tmp_path, nodes=("a", "b"), min_delay=10.0, max_attempts=1)
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(10)]),), now=0.5)
    (sent,) = c.take("a", 5, 10.0)               # one goes out; the other nine wait for the gate at the master
    assert len(c.held["a"]) == 9
    c.node_away("a", now=11.0, grace=5.0)
    held_back = [f"{SITE}/p{i}" for i in range(10) if f"{SITE}/p{i}" != sent.url]
    assert all(url_info(c.store, u)["attempts"] == 0 and url_info(c.store, u)["state"] == "queued"
               for u in held_back)
    c.node_up("b")                               # and a node that joins gets them
    assert len(c.take("b", 50, 20.0)) == 1 and len(c.held["b"]) == 8


def test_a_joining_node_gets_its_share_of_what_others_held_back(tmp_path):
    c = make(tmp_path, nodes=("a", "b"), min_delay=10.0)
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(40)]),), now=0.5)
    assert len(c.take("a", 50, 10.0)) == 1 and len(c.held["a"]) == 39
    c.node_up("b")
    assert 8 <= len(c.held["a"]) <= 31           # the double hash gives b about half of what a held
    c.take("b", 50, 10.0)
    assert len(c.held["a"]) + len(c.held["b"]) == 39


def test_expired_leases_return_to_the_frontier(tmp_path):
    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    (home,) = c.take("a", 5, now=0.0)
    assert c.expire(now=59.0) == 0
    assert c.expire(now=61.0) == 1
    (again,) = c.take("a", 5, now=62.0)
    assert again.url == home.url and again.lease != home.lease


@pytest.mark.parametrize("limit", [1, 3])
def test_max_pages_stops_handing_out_work(tmp_path, limit):
    c = make(tmp_path, nodes=("a",), max_pages=limit)
    c.node_up("a")
    (home,) = c.take("a", 5, 0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(10)]),), now=1.0)
    handed = 1 + len(c.take("a", 50, 2.0))
    assert handed == limit
    for lease in list(c.leases.values()):
        c.complete("a", (p.Result(lease.id, lease.url, p.DONE, 200),), now=3.0)
    assert c.done()


def test_a_changed_nodes_list_reroutes_what_was_queued_for_a_node_that_no_longer_exists(tmp_path):
    from crawler.master.server import Master

    def config(nodes):
        raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": nodes, "seeds": [SITE + "/"],
               "secret_file": str(write_secret(tmp_path / "s")), "politeness": {"obey_robots": False}}
        return MasterConfig.from_mapping(raw, tmp_path)

    first = Master(config(["a", "b"]))
    first._open_state()
    # At the seed's depth: the level barrier would otherwise hold them until the seed is done.
    first.store.push([(f"{SITE}/p{i}", 0, 0, "b", None) for i in range(5)])
    first.store.commit()
    first.store.close()
    second = Master(config(["a", "c"]))
    second._open_state()
    assert "b" not in second.store.status()["frontier_by_node"]
    second.crawl.node_up("c")
    got = set()
    while batch := second.crawl.take("c", 50, 1.0):
        got |= {t.url for t in batch}
    assert {f"{SITE}/p{i}" for i in range(5)} <= got
    second.store.close()


@pytest.mark.parametrize("bad", [
    {"size": 2**64},                                              # past SQLite's 64-bit integers
    {"audio": (AudioItem(url=SITE + "/a.mp3", page=SITE + "/", extra={"raw": b"\0"}),)},   # not JSON
], ids=["int-past-64-bits", "non-json-extra"])
def test_a_report_the_store_refuses_is_undone_alone_and_its_urls_go_back(tmp_path, bad):
    from crawler.master.crawl import ReportRejected

    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    (home,) = c.take("a", 5, now=0.0)
    c.complete("a", (done(home, [f"{SITE}/p{i}" for i in range(4)]),), now=1.0)
    t1, t2, t3, t4 = c.take("a", 5, now=2.0)
    c.complete("a", (done(t1),), now=3.0)                   # a good report in the same commit window
    before = c.store.status()
    good = done(t2, [SITE + "/new"])
    bad_result = p.Result(t3.lease, t3.url, p.DONE, 200, **{"size": 1, **bad})
    with pytest.raises(ReportRejected, match="went back to the frontier"):
        c.complete("a", (good, bad_result), now=4.0)
    # Nothing of the bad report stayed (not even its good result's links), the earlier report did, and the
    # report's URLs are queued again, not leased; the lease not in the report is still out.
    assert c.in_flight("a") == 1 and url_info(c.store, SITE + "/new") is None
    assert url_info(c.store, t1.url)["state"] == "done"
    assert url_info(c.store, t2.url)["state"] == "queued" and url_info(c.store, t3.url)["state"] == "queued"
    after = c.store.status()
    assert after["states"]["done"] == before["states"]["done"]
    assert after["states"]["leased"] == 1 and after["audio"] == before["audio"]
    c.store.commit()
    # The rest of the session goes on: the same URLs are leased again, and a good report of them is taken.
    again = c.take("a", 5, now=5.0)
    assert {t.url for t in again} == {t2.url, t3.url}
    c.complete("a", tuple(done(t) for t in again) + (done(t4),), now=6.0)
    c.store.commit()
    assert {k: n for k, n in c.store.status()["states"].items() if n} == {"done": 5}
    assert c.in_flight() == 0


def test_robots_sitemap_lines_enter_the_frontier_through_the_url_policy_and_sitemap_dates_are_kept(tmp_path):
    from crawler.politeness import RobotsRules

    c = make(tmp_path, nodes=("a",), max_depth=3)
    c.robots = RobotsRules(PolitenessConfig(obey_robots=True))
    c.node_up("a")
    assert c.take("a", 10, now=0.0) == []            # waits for robots.txt
    assert c.take("a", 10, now=0.5) == []
    # The fetch to start comes out once, however often the host's URLs are looked at while it runs.
    assert c.robots_to_fetch() == [SITE] and c.robots_to_fetch() == [] and c.robots_wanted == {SITE}
    robots = (f"User-agent: *\nDisallow: /private/\nSitemap: {SITE}/sitemap-index.xml\n"
              "Sitemap: http://elsewhere.example/sitemap.xml\n").encode()
    c.robots_fetched(SITE, 200, robots, now=1.0)
    assert not c.robots_wanted
    urls = sorted(t.url for t in c.take("a", 10, now=2.0))
    assert urls == [SITE + "/", SITE + "/sitemap-index.xml"]
    assert c.take_discards() == {"out_of_scope": 1} and not c.take_discards()
    task = next(t for t in c.leases.values() if t.url.endswith("sitemap-index.xml"))
    result = p.Result(task.id, task.url, p.DONE, 200, task.url, "application/xml", 100, None,
                      (SITE + "/song/1.html",), (), lastmod=((SITE + "/song/1.html", 2.0),))
    c.complete("a", (result,), now=3.0)
    assert url_info(c.store, SITE + "/song/1.html")["lastmod"] == 2.0
    assert url_info(c.store, SITE + "/song/1.html")["depth"] == 1


@pytest.mark.parametrize("refresh", [None, 3600.0])
def test_a_page_the_sitemap_says_changed_since_its_crawl_is_queued_again_when_the_crawl_refreshes(tmp_path, refresh):
    c = make(tmp_path, nodes=("a",), max_depth=3, refresh_interval=refresh)
    c.node_up("a")
    (home,) = c.take("a", 10, now=0.0)
    page = SITE + "/song/1.html"
    c.complete("a", (done(home, [SITE + "/sitemap.xml", page]),), now=1.0)
    tasks = {t.url: t for t in c.take("a", 10, now=2.0)}
    c.complete("a", (done(tasks[page]),), now=3.0)            # the page, crawled at t=3

    sitemap = tasks[SITE + "/sitemap.xml"]

    def sitemap_says(when: float, now: float) -> list[str]:
        """The sitemap's task reports the page's date; returns what is handed out next."""
        c.complete("a", (p.Result(sitemap.lease, sitemap.url, p.DONE, 200, sitemap.url, "application/xml", 1, None,
                                  (page,), (), lastmod=((page, when),)),), now=now)
        return [t.url for t in c.take("a", 10, now=now + 1)]

    def fetch_sitemap_again(now: float) -> None:
        nonlocal sitemap
        c.store.requeue_refresh([(SITE + "/sitemap.xml", 0)], c.route)
        (sitemap,) = c.take("a", 10, now=now)

    assert sitemap_says(2.5, now=4.0) == []                   # unchanged since the crawl
    assert url_info(c.store, page)["lastmod"] == 2.5
    fetch_sitemap_again(now=55.0)
    again = sitemap_says(50.0, now=60.0)                      # changed at t=50, after the crawl at t=3
    assert again == ([page] if refresh else [])
    for lease_id, lease in list(c.leases.items()):          # the page's second crawl
        c.complete("a", (done(p.Task(lease_id, lease.url, lease.depth, lease.parent)),), now=62.0)
    fetch_sitemap_again(now=65.0)
    assert sitemap_says(1e12, now=70.0) == []                 # a date in the future is ignored


def test_a_local_fault_gives_leases_back_without_an_attempt_and_routes_around_the_node(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    c.node_up("b")
    (home,) = c.take("a", 10, now=0.0) + c.take("b", 10, now=0.0)
    holder = "a" if c.in_flight("a") else "b"
    other = "b" if holder == "a" else "a"
    c.complete(holder, (done(home, [SITE + f"/p{i}" for i in range(40)]),), now=1.0)
    mine = c.take(holder, 100, now=2.0)
    assert mine
    # The holder's disk is full: it hands back everything, and no attempt is counted against the URLs.
    back = c.node_fault(holder, [t.lease for t in mine], now=3.0)
    assert back == len(mine) and c.in_flight(holder) == 0
    assert c.take(holder, 100, now=4.0) == []
    theirs = c.take(other, 100, now=4.0)
    assert {t.url for t in mine} <= {t.url for t in theirs}
    assert c.store.status()["states"]["error"] == 0
    assert all(url_info(c.store, t.url)["attempts"] == 0 for t in mine)
    # Space returns: the node takes its share again.
    for t in theirs:
        c.complete(other, (done(t),), now=5.0)
    c.node_up(holder)
    c.seed_more([SITE + f"/late{i}" for i in range(20)])
    assert c.take(holder, 100, now=6.0)


def test_failed_urls_go_back_to_the_queue_on_retry_optionally_by_reason(tmp_path):
    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    (home,) = c.take("a", 10, now=0.0)
    c.complete("a", (done(home, [SITE + f"/p{i}" for i in range(6)]),), now=1.0)
    tasks = c.take("a", 10, now=2.0)
    c.complete("a", tuple(p.Result(t.lease, t.url, p.ERROR, error="HTTP 500" if i % 2 else "timeout")
                          for i, t in enumerate(tasks)), now=3.0)
    assert len(list(c.store.failed())) == 6
    n, after = c.store.retry_errors(c.route, "HTTP 5", limit=2)
    assert n == 2 and after is not None
    n2, after = c.store.retry_errors(c.route, "HTTP 5", after, limit=2)
    assert n2 == 1
    assert c.store.retry_errors(c.route, "HTTP 5", after, limit=2) == (0, None)
    assert sorted(f["error"] for f in c.store.failed()) == ["timeout"] * 3
    again = c.take("a", 10, now=4.0)
    assert len(again) == 3 and all(url_info(c.store, t.url)["attempts"] == 0 for t in again)
    assert c.store.retry_errors(c.route)[0] == 3
    assert list(c.store.failed()) == []


def test_seeds_added_later_go_through_the_url_policy_and_dedup(tmp_path):
    c = make(tmp_path, nodes=("a",))
    r = c.seed_more([SITE + "/new", SITE + "/", "http://elsewhere.example/", "not a url", SITE + "/new#x"])
    assert r == {"added": 1, "known": 1, "invalid": 1, "discarded": {"out_of_scope": 1}}


def _drain(c, nodes, now):
    out = []
    for node in nodes:
        out += [(node, t) for t in c.take(node, 100, now)]
    return out


def test_the_level_barrier_hands_out_no_page_of_a_level_before_the_last_one_reported(tmp_path):
    """Two nodes, one slow on its level-1 page: the other waits at the barrier instead of running ahead into
    level 2, so a page linked from both levels is first seen, and kept, at its shortest depth."""
    c = make(tmp_path, max_depth=5)
    c.node_up("a")
    c.node_up("b")
    ((n0, home),) = _drain(c, ("a", "b"), 0.0)
    level1 = [f"{SITE}/l1/{i}" for i in range(12)]
    c.complete(n0, (done(home, level1),), now=1.0)
    first = _drain(c, ("a", "b"), 1.0)
    assert sorted(t.url for _, t in first) == sorted(level1) and {n for n, _ in first} == {"a", "b"}
    assert c.level == 1
    slow, rest = first[0], first[1:]
    # Every page of level 1 but one reports; its links (level 2) wait for the last one.
    for node, t in rest:
        c.complete(node, (done(t, [f"{SITE}/deep/{t.url.rsplit('/', 1)[1]}"]),), now=2.0)
    assert _drain(c, ("a", "b"), 2.0) == []
    # The slow page links a level-2 page too, and the level opens once it reported.
    c.complete(slow[0], (done(slow[1], [f"{SITE}/deep/x"]),), now=3.0)
    second = _drain(c, ("a", "b"), 3.0)
    assert len(second) == 12 and all(t.depth == 2 for _, t in second) and c.level == 2


def test_the_barrier_waits_for_a_retried_page_of_its_level(tmp_path):
    c = make(tmp_path, nodes=("a",), max_depth=5)
    c.node_up("a")
    (home,) = c.take("a", 10, 0.0)
    c.complete("a", (done(home, [SITE + "/l1/a", SITE + "/l1/b"]),), now=1.0)
    a, b = c.take("a", 10, 1.0)
    c.complete("a", (done(a, [SITE + "/l2/a"]), p.Result(b.lease, b.url, p.RETRY, error="timeout")), now=2.0)
    (again,) = c.take("a", 10, 2.0)   # the retried level-1 page, not its neighbour's level-2 link
    assert again.url == b.url and again.depth == 1
    c.complete("a", (done(again),), now=3.0)
    assert [t.url for t in c.take("a", 10, 3.0)] == [SITE + "/l2/a"]


def test_audio_references_pass_the_depth_limit_by_a_bounded_number_of_hops(tmp_path):
    from crawler.web.urls import AUDIO_REF_HOPS
    c = make(tmp_path, nodes=("a",), max_depth=0)
    c.node_up("a")
    (home,) = c.take("a", 10, 0.0)
    result = p.Result(home.lease, home.url, p.DONE, 200, links=(SITE + "/page.html",),
                      refs=(SITE + "/list.m3u", SITE + "/stream/1"))
    c.complete("a", (result,), now=1.0)
    got = c.take("a", 10, 1.0)
    assert sorted(t.url for t in got) == [SITE + "/list.m3u", SITE + "/stream/1"]
    assert all(t.depth == 1 for t in got) and c.discards["depth"] == 1
    # A chain of references ends AUDIO_REF_HOPS past the limit.
    task = got[0]
    c.complete("a", (done(got[1]),), now=1.5)
    for hop in range(2, AUDIO_REF_HOPS + 3):
        c.complete("a", (p.Result(task.lease, task.url, p.DONE, refs=(f"{SITE}/chain{hop}.m3u",)),), now=hop)
        nxt = c.take("a", 10, float(hop))
        nxt = [t for t in nxt if "chain" in t.url]
        if hop > AUDIO_REF_HOPS:
            assert nxt == []
            break
        (task,) = nxt
        assert task.depth == hop
    assert c.discards["depth"] == 2


def test_heartbeats_renew_the_leases_a_worker_names_and_only_those(tmp_path):
    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    (home,) = c.take("a", 10, 0.0)
    c.complete("a", (done(home, [SITE + "/1", SITE + "/2"]),), now=1.0)
    one, two = c.take("a", 10, 1.0)
    for t in (30.0, 60.0, 90.0):   # the lease is 60 s: renewed every 30 s, it outlives them all
        c.renew("a", (one.lease, 999), t)
        c.renew("b", (two.lease,), t)      # another node cannot renew a lease it does not hold
        c.expire(t)
    assert one.lease in c.leases and two.lease not in c.leases
    c.expire(151.0)
    assert one.lease not in c.leases


def test_a_redirect_target_keeps_the_depth_for_a_bounded_run_of_redirects(tmp_path):
    from crawler.master.crawl import MAX_REDIRECT_HOPS
    c = make(tmp_path, nodes=("a",), max_depth=20)
    c.node_up("a")
    (task,) = c.take("a", 10, 0.0)
    depths = []
    for hop in range(MAX_REDIRECT_HOPS + 2):
        c.complete("a", (p.Result(task.lease, task.url, p.DONE, 301, links=(f"{SITE}/r{hop}",)),), now=hop)
        (task,) = c.take("a", 10, float(hop))
        depths.append(task.depth)
    # The same resource under a new address, again and again: the run ends, then each hop counts.
    assert depths == [0] * MAX_REDIRECT_HOPS + [1, 1]


def test_a_page_found_later_on_a_shorter_path_is_lowered_and_fetched_again_for_its_links(tmp_path):
    c = make(tmp_path, nodes=("a",), max_depth=3)
    c.node_up("a")
    (task,) = c.take("a", 10, 0.0)
    for i, nxt in enumerate(("/a", "/b", "/c")):
        c.complete("a", (done(task, [SITE + nxt]),), now=float(i))
        (task,) = c.take("a", 10, float(i))
    assert task.url == SITE + "/c" and task.depth == 3
    c.complete("a", (done(task),), now=5.0)        # at the limit: no links extracted
    # An operator adds a page that links /c directly: /c is 1 from a seed now, and its links are wanted.
    assert c.seed_more([SITE + "/new"])["added"] == 1
    (new,) = c.take("a", 10, 6.0)
    c.complete("a", (done(new, [SITE + "/c", SITE + "/a"]),), now=7.0)
    assert url_info(c.store, SITE + "/a")["depth"] == 1     # as it was: nothing to lower, nothing fetched again
    (again,) = c.take("a", 10, 8.0)
    assert (again.url, again.depth) == (SITE + "/c", 1) and url_info(c.store, SITE + "/c")["depth"] == 1
    c.complete("a", (done(again, [SITE + "/d"]),), now=9.0)
    (d,) = c.take("a", 10, 10.0)
    assert (d.url, d.depth) == (SITE + "/d", 2)


@pytest.mark.parametrize("refresh", [None, 3600.0])
def test_what_a_page_says_about_a_link_goes_with_its_task_and_survives_a_restart(tmp_path, refresh):
    extra = {"refresh_interval": refresh} if refresh else {}
    c = make(tmp_path, nodes=("a",), **extra)
    c.node_up("a")
    (home,) = c.take("a", 10, now=0.0)
    named = LinkMeta(title="Quiet Harbour", artist="Mia", meta_source={"title": "heading", "artist": "class"})
    result = p.Result(home.lease, home.url, p.DONE, 200, home.url, "text/html", 100,
                      links=(SITE + "/stream/7", SITE + "/about"), refs=(SITE + "/p/7.m3u",),
                      link_meta=((SITE + "/stream/7", named), (SITE + "/p/7.m3u", named),
                                 (SITE + "/never-reported", named)))
    c.complete("a", (result,), now=1.0)
    c.store.commit()
    tasks = {t.url: t for t in c.take("a", 10, now=2.0)}
    assert tasks[SITE + "/stream/7"].link_meta == named and tasks[SITE + "/p/7.m3u"].link_meta == named
    assert tasks[SITE + "/about"].link_meta is None
    # The names are kept with the URL: a node that comes back is sent them again, and so is a restarted master.
    assert {t.url: t.link_meta for t in c.node_up("a")}[SITE + "/stream/7"] == named
    c.store.close()
    store = MasterStore(tmp_path / "m.db")
    try:
        store.requeue_leased(lambda urls: ["a"] * len(urls))
        again = {url: named for url, _, _, named in store.pop("a", 10, 3.0, link_meta=True)}
    finally:
        store.close()
    assert msgspec.json.decode(again[SITE + "/stream/7"], type=LinkMeta) == named
