import os
import subprocess
import sys
from collections import Counter
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.scheduler import NodeTable, UnknownNode, host_key

NODES8 = tuple(f"node-{i}" for i in range(8))
NODES5 = ("alpha", "bravo", "charlie", "delta", "echo")


def site_urls(n: int, hosts: int = 1) -> list[str]:
    # One big site by default: key="url" must spread it all the same.
    return [f"https://music{i % hosts}.example.com/song/{i}.html?from=list" for i in range(n)]


BALANCE_URLS = site_urls(200_000)


def table(nodes=NODES8, live=None, key="url") -> NodeTable:
    return NodeTable(nodes, key=key, live=nodes if live is None else live)


# --- construction and misuse -------------------------------------------------------------------------------

@pytest.mark.parametrize("ids", [[], ["a", "b", "a"], ["a", ""]])
def test_bad_node_lists_are_refused(ids):
    with pytest.raises(ValueError):
        NodeTable(ids)


def test_duplicate_ids_are_named():
    with pytest.raises(ValueError, match="dup"):
        NodeTable(["a", "dup", "b", "dup"])


def test_unknown_key_kind_is_refused():
    with pytest.raises(ValueError, match="key"):
        NodeTable(["a"], key="domain")


def test_unknown_node_is_a_clear_key_error():
    t = NodeTable(["a", "b"])
    with pytest.raises(KeyError) as exc:
        t.set_live("c", True)
    assert isinstance(exc.value, UnknownNode)
    assert "'c'" in str(exc.value) and "a, b" in str(exc.value)


def test_live_set_follows_set_live():
    t = NodeTable(["a", "b", "c"])
    assert t.live == frozenset()
    t.set_live("b", True)
    t.set_live("c", True)
    t.set_live("b", False)
    t.set_live("b", False)
    assert t.live == {"c"}
    assert t.nodes == ("a", "b", "c")


def test_nothing_live_assigns_none():
    t = NodeTable(NODES5)
    assert t.assign("https://a.example/") is None
    assert t.assign_many(["https://a.example/1", "https://a.example/2"]) == [None, None]


# --- first hash ---------------------------------------------------------------------------------------------

def test_live_owner_gets_its_slot():
    t = table()
    urls = site_urls(2_000)
    assert t.assign_many(urls) == [t.owner_of(u) for u in urls]
    assert {t.slot_of(u) for u in urls} == set(range(8))
    assert all(t.owner_of(u) == NODES8[t.slot_of(u)] for u in urls)


def test_owner_ignores_liveness_and_dead_owner_never_gets_urls():
    t = table(live=NODES8[1:])
    urls = site_urls(5_000)
    mine = [u for u in urls if t.owner_of(u) == "node-0"]
    assert mine
    assert "node-0" not in t.assign_many(urls)


def test_assignment_is_the_same_in_every_process():
    # Python's hash() is salted per process; routing must not be.
    code = ("from crawler.scheduler import NodeTable;"
            "t = NodeTable(['a', 'b', 'c', 'd', 'e'], live=['b', 'd']);"
            "u = [f'https://x.example/{i}' for i in range(300)];"
            "print(''.join(t.assign_many(u)), [t.slot_of(x) for x in u[:20]])")
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1
    t = NodeTable(["a", "b", "c", "d", "e"], live=["b", "d"])
    u = [f"https://x.example/{i}" for i in range(300)]
    assert outs.pop() == f"{''.join(t.assign_many(u))} {[t.slot_of(x) for x in u[:20]]}\n"


def test_slots_are_pinned():
    # A change here moves every URL of a running crawl to another node: make it on purpose only.
    t = NodeTable(NODES8)
    assert [t.slot_of(f"https://example.com/{i}") for i in range(12)] == PINNED_SLOTS


PINNED_SLOTS = [7, 0, 0, 5, 7, 7, 6, 4, 3, 1, 0, 1]


# --- balance ------------------------------------------------------------------------------------------------

def max_over_mean(t: NodeTable, urls) -> float:
    counts = Counter(t.assign_many(urls))
    assert None not in counts
    assert set(counts) == set(t.live)
    return max(counts.values()) / (len(urls) / len(t.live))


@pytest.mark.parametrize("n", range(1, 9))
def test_balance_n_of_8(n):
    # Both the first n nodes and a scattered choice, so the live slots are not always neighbours.
    for live in (NODES8[:n], NODES8[::-1][:n], NODES8[n % 2::2][:n] + NODES8[(n + 1) % 2::2][:max(0, n - 4)]):
        assert len(set(live)) == n
        assert max_over_mean(table(live=live), BALANCE_URLS) <= 1.05


@pytest.mark.parametrize("live", [c for k in (1, 2, 3, 4, 5) for c in list(combinations(NODES5, k))[:2]])
def test_balance_n_of_5(live):
    assert max_over_mean(table(NODES5, live=live), BALANCE_URLS) <= 1.05


