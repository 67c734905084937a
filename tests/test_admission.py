"""The master's handshake slots (crawler/master/admission.py): the decision table, with time passed in."""

import pytest

from crawler.master.admission import Admission, Limits, Verdict, source_of

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def test_a_source_holds_at_most_its_share_and_its_newest_connection_replaces_its_idlest():
    adm: Admission[int] = Admission(Limits(total=8, per_source=3, rate=100, burst=100))
    assert [adm.offer(i, A, 0.0) for i in range(3)] == [Verdict(True)] * 3
    adm.greeted(0)                          # 0 said Hello: 1 is the oldest idle one
    assert adm.offer(3, A, 0.0) == Verdict(True, evict=1)
    assert adm.held(A) == 3 and len(adm) == 3
    adm.greeted(2)
    adm.greeted(3)
    assert adm.offer(4, A, 0.0) == Verdict(True, evict=0)      # all greeted: the oldest
    # Another source is not touched by A's churn.
    assert adm.offer(10, B, 0.0) == Verdict(True)


def test_when_all_slots_are_held_the_busiest_source_gives_one_up_and_a_newcomer_is_never_starved():
    adm: Admission[int] = Admission(Limits(total=4, per_source=3, rate=100, burst=100))
    for i in range(3):
        assert adm.offer(i, A, 0.0).admit
    assert adm.offer(3, B, 0.0) == Verdict(True)
    assert adm.offer(4, C, 0.0) == Verdict(True, evict=0)      # A holds the most
    assert (adm.held(A), adm.held(B), adm.held(C)) == (2, 1, 1)
    assert adm.offer(5, C, 0.0) == Verdict(True, evict=1)      # A still holds the most
    assert adm.offer(6, B, 0.0) == Verdict(True, evict=4)      # now C holds the most
    # B is now the busiest itself: it cannot take from anyone.
    v = adm.offer(7, B, 0.0)
    assert not v.admit and "all 4 handshake slots held" in v.reason
    assert (adm.held(A), adm.held(B), adm.held(C)) == (1, 2, 1)


def test_released_slots_are_free_again_and_unknown_keys_are_ignored():
    adm: Admission[int] = Admission(Limits(total=2, per_source=2, rate=100, burst=100))
    assert adm.offer(1, A, 0.0).admit and adm.offer(2, A, 0.0).admit
    adm.release(1)
    adm.release(1)
    adm.release(99)
    assert adm.held(A) == 1 and adm.offer(3, B, 0.0) == Verdict(True)
    with pytest.raises(ValueError):
        adm.offer(3, B, 0.0)


def test_each_source_opens_connections_at_its_own_rate():
    adm: Admission[int] = Admission(Limits(total=100, per_source=100, rate=2.0, burst=3))
    got = [adm.offer(i, A, 10.0).admit for i in range(5)]
    assert got == [True, True, True, False, False]             # the burst, then nothing
    assert "more than 2 connections a second from 10.0.0.1" in adm.offer(5, A, 10.0).reason
    assert adm.offer(6, B, 10.0).admit                          # B has its own bucket
    assert not adm.offer(7, A, 10.4).admit and adm.offer(8, A, 10.5).admit    # one token per 0.5 s
    assert [adm.offer(20 + i, A, 100.0).admit for i in range(4)] == [True, True, True, False]   # capped at burst
    assert adm.refused == 5


def test_remembered_sources_are_bounded():
    adm: Admission[int] = Admission(Limits(total=4, per_source=1, rate=1.0, burst=1, sources=10))
    for i in range(1000):
        adm.offer(i, f"10.1.{i // 256}.{i % 256}", 0.0)
        adm.release(i)
    assert len(adm._buckets) == 10 and len(adm) == 0


@pytest.mark.parametrize("host, source", [
    ("127.0.0.2", "127.0.0.2"),
    ("::ffff:127.0.0.2", "127.0.0.2"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("/run/master.sock", "/run/master.sock"),
])
def test_a_source_is_an_ipv4_address_or_an_ipv6_64(host, source):
    assert source_of(host) == source


def test_limits_are_checked():
    with pytest.raises(ValueError):
        Limits(total=4, per_source=5)
    with pytest.raises(ValueError):
        Limits(rate=0)
