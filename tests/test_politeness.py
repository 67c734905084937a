import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.politeness import (
    KNOWN,
    PENDING,
    ROBOTS_MAX_BYTES,
    SLACK_CAP,
    SLACK_SHARE,
    UNKNOWN,
    HostGate,
    PolitenessConfig,
    RobotsRules,
    parse_retry_after,
    robots_url,
)
from crawler.web.urls import host_url_of

HOSTS = ("a.example", "b.example", "c.example")


# --- config -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {"max_per_host": 0}, {"min_delay": -1.0}, {"min_delay": math.nan}, {"crawl_delay_cap": math.inf},
    {"robots_ttl": 0.0}, {"host_idle_ttl": -5.0}, {"user_agent": " "},
])
def test_config_refuses_nonsense(kw):
    with pytest.raises(ValueError):
        PolitenessConfig(**kw)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        PolitenessConfig().min_delay = 1.0   # type: ignore[misc]


# --- HostGate: a simulated clock ----------------------------------------------------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=3.0)),
    st.tuples(st.just("acquire"), st.sampled_from(HOSTS)),
    st.tuples(st.just("release"), st.integers(min_value=0, max_value=50)),
    st.tuples(st.just("delay"), st.sampled_from(HOSTS), st.one_of(st.none(), st.floats(0.0, 30.0))),
), max_size=120)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(max_per_host=st.one_of(st.none(), st.integers(1, 3)), min_delay=st.sampled_from([0.0, 0.5, 1.5]),
       cap=st.sampled_from([0.0, 2.0, 10.0]), evs=events)
def test_gate_never_exceeds_concurrency_or_spacing(max_per_host, min_delay, cap, evs):
    cfg = PolitenessConfig(max_per_host=max_per_host, min_delay=min_delay, crawl_delay_cap=cap,
                           host_idle_ttl=5.0, robots_ttl=20.0)
    gate = HostGate(cfg)
    now = 0.0
    crawl_delay = {h: None for h in HOSTS}     # what robots.txt said, our own model
    last_start: dict[str, float] = {}
    slack: dict[str, float] = {}          # how much earlier than its start the gate may have booked it
    in_flight: list[str] = []

    def spacing(h):
        d = crawl_delay[h]
        return min_delay if d is None or d <= 0 else max(min_delay, min(d, cap))

    for ev in evs:
        if ev[0] == "tick":
            now += ev[1]
        elif ev[0] == "delay":
            gate.set_crawl_delay(ev[1], ev[2])
            crawl_delay[ev[1]] = ev[2]
            assert gate.delay(ev[1]) == spacing(ev[1])
        elif ev[0] == "release":
            if in_flight:
                gate.release(in_flight.pop(ev[1] % len(in_flight)), now)
        else:
            h = ev[1]
            ready = gate.ready_at(h, now)
            ok = gate.try_acquire(h, now)
            # ready_at and try_acquire agree.
            assert ok == (ready <= now)
            if ok:
                # Starts are booked on a schedule: a late one lends the next up to its slack, no more.
                assert now - last_start.get(h, -math.inf) >= spacing(h) - slack.get(h, 0.0) - 1e-9   # float rounding
                last_start[h] = now
                slack[h] = min(spacing(h) * SLACK_SHARE, SLACK_CAP)
                in_flight.append(h)
                assert max_per_host is None or in_flight.count(h) <= max_per_host
            else:
                blocked_by_count = max_per_host is not None and in_flight.count(h) >= max_per_host
                assert blocked_by_count or now - last_start[h] < spacing(h)
                if blocked_by_count:
                    assert ready == math.inf
                else:
                    assert now < ready < math.inf
                    assert ready - last_start[h] >= spacing(h) - slack[h] - 1e-9
        for h in HOSTS:
            assert gate.in_flight(h) == in_flight.count(h)


def test_min_delay_spaces_starts_across_all_callers():
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=2.0))
    assert gate.try_acquire("h", 10.0)
    assert not gate.try_acquire("h", 11.999)
    assert gate.ready_at("h", 11.0) == 12.0
    assert gate.try_acquire("other", 11.0)      # per host
    assert gate.try_acquire("h", 12.0)


