"""The master's download board on its own: one download per address, per-host limits over all workers."""

from crawler import protocol as p
from crawler.master.downloads import DownloadBoard
from crawler.politeness import HostGate, PolitenessConfig

CDN = "http://cdn.example.org"


def board(max_per_host=2, min_delay=0.0):
    return DownloadBoard(HostGate(PolitenessConfig(max_per_host=max_per_host, min_delay=min_delay,
                                                   obey_robots=False)))


def test_an_address_is_downloaded_once_and_the_others_get_its_place():
    b = board()
    assert b.ask("a", ((1, CDN + "/x.mp3"),), 0.0) == [("a", p.Grant(1, p.GRANT_GO))]
    # Asked by two more nodes while a downloads it: they wait for it, and fetch nothing.
    assert b.ask("b", ((7, CDN + "/x.mp3"),), 0.1) == []
    assert b.ask("c", ((9, CDN + "/x.mp3"),), 0.2) == []
    got = b.done("a", (p.DownloadEnd(1, "ab" * 32, 10, "audio/x.mp3"),), 1.0)
    copy = ("a", "ab" * 32, 10, "audio/x.mp3")
    assert sorted(got) == [("b", p.Grant(7, p.GRANT_COPY, *copy)), ("c", p.Grant(9, p.GRANT_COPY, *copy))]
    assert b.ask("b", ((8, CDN + "/x.mp3"),), 2.0) == [("b", p.Grant(8, p.GRANT_COPY, *copy))]
    assert b.copies == 3
    # The node that holds it checks its own file again (a revisit sees a change): no copy for it.
    assert b.ask("a", ((2, CDN + "/x.mp3"),), 3.0) == [("a", p.Grant(2, p.GRANT_GO))]


def test_a_refreshing_crawl_is_offered_no_copy_older_than_its_refresh_interval():
    b = DownloadBoard(HostGate(PolitenessConfig(max_per_host=None, obey_robots=False)), max_age=10.0)
    b.ask("a", ((1, CDN + "/x.mp3"),), 0.0)
    b.done("a", (p.DownloadEnd(1, "ab" * 32, 10, "x"),), 1.0)
    assert b.ask("b", ((1, CDN + "/x.mp3"),), 5.0)[0][1].verdict == p.GRANT_COPY
    assert b.ask("b", ((2, CDN + "/x.mp3"),), 12.0) == [("b", p.Grant(2, p.GRANT_GO))]


def test_a_failed_download_passes_the_address_to_the_next_asker():
    b = board()
    b.ask("a", ((1, CDN + "/x.mp3"),), 0.0)
    b.ask("b", ((2, CDN + "/x.mp3"),), 0.0)
    assert b.done("a", (p.DownloadEnd(1),), 1.0) == [("b", p.Grant(2, p.GRANT_GO))]


def test_per_host_limit_and_spacing_hold_over_all_nodes():
    b = board(max_per_host=2, min_delay=1.0)
    out = b.ask("a", tuple((i, f"{CDN}/{i}.mp3") for i in range(3)), 0.0)
    out += b.ask("b", tuple((i, f"{CDN}/b{i}.mp3") for i in range(3)), 0.0)
    assert out == [("a", p.Grant(0, p.GRANT_GO))]          # the spacing: one start a second
    assert b.next_wake(0.0) == 1.0 and b.pump(0.5) == []
    assert b.pump(1.0) == [("a", p.Grant(1, p.GRANT_GO))]
    assert b.pump(2.0) == []                                   # two in flight: the limit, whatever the time
    assert b.next_wake(2.0) == float("inf")
    assert b.done("a", (p.DownloadEnd(0, "cd" * 32, 1, "x"),), 2.5) == [("a", p.Grant(2, p.GRANT_GO))]
    assert b.waiting() == 3
    # A node that leaves frees its slots; its waiting asks are dropped, the others' go out in order.
    assert b.node_gone("a", 4.0) == [("b", p.Grant(0, p.GRANT_GO))]
    assert b.pump(5.0) == [("b", p.Grant(1, p.GRANT_GO))] and b.waiting() == 1


