"""The master's gates per site: a site's min_delay and max_per_host (and the audio pair, in the downloads' gate)
take the crawl's place for its hosts; a Crawl-delay still applies on top. Pure: time is passed in."""

import math
from pathlib import Path

from crawler.master.sitestats import SiteStats
from crawler.politeness import SLACK_CAP, HostGate, HostLimits, PolitenessConfig
from crawler.protocol import DONE, ERROR, RETRY, Result
from crawler.sites import gate_limits, parse_sites

A = "http://a.example"          # a site with its own politeness
B = "http://b.example"          # none: the crawl's


def gates(sites: dict, **crawl) -> tuple[HostGate, HostGate]:
    table = parse_sites("sites", sites, Path("."))
    cfg = PolitenessConfig(**crawl)
    pages = HostGate(cfg, *gate_limits(table, audio=False, max_per_host=cfg.max_per_host, min_delay=cfg.min_delay))
    acfg = PolitenessConfig(max_per_host=None, min_delay=0.0, obey_robots=False)
    audio = HostGate(acfg, *gate_limits(table, audio=True, max_per_host=None, min_delay=0.0))
    return pages, audio


def test_a_sites_min_delay_and_max_per_host_hold_for_its_host_only():
    pages, _ = gates({"a.example": {"politeness": {"min_delay": 1.0, "max_per_host": 1}}}, max_per_host=4)
    assert pages.try_acquire(A, 0.0)
    assert not pages.try_acquire(A, 5.0)            # one in flight: its limit is 1
    assert pages.ready_at(A, 5.0) == math.inf
    pages.release(A, 5.0)
    assert pages.try_acquire(A, 5.0)                # spaced long enough since the last start (0.0)
    pages.release(A, 5.1)
    assert not pages.try_acquire(A, 5.5)            # within 1 s of the last start
    # A start made late is booked up to SLACK_CAP earlier (politeness.py), so the next is due that much sooner.
    assert 6.0 - SLACK_CAP <= pages.ready_at(A, 5.5) <= 6.0
    assert pages.try_acquire(A, 6.0)
    # B keeps the crawl's: four at once, no spacing.
    assert all(pages.try_acquire(B, 0.0) for _ in range(4))
    assert not pages.try_acquire(B, 0.0)
    assert pages.delay(A) == 1.0 and pages.delay(B) == 0.0
    assert pages.max_per_host(A) == 1 and pages.max_per_host(B) == 4
    assert pages.limits("http://unseen.example") == HostLimits(4, 0.0)


def test_a_site_that_sets_only_its_delay_keeps_the_crawls_concurrency():
    pages, _ = gates({"a.example": {"politeness": {"min_delay": 0.5}}}, max_per_host=2, min_delay=0.1)
    assert pages.limits(A) == HostLimits(2, 0.5)
    assert pages.limits(B) == HostLimits(2, 0.1)


def test_a_crawl_delay_still_applies_on_top_the_larger_wins():
    pages, _ = gates({"a.example": {"politeness": {"min_delay": 0.5}}})
    pages.set_crawl_delay(A, 2.0)
    assert pages.delay(A) == 2.0
    pages.set_crawl_delay(A, 0.1)
    assert pages.delay(A) == 0.5
    assert pages.try_acquire(A, 10.0) and not pages.try_acquire(A, 10.4) and pages.try_acquire(A, 10.5)


def test_the_site_delay_is_not_forgotten_with_the_idle_host():
    # host_idle_ttl shorter than the site's delay: the host's state must outlive the spacing it keeps.
    table = parse_sites("sites", {"a.example": {"politeness": {"min_delay": 100.0}}}, Path("."))
    cfg = PolitenessConfig(host_idle_ttl=1.0, crawl_delay_cap=1.0)
    gate = HostGate(cfg, *gate_limits(table, audio=False, max_per_host=None, min_delay=0.0))
    assert gate.try_acquire(A, 0.0)
    gate.release(A, 0.0)
    gate.try_acquire(B, 50.0)                       # another host's call moves the clock on
    assert not gate.try_acquire(A, 50.0)
    assert gate.try_acquire(A, 100.0)


def test_adaptive_delay_stays_at_or_above_the_sites_delay():
    pages, _ = gates({"a.example": {"politeness": {"min_delay": 3.0}}}, adaptive=True, max_delay=2.0)
    assert pages.try_acquire(A, 0.0)
    pages.release(A, 0.01)
    pages.responded(A, 0.0, 0.01, latency=0.01)
    assert pages.delay(A) == 3.0


def test_the_audio_gate_takes_the_sites_audio_pair_not_its_pages_pair():
    _, audio = gates({"a.example": {"politeness": {"min_delay": 5.0, "max_per_host": 1, "audio_max_per_host": 2,
                                                   "audio_min_delay": 0.25}}})
    assert audio.limits(A) == HostLimits(2, 0.25)
    assert audio.try_acquire(A, 0.0) and not audio.try_acquire(A, 0.1) and audio.try_acquire(A, 0.25)
    assert not audio.try_acquire(A, 1.0)            # two in flight
    assert audio.limits(B) == HostLimits(None, 0.0)


def test_limits_are_looked_up_once_per_host_not_per_request():
    calls = []

    def limits_of(host):
        calls.append(host)
        return HostLimits(None, 0.0)

    gate = HostGate(PolitenessConfig(), limits_of)
    for i in range(100):
        assert gate.try_acquire(A, float(i))
        gate.release(A, float(i))
    assert calls == [A]


def test_no_sites_no_lookup():
    gate = HostGate(PolitenessConfig(max_per_host=None))
    assert not gate.limited
    assert HostGate(PolitenessConfig(), lambda h: None).limited


def test_site_figures_count_pages_and_audio_and_read_the_gates():
    table = parse_sites("sites", {"a.example": {"politeness": {"min_delay": 1.0, "max_per_host": 1}},
                                  "*.c.example": {"user_agent": "x"}}, Path("."))
    stats = SiteStats(table)
    pages = HostGate(PolitenessConfig(max_per_host=3),
                     *gate_limits(table, audio=False, max_per_host=3, min_delay=0.0))
    audio = HostGate(PolitenessConfig(obey_robots=False),
                     *gate_limits(table, audio=True, max_per_host=None, min_delay=0.0))
    stats.pages([Result(1, A + "/", DONE, 200), Result(2, A + "/x", ERROR, 404), Result(3, A + "/y", RETRY, 503),
                 Result(4, B + "/", DONE, 200), Result(5, "http://w.c.example/", DONE, 200)])
    stats.audio([{"url": A + "/a.mp3"}, {"url": B + "/b.mp3"}, {"url": ""}])
    assert pages.try_acquire(A, 0.0)
    v = stats.view(pages, audio)
    assert list(v) == ["a.example", "*.c.example"]
    a = v["a.example"]
    assert (a["pages_done"], a["pages_failed"], a["audio"]) == (1, 1, 1)
    assert (a["pages_in_flight"], a["max_per_host"], a["delay_s"], a["min_delay_s"]) == (1, 1, 1.0, 1.0)
    c = v["*.c.example"]
    assert (c["pages_done"], c["max_per_host"], c["min_delay_s"], c["user_agent"]) == (1, 3, 0.0, True)
    assert not SiteStats(parse_sites("sites", {}, Path(".")))