def test_max_per_host_waits_for_a_release():
    gate = HostGate(PolitenessConfig(max_per_host=2))
    assert gate.try_acquire("h", 0.0) and gate.try_acquire("h", 0.0)
    assert not gate.try_acquire("h", 100.0)
    assert gate.ready_at("h", 100.0) == math.inf
    gate.release("h", 101.0)
    assert gate.ready_at("h", 101.0) == 101.0
    assert gate.try_acquire("h", 101.0)


def test_limits_can_be_switched_off():
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=0.0))
    assert all(gate.try_acquire("h", 1.0) for _ in range(1000))
    assert gate.in_flight("h") == 1000


def test_crawl_delay_is_capped_and_never_below_min_delay():
    gate = HostGate(PolitenessConfig(min_delay=1.0, crawl_delay_cap=10.0))
    gate.set_crawl_delay("slow", 3600.0)
    gate.set_crawl_delay("quick", 0.25)
    assert gate.delay("slow") == 10.0
    assert gate.delay("quick") == 1.0
    assert gate.try_acquire("slow", 0.0)
    gate.release("slow", 0.1)
    assert not gate.try_acquire("slow", 9.9)
    assert gate.try_acquire("slow", 10.0)
    gate.set_crawl_delay("slow", None)
    assert gate.delay("slow") == 1.0


def test_crawl_delay_cap_zero_ignores_crawl_delay():
    gate = HostGate(PolitenessConfig(min_delay=0.0, crawl_delay_cap=0.0))
    gate.set_crawl_delay("h", 5.0)
    assert gate.try_acquire("h", 0.0) and gate.try_acquire("h", 0.0)


def test_release_without_acquire_is_an_error():
    gate = HostGate(PolitenessConfig())
    with pytest.raises(RuntimeError):
        gate.release("h", 0.0)
    assert gate.try_acquire("h", 0.0)
    gate.release("h", 0.0)
    with pytest.raises(RuntimeError):
        gate.release("h", 0.0)


def test_idle_hosts_are_forgotten():
    gate = HostGate(PolitenessConfig(min_delay=1.0, host_idle_ttl=60.0))
    for i in range(10_000):
        host = f"h{i}"
        assert gate.try_acquire(host, i * 0.005)
        gate.release(host, i * 0.005)
    assert len(gate) == 10_000              # all used within the last minute...
    gate.try_acquire("late", 200.0)
    assert len(gate) == 1                   # ...and none of them since


def test_busy_hosts_are_kept():
    gate = HostGate(PolitenessConfig(max_per_host=1, host_idle_ttl=60.0))
    assert gate.try_acquire("long-download", 0.0)
    for i in range(100):
        gate.try_acquire(f"h{i}", 1000.0 + i * 100)
        gate.release(f"h{i}", 1000.0 + i * 100)
    assert gate.in_flight("long-download") == 1
    assert not gate.try_acquire("long-download", 20_000.0)


def test_crawl_delay_outlives_the_idle_ttl_but_not_the_robots_ttl():
    gate = HostGate(PolitenessConfig(host_idle_ttl=60.0, robots_ttl=1000.0, min_delay=0.0))
    gate.try_acquire("plain", 0.0)
    gate.release("plain", 0.0)
    gate.set_crawl_delay("slow", 5.0)
    gate.try_acquire("slow", 0.0)
    gate.release("slow", 0.0)
    gate.try_acquire("x", 500.0)
    assert gate.delay("slow") == 5.0 and len(gate) == 2    # "plain" is gone, "slow" kept
    assert gate.try_acquire("slow", 501.0)
    assert not gate.try_acquire("slow", 502.0)
    gate.release("slow", 502.0)
    gate.try_acquire("x", 2000.0)
    assert gate.delay("slow") == 0.0 and len(gate) == 1


