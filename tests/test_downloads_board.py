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