def test_a_dead_slot_spreads_over_every_live_node():
    t = table(live=NODES8[1:])
    orphans = [u for u in BALANCE_URLS if t.owner_of(u) == "node-0"]
    counts = Counter(t.assign_many(orphans))
    mean = len(orphans) / 7
    assert set(counts) == set(NODES8[1:])
    assert max(counts.values()) / mean <= 1.05 and min(counts.values()) / mean >= 0.95


# --- movement on leave and join -----------------------------------------------------------------------------

MOVE_URLS = site_urls(3_000, hosts=7)
live_sets = st.sets(st.sampled_from(NODES8), min_size=2)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(live=live_sets, data=st.data())
def test_leave_moves_only_the_leavers_urls_and_rejoin_restores_them(live, data):
    leaver = data.draw(st.sampled_from(sorted(live)))
    t = table(live=sorted(live))
    before = t.assign_many(MOVE_URLS)
    t.set_live(leaver, False)
    during = t.assign_many(MOVE_URLS)
    moved = [(b, d) for b, d in zip(before, during, strict=True) if b != d]
    assert all(b == leaver for b, _ in moved)
    assert before.count(leaver) == len(moved)
    assert leaver not in during
    t.set_live(leaver, True)
    assert t.assign_many(MOVE_URLS) == before


@settings(max_examples=60, deadline=None, derandomize=True)
@given(live=st.sets(st.sampled_from(NODES8), min_size=1, max_size=7), data=st.data())
def test_join_moves_urls_only_to_the_joiner(live, data):
    joiner = data.draw(st.sampled_from(sorted(set(NODES8) - live)))
    t = table(live=sorted(live))
    before = t.assign_many(MOVE_URLS)
    t.set_live(joiner, True)
    after = t.assign_many(MOVE_URLS)
    assert all(a == joiner for b, a in zip(before, after, strict=True) if b != a)
    # Its own slot comes back to it whole.
    assert all(a == joiner for u, a in zip(MOVE_URLS, after, strict=True) if t.owner_of(u) == joiner)


def test_share_moved_on_leave_is_the_leavers_share():
    t = table(live=NODES8[:6])
    before = t.assign_many(BALANCE_URLS)
    t.set_live("node-2", False)
    after = t.assign_many(BALANCE_URLS)
    share = sum(b != a for b, a in zip(before, after, strict=True)) / len(BALANCE_URLS)
    assert share == pytest.approx(1 / 6, rel=0.05)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(steps=st.lists(st.tuples(st.sampled_from(NODES5), st.booleans()), max_size=12))
def test_assignment_depends_only_on_the_live_set(steps):
    # Whatever path led to a live set (and whichever cached tables it went through), routing is the same.
    t = table(NODES5, live=NODES5[:2])
    for node, up in steps:
        t.set_live(node, up)
    fresh = NodeTable(NODES5, live=t.live)
    assert t.assign_many(MOVE_URLS) == fresh.assign_many(MOVE_URLS)
    assert [t.assign(u) for u in MOVE_URLS[:50]] == fresh.assign_many(MOVE_URLS[:50])


# --- host key -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, host", [
    ("https://music.example.com/a/b?c=1", "music.example.com"),
    ("http://music.example.com:8080/a", "music.example.com"),
    ("http://music.example.com", "music.example.com"),
    ("http://music.example.com?q=1", "music.example.com"),
    ("http://user:pw@music.example.com:81/x", "music.example.com"),
    ("http://music.example.com#top", "music.example.com"),
    ("http://music.example.com?next=/a/b", "music.example.com"),
    ("http://[2001:db8::1]:8080/x", "[2001:db8::1]"),
])
def test_host_key(url, host):
    assert host_key(url) == host


def test_host_key_needs_an_absolute_url():
    with pytest.raises(ValueError):
        host_key("/relative/path")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(live=st.sets(st.sampled_from(NODES8), min_size=1))
def test_host_key_keeps_each_host_on_one_node(live):
    t = table(live=sorted(live), key="host")
    urls = [f"http://h{i % 40}.example.org{':8080' if i % 3 == 0 else ''}/p/{i}" for i in range(2_000)]
    by_host: dict[str, set] = {}
    for u, node in zip(urls, t.assign_many(urls), strict=True):
        by_host.setdefault(host_key(u), set()).add(node)
    assert len(by_host) == 40
    assert all(len(nodes) == 1 for nodes in by_host.values())


def test_url_key_spreads_one_host_over_all_nodes():
    t = table()
    assert set(t.assign_many(site_urls(500))) == set(NODES8)
    assert len(set(table(key="host").assign_many(site_urls(500)))) == 1