def test_a_crawl_delay_learnt_after_the_host_was_forgotten_still_counts_from_its_last_start():
    gate = HostGate(PolitenessConfig(host_idle_ttl=5.0, crawl_delay_cap=10.0, max_per_host=None))
    assert gate.try_acquire("h", 0.0)
    gate.release("h", 0.0)
    gate.try_acquire("other", 6.0)          # "h" has been idle past host_idle_ttl
    gate.set_crawl_delay("h", 8.0)          # then a refetched robots.txt asks for more
    assert not gate.try_acquire("h", 7.0)
    assert gate.try_acquire("h", 8.0)


def test_crawl_delay_set_before_any_request_is_kept():
    gate = HostGate(PolitenessConfig(host_idle_ttl=60.0, robots_ttl=1000.0))
    gate.set_crawl_delay("slow", 5.0)
    gate.try_acquire("other", 100.0)
    assert gate.delay("slow") == 5.0


# --- robots.txt ---------------------------------------------------------------------------------------------

HOST = "https://music.example.com"
ROBOTS = b"""\
User-agent: audio-crawler
Disallow: /private/
Allow: /private/ok
Crawl-delay: 4

User-agent: *
Disallow: /
Crawl-delay: 99
"""


def fetched(status, body=None, cfg=None, now=0.0):
    rules = RobotsRules(cfg or PolitenessConfig())
    rules.mark_pending(HOST, now)
    return rules, rules.store(HOST, status, body, now)


def test_state_goes_unknown_pending_known():
    rules = RobotsRules(PolitenessConfig())
    assert rules.state(HOST, 0.0) == UNKNOWN
    rules.mark_pending(HOST, 0.0)
    assert rules.state(HOST, 1.0) == PENDING
    rules.store(HOST, 200, ROBOTS, 2.0)
    assert rules.state(HOST, 3.0) == KNOWN
    assert rules.state("https://other.example", 3.0) == UNKNOWN


def test_rules_for_our_agent_and_its_crawl_delay():
    rules, delay = fetched(200, ROBOTS)
    assert delay == 4.0
    assert rules.allowed(HOST + "/songs/1.mp3")
    assert not rules.allowed(HOST + "/private/x")
    assert rules.allowed(HOST + "/private/ok")


def test_other_agents_rules_do_not_apply():
    rules, delay = fetched(200, ROBOTS, PolitenessConfig(user_agent="someone-else"))
    assert delay == 99.0
    assert not rules.allowed(HOST + "/songs/1.mp3")


def test_no_crawl_delay_returns_none():
    assert fetched(200, b"User-agent: *\nDisallow: /x\n")[1] is None


@pytest.mark.parametrize("status", [404, 410, 401, 403, 301])
def test_unavailable_robots_allows_everything(status):
    rules, delay = fetched(status, b"User-agent: *\nDisallow: /\n")
    assert delay is None
    assert rules.state(HOST, 1.0) == KNOWN
    assert rules.allowed(HOST + "/anything")


@pytest.mark.parametrize("status", [500, 503, 429, None])
def test_unreachable_robots_disallows_everything_then_retries(status):
    cfg = PolitenessConfig(robots_retry_after=600.0)
    rules, _ = fetched(status, None, cfg)
    assert rules.state(HOST, 1.0) == KNOWN
    assert not rules.allowed(HOST + "/")
    assert rules.state(HOST, 599.0) == KNOWN
    assert rules.state(HOST, 600.0) == UNKNOWN
    rules.mark_pending(HOST, 600.0)
    rules.store(HOST, 200, b"", 601.0)
    assert rules.allowed(HOST + "/")
    assert rules.state(HOST, 601.0 + cfg.robots_ttl - 1) == KNOWN


def test_rules_expire_after_ttl_and_stay_in_force_while_refetched():
    cfg = PolitenessConfig(robots_ttl=100.0)
    rules, _ = fetched(200, ROBOTS, cfg)
    assert rules.state(HOST, 99.0) == KNOWN
    assert rules.state(HOST, 100.0) == UNKNOWN
    rules.mark_pending(HOST, 100.0)
    assert rules.state(HOST, 101.0) == PENDING
    assert not rules.allowed(HOST + "/private/x")