def test_other_hosts_do_not_wait_behind_a_busy_one():
    b = board(max_per_host=1)
    b.ask("a", ((1, CDN + "/1.mp3"), (2, CDN + "/2.mp3")), 0.0)
    assert b.ask("a", ((3, "http://other.example/3.mp3"),), 0.0) == [("a", p.Grant(3, p.GRANT_GO))]


def test_remembered_addresses_are_bounded():
    b = DownloadBoard(HostGate(PolitenessConfig(max_per_host=None, obey_robots=False)), remembered=10)
    for i in range(50):
        b.ask("a", ((i, f"{CDN}/{i}.mp3"),), float(i))
        b.done("a", (p.DownloadEnd(i, "ab" * 32, 1, "x"),), float(i))
    assert len(b._done) == 10


def test_a_faulted_nodes_asks_wait_aside_and_are_asked_again_when_it_can_store():
    b = board(max_per_host=1)
    assert b.ask("a", ((1, CDN + "/1.mp3"),), 0.0) == [("a", p.Grant(1, p.GRANT_GO))]
    b.ask("a", ((2, CDN + "/2.mp3"),), 0.0)
    b.ask("b", ((5, CDN + "/5.mp3"),), 0.0)
    b.ask("a", ((3, CDN + "/5.mp3"),), 0.0)     # b's address: both wait in the host's line
    # a's disk fills: its asks leave the lines, and the first end goes to b, not to a held ask.
    assert b.node_fault("a", 1.0) == []
    assert b.waiting() == 3
    assert b.done("a", (p.DownloadEnd(1),), 1.5) == [("b", p.Grant(5, p.GRANT_GO))]
    # New asks of a faulted node get nothing either, even for an idle host.
    assert b.ask("a", ((4, "http://other.example/4.mp3"),), 2.0) == []
    b.done("b", (p.DownloadEnd(5, "ab" * 32, 3, "audio/5.mp3"),), 3.0)
    # It can store again: its asks go in order, a copy for the address b has downloaded meanwhile.
    got = b.node_ok("a", 4.0)
    assert got == [("a", p.Grant(2, p.GRANT_GO)), ("a", p.Grant(3, p.GRANT_COPY, "b", "ab" * 32, 3, "audio/5.mp3")),
                   ("a", p.Grant(4, p.GRANT_GO))]
    assert b.waiting() == 0 and b.faulted_past(1e9) == []


def test_a_node_faulted_past_the_bound_is_named_until_it_can_store_or_leaves():
    b = DownloadBoard(HostGate(PolitenessConfig(max_per_host=1, obey_robots=False)), fault_timeout=60.0)
    b.node_fault("a", 10.0)
    b.node_fault("a", 50.0)                     # said again: the clock runs from the first
    b.node_fault("c", 20.0)
    assert b.faulted_past(69.9) == []
    assert b.faulted_past(70.0) == ["a"]
    assert b.faulted_past(80.0) == ["a", "c"]   # every call while it lasts: what it reports later follows
    b.node_ok("a", 81.0)
    b.node_gone("c", 81.0)
    assert b.faulted_past(1000.0) == []
    # A fault after a recovery is a new one, timed from its own start.
    b.node_fault("a", 100.0)
    assert b.faulted_past(159.0) == [] and b.faulted_past(160.0) == ["a"]


def test_a_faulted_node_that_leaves_takes_its_held_asks_with_it():
    b = board(max_per_host=1)
    b.ask("b", ((1, CDN + "/1.mp3"),), 0.0)
    b.ask("a", ((2, CDN + "/2.mp3"),), 0.0)
    b.node_fault("a", 1.0)
    b.ask("a", ((3, CDN + "/3.mp3"),), 1.0)
    assert b.waiting() == 2
    assert b.node_gone("a", 2.0) == [] and b.waiting() == 0
    assert b.done("b", (p.DownloadEnd(1),), 3.0) == []
    assert b.node_ok("a", 4.0) == []            # nothing of it was kept