def test_a_fetch_that_never_reports_is_given_up():
    rules = RobotsRules(PolitenessConfig(robots_fetch_timeout=30.0))
    rules.mark_pending(HOST, 0.0)
    assert rules.state(HOST, 29.0) == PENDING
    assert rules.state(HOST, 30.0) == UNKNOWN


def test_body_past_500_kib_is_ignored():
    filler = b"# " + b"x" * 1000 + b"\n"
    head = b"User-agent: *\nDisallow: /early/\n"
    body = head + filler * (ROBOTS_MAX_BYTES // len(filler) + 1) + b"Disallow: /late/\n"
    assert len(body) > ROBOTS_MAX_BYTES
    rules, _ = fetched(200, body)
    assert not rules.allowed(HOST + "/early/1")
    assert rules.allowed(HOST + "/late/1")


def test_a_line_cut_by_the_limit_is_dropped_whole():
    head = b"User-agent: *\n#" + b"x" * (ROBOTS_MAX_BYTES - 12 - 16) + b"\n"
    assert len(head) == ROBOTS_MAX_BYTES - 12
    rules, _ = fetched(200, head + b"Disallow: /private/\n")
    # Cut mid-line this would read "Disallow: /p", blocking far more than the site asked.
    assert rules.allowed(HOST + "/pictures/1")


def test_undecodable_body_is_still_parsed():
    rules, delay = fetched(200, b"User-agent: *\nDisallow: /\xff\xfe/\nCrawl-delay: 2\nDisallow: /x\n")
    assert delay == 2.0
    assert not rules.allowed(HOST + "/x")


def test_robots_can_be_switched_off():
    rules = RobotsRules(PolitenessConfig(obey_robots=False))
    assert rules.state(HOST, 0.0) == KNOWN
    assert rules.allowed(HOST + "/private/x")


def test_allowed_before_store_is_an_error():
    rules = RobotsRules(PolitenessConfig())
    with pytest.raises(LookupError):
        rules.allowed(HOST + "/x")
    rules.mark_pending(HOST, 0.0)
    with pytest.raises(LookupError):
        rules.allowed(HOST + "/x")


def test_stale_hosts_are_forgotten():
    rules = RobotsRules(PolitenessConfig(robots_ttl=100.0))
    for i in range(1000):
        rules.mark_pending(f"http://h{i}.example", float(i) / 100)
        rules.store(f"http://h{i}.example", 404, None, float(i) / 100)
    assert rules.state("http://h0.example", 50.0) == KNOWN and len(rules) == 1000
    # h0 .. h99 expired at 100 .. 101 s and are dropped once their refetch grace (300 s) is over too.
    assert rules.state("http://h0.example", 400.5) == UNKNOWN and 850 <= len(rules) <= 950
    assert rules.state("http://h0.example", 500.0) == UNKNOWN and len(rules) == 0


@pytest.mark.parametrize("url, host_url", [
    ("https://music.example.com/a/b?c", "https://music.example.com"),
    ("http://music.example.com:8080", "http://music.example.com:8080"),
    ("http://music.example.com?x=1", "http://music.example.com"),
])
def test_host_url_of(url, host_url):
    assert host_url_of(url) == host_url
    assert robots_url(host_url) == host_url + "/robots.txt"


def test_robots_rules_are_capped_per_file_and_in_all():
    from crawler.politeness import ROBOTS_MAX_RULES, parse_robots
    body = b"User-agent: *\n" + b"".join(b"Disallow: /p%d/\n" % i for i in range(5 * ROBOTS_MAX_RULES))
    parsed = parse_robots(body, "bot/1.0")
    assert len(parsed.rules) == ROBOTS_MAX_RULES
    assert not parsed.allowed("http://h/p0/x") and parsed.allowed(f"http://h/p{ROBOTS_MAX_RULES}/x")
    cfg = PolitenessConfig(robots_max_hosts=50, robots_max_rules=3 * ROBOTS_MAX_RULES)
    rules_table = RobotsRules(cfg)
    for i in range(10):                       # ten big files: only the three most recent fit the rule budget
        rules_table.mark_pending(f"http://h{i}.example", 0.0)
        rules_table.store(f"http://h{i}.example", 200, body, 0.0)
    assert len(rules_table) == 3 and rules_table.state("http://h9.example", 1.0) == KNOWN
    assert rules_table.state("http://h0.example", 1.0) == UNKNOWN         # forgotten: fetched again when needed
    for i in range(200):                      # many small files: the host count is capped
        rules_table.mark_pending(f"http://s{i}.example", 0.0)
        rules_table.store(f"http://s{i}.example", 404, None, 0.0)
    assert len(rules_table) == 50


def test_recently_used_rules_stay():
    cfg = PolitenessConfig(robots_max_hosts=2)
    rules = RobotsRules(cfg)
    for host in ("http://a.example", "http://b.example"):
        rules.mark_pending(host, 0.0)
        rules.store(host, 200, b"User-agent: *\nDisallow: /x\n", 0.0)
    assert rules.allowed("http://a.example/y")          # a is used: b is now the least recently used
    rules.mark_pending("http://c.example", 0.0)
    assert rules.state("http://a.example", 1.0) == KNOWN and rules.state("http://b.example", 1.0) == UNKNOWN


# The readings protego (the parser before crawler/robots.py) got wrong, each of which fetched what a site forbids
# or skipped what it allows; tests/test_robots_conformance.py runs Google's whole suite.

def test_a_robots_txt_starting_with_a_byte_order_mark_is_obeyed():
    rules, delay = fetched(200, b"\xef\xbb\xbf" + ROBOTS)
    assert delay == 4.0
    assert not rules.allowed(HOST + "/private/x") and rules.allowed(HOST + "/private/ok")


def test_an_unknown_line_between_user_agent_lines_does_not_end_the_group():
    body = b"User-agent: audio-crawler\nInvalid-Unknown-Line: x\nUser-agent: *\nDisallow: /\n"
    rules, _ = fetched(200, body)
    assert not rules.allowed(HOST + "/songs/1.mp3")


@pytest.mark.parametrize("line", [b"AUDIO-CRAWLER BOT", b"audio-crawler/2.0", b"Audio-Crawler"])
def test_a_user_agent_line_names_its_leading_token_case_insensitively(line):
    rules, delay = fetched(200, b"User-agent: *\nDisallow: /\n\nUser-agent: " + line
                           + b"\nAllow: /songs/\nDisallow: /\nCrawl-delay: 3\n")
    assert rules.allowed(HOST + "/songs/1.mp3") and not rules.allowed(HOST + "/private/x")
    assert delay == 3.0


@pytest.mark.parametrize("line", [b"audio", b"crawler", b"audio-crawlers", b"audio-crawler-extra"])
def test_a_user_agent_line_is_not_matched_by_substring(line):
    # protego let "audio" name "audio-crawler"; RFC 9309 and Google compare the whole token.
    rules, delay = fetched(200, b"User-agent: " + line + b"\nDisallow: /\nCrawl-delay: 7\n")
    assert rules.allowed(HOST + "/songs/1.mp3") and delay is None


def test_groups_naming_the_crawler_merge_and_replace_the_global_ones():
    body = (b"User-agent: *\nDisallow: /songs/\nCrawl-delay: 9\n"
            b"User-agent: audio-crawler\nDisallow: /a/\nCrawl-delay: 1\n"
            b"User-agent: other\nDisallow: /\n"
            b"User-agent: audio-crawler\nDisallow: /b/\nCrawl-delay: 2\n")
    rules, delay = fetched(200, body)
    assert delay == 2.0                       # the largest of the groups that apply
    assert rules.allowed(HOST + "/songs/1.mp3")
    assert not rules.allowed(HOST + "/a/1") and not rules.allowed(HOST + "/b/1")


def test_hostile_patterns_match_in_time_linear_in_the_path():
    import time

    from crawler import robots
    # Patterns that make a backtracking matcher (a regex of .*) take time exponential or quadratic in the path.
    body = b"User-agent: *\nDisallow: /" + b"*a" * 4000 + b"*b\nDisallow: /" + b"*a" * 4000 + b"*c$\n"
    parsed = robots.parse(body, "audio-crawler")
    path = "http://h/" + "a" * 16000
    start = time.perf_counter()
    for _ in range(20):
        assert parsed.allowed(path + "d") and parsed.allowed(path + "cd")
        assert not parsed.allowed(path + "b") and not parsed.allowed(path + "c")
    assert time.perf_counter() - start < 1.0


def test_lines_past_the_cap_are_not_read():
    from crawler import robots
    body = b"User-agent: *\n" + b"#\n" * robots.MAX_LINES + b"Disallow: /\n"
    assert robots.parse(body, "audio-crawler").allowed("http://h/x")
# --- HostGate: schedule, backoff on 429/503, adaptive delay -------------------------------------------------

def test_late_starts_keep_the_schedule_but_never_run_ahead_of_it():
    # The master wakes 1 ms late every time: the gate books each start when it was due, so ten starts take
    # nine delays (plus the last lateness), not nine delays plus nine latenesses.
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=0.01))
    starts, now = [], 100.0
    for _ in range(10):
        now = gate.ready_at("h", now) + 0.001
        assert gate.try_acquire("h", now)
        starts.append(now)
    assert starts[-1] - starts[0] == pytest.approx(9 * 0.01 + 0.001, abs=1e-9)
    # Lateness beyond the slack is lost, not lent: the next start waits a full delay less the slack.
    now = gate.ready_at("h", now) + 0.5
    assert gate.try_acquire("h", now)
    slack = min(0.01 * SLACK_SHARE, SLACK_CAP)
    assert gate.ready_at("h", now) == pytest.approx(now + 0.01 - slack)
    assert not gate.try_acquire("h", now + 0.01 - slack - 1e-6)


def test_the_first_start_of_a_host_is_booked_when_it_happens():
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=1.0))
    assert gate.try_acquire("h", 50.0)
    assert gate.ready_at("h", 50.0) == 51.0


def test_429_pauses_the_host_for_its_retry_after_and_backs_off_exponentially():
    cfg = PolitenessConfig(max_per_host=None, min_delay=0.0, backoff_base=1.0, backoff_max=8.0,
                           retry_after_cap=100.0)
    gate = HostGate(cfg)
    assert gate.try_acquire("h", 0.0)
    gate.release("h", 0.5)
    assert gate.throttled("h", started=0.0, now=0.5, retry_after=2.0) == 2.5   # Retry-After beats the 1 s step
    assert not gate.try_acquire("h", 2.49) and gate.ready_at("h", 1.0) == 2.5
    assert gate.try_acquire("other", 1.0)                                     # one host only
    pauses = []
    now = 2.5
    for _ in range(6):                     # each new request is answered 429 without Retry-After
        assert gate.try_acquire("h", now)
        gate.release("h", now)
        until = gate.throttled("h", started=now, now=now)
        pauses.append(until - now)
        now = until
    assert pauses == [2.0, 4.0, 8.0, 8.0, 8.0, 8.0]          # doubling, capped at backoff_max
    # An answer to a request sent after the pause ends the run: the next 429 starts from the base again.
    assert gate.try_acquire("h", now)
    gate.release("h", now + 0.1)
    gate.responded("h", started=now, now=now + 0.1, latency=0.1)
    assert gate.throttled("h", started=now + 0.2, now=now + 0.3) == pytest.approx(now + 1.3)


def test_answers_from_one_burst_do_not_double_the_pause():
    gate = HostGate(PolitenessConfig(max_per_host=None, backoff_base=1.0, backoff_max=100.0))
    for _ in range(4):
        assert gate.try_acquire("h", 0.0)
    # Four requests were out together; all four come back 429: one step, not 1+2+4+8.
    ends = [gate.throttled("h", started=0.0, now=0.1 * i) for i in range(1, 5)]
    assert ends[-1] == pytest.approx(1.4)
    # A 200 from that burst does not end the run either: the next request is still the second step.
    gate.responded("h", started=0.0, now=0.5, latency=0.1)
    assert gate.throttled("h", started=2.0, now=2.1) == pytest.approx(4.1)


def test_retry_after_is_capped_and_a_pause_is_remembered_past_the_idle_ttl():
    gate = HostGate(PolitenessConfig(max_per_host=None, retry_after_cap=50.0, host_idle_ttl=10.0,
                                     backoff_base=1.0))
    assert gate.throttled("h", started=0.0, now=0.0, retry_after=1e9) == 50.0
    assert gate.try_acquire("other", 20.0)          # moves the clock on past h's idle TTL
    assert gate.ready_at("h", 30.0) == 50.0


def test_adaptive_delay_follows_latency_between_min_and_max_and_never_below_crawl_delay():
    cfg = PolitenessConfig(max_per_host=None, min_delay=0.05, max_delay=2.0, adaptive=True, target_concurrency=1.0)
    gate = HostGate(cfg)
    assert gate.try_acquire("h", 0.0)
    for i in range(20):                     # a fast host: the delay stays at min_delay
        gate.responded("h", started=i, now=i, latency=0.01)
    assert gate.delay("h") == 0.05
    for i in range(20):                     # latency rises to 0.5 s: the delay converges on it
        gate.responded("h", started=i, now=i, latency=0.5)
    assert gate.delay("h") == pytest.approx(0.5, rel=1e-3)
    gate.responded("h", started=0, now=0, latency=0.01, ok=False)   # a fast error does not lower it
    assert gate.delay("h") == pytest.approx(0.5, rel=1e-3)
    gate.responded("h", started=0, now=0, latency=30.0)             # capped at max_delay
    assert gate.delay("h") == 2.0
    gate.set_crawl_delay("h", 5.0)
    for i in range(20):
        gate.responded("h", started=i, now=i, latency=0.01)
    assert gate.delay("h") == 5.0                                   # robots.txt's Crawl-delay is the floor
    gate.set_crawl_delay("h", None)
    assert gate.delay("h") == pytest.approx(0.05, rel=0.1)


def test_latency_is_ignored_without_adaptive():
    gate = HostGate(PolitenessConfig(max_per_host=None, min_delay=0.1))
    assert gate.try_acquire("h", 0.0)
    gate.responded("h", started=0.0, now=1.0, latency=10.0)
    assert gate.delay("h") == 0.1


@pytest.mark.parametrize("kw", [{"max_delay": 0.5, "min_delay": 1.0}, {"backoff_base": 10.0, "backoff_max": 1.0},
                                {"target_concurrency": 0.0}, {"retry_after_cap": -1.0}])
def test_config_refuses_inconsistent_backoff_and_adaptive_settings(kw):
    with pytest.raises(ValueError):
        PolitenessConfig(**kw)


@pytest.mark.parametrize(("value", "seconds"), [
    ("2", 2.0), (" 120 ", 120.0), ("0", 0.0),
    ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),    # an HTTP-date 10 s after "now"
    ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),     # in the past
    (None, None), ("", None), ("soon", None), ("-5", None), ("1.5", None), ("9" * 100, None),
])
def test_parse_retry_after(value, seconds):
    now = 1445412480.0   # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(value, now) == seconds


def test_sitemap_lines_are_kept_capped_and_absent_without_rules():
    body = b"User-agent: *\nDisallow:\n" + b"".join(b"Sitemap: %s/s%d.xml\n" % (HOST.encode(), i) for i in range(150))
    rules, _ = fetched(200, body)
    maps = rules.sitemaps(HOST)
    assert len(maps) == 100 and maps[0] == HOST + "/s0.xml"
    assert fetched(404)[0].sitemaps(HOST) == []
    assert RobotsRules(PolitenessConfig()).sitemaps(HOST) == []
