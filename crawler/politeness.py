"""Global politeness, kept at the master: per-host concurrency and spacing, and robots.txt.

The scheduler spreads one host's URLs over many workers, so no worker can see how hard a host is being
hit; the master can. These classes only decide: the master asks before it hands a URL out, fetches
robots.txt itself and feeds the answer back. Time is a parameter (float seconds, any monotonic clock),
so nothing here sleeps.
"""

from __future__ import annotations

import datetime
import email.utils
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from crawler import robots
from crawler.config import non_negative, positive, setting
from crawler.web.urls import host_url_of

# States of a host's robots.txt, as RobotsRules.state() reports them.
UNKNOWN = "unknown"   # never fetched, or stale: the master should fetch it
PENDING = "pending"   # a fetch is out
KNOWN = "known"       # rules are in force

# Past this many bytes a robots.txt is cut (RFC 9309, 2.5: parse at least 500 KiB). The one definition: the
# master's fetch reads no further.
ROBOTS_MAX_BYTES = 500 * 1024
# Allow/Disallow rules kept from one file for our agent (crawler/robots.py owns the figure and the reason).
ROBOTS_MAX_RULES = robots.MAX_RULES

# Answers that mean "too many requests, slow down" (RFC 6585 4; RFC 9110 15.6.4): they pause the whole host.
THROTTLE_STATUSES = frozenset({429, 503})

# Starts are kept on a schedule: a start the master makes a little late (its event loop wakes on a millisecond
# timer, a report is read a moment late) is booked at the time it was due, by up to this share of the delay and
# never more than SLACK_CAP seconds, so the next start is not pushed back by the same lateness. That lateness is
# then not lost from the rate (at a 10 ms delay one millisecond a start would cost 10%), two starts are never
# closer than the delay less min(SLACK_SHARE x delay, SLACK_CAP), and over any run of starts the average
# spacing is never below the delay.
SLACK_SHARE = 0.1
SLACK_CAP = 0.002


@dataclass(frozen=True)
class PolitenessConfig:
    """Politeness settings; each one can be switched off for sites the user owns.

    max_per_host None lifts the concurrency limit, min_delay 0 the spacing, obey_robots False the robots.txt
    rules, crawl_delay_cap 0 the Crawl-delay.
    """

    # What a user sets (the master's politeness section, whose YAML keys these fields carry):
    max_per_host: int | None = setting("int", None, positive)   # requests in flight to one host, over all workers
    # Seconds between request starts to one host, over all workers.
    min_delay: float = setting("float", 0.0, non_negative)
    obey_robots: bool = setting("bool", True)
    # A robots.txt Crawl-delay is honoured up to this many seconds.
    crawl_delay_cap: float = setting("float", 10.0, non_negative)
    # Its product token (the leading letters, '-' and '_': "audio-crawler") names us in robots.txt groups.
    user_agent: str = setting("str", "audio-crawler/0.1")
    adaptive: bool = setting("bool", False)       # the delay follows the host's response latency (AutoThrottle)
    max_delay: float = setting("float", 60.0, non_negative)       # the adaptive delay stays at or below this
    # adaptive: requests the host should be serving at once, on average
    target_concurrency: float = setting("float", 1.0, positive)
    # The first pause after a 429/503 without a longer Retry-After.
    backoff_base: float = setting("float", 1.0, non_negative)
    backoff_max: float = setting("float", 300.0, non_negative)    # repeated 429/503 pauses double up to this
    retry_after_cap: float = setting("float", 3600.0, non_negative)   # a Retry-After is honoured up to this
    # The core's own tuning, no config key:
    robots_ttl: float = 86400.0         # how long fetched rules stay in force
    robots_retry_after: float = 600.0   # after a 5xx or network error: disallow all, then refetch this soon
    robots_fetch_timeout: float = 300.0  # a fetch marked pending that never reports is given up after this
    host_idle_ttl: float = 3600.0       # a host with nothing in flight is forgotten after this long idle
    robots_max_hosts: int = 10_000      # robots.txt rules kept, least recently used out (refetched if needed)
    robots_max_rules: int = 100_000     # rules kept over all those hosts, the same way

    def __post_init__(self) -> None:
        if self.max_per_host is not None and self.max_per_host < 1:
            raise ValueError(f"max_per_host must be >= 1 or None, got {self.max_per_host}")
        for name in ("min_delay", "crawl_delay_cap", "max_delay", "backoff_base", "backoff_max",
                     "retry_after_cap"):
            v = getattr(self, name)
            if not v >= 0 or math.isinf(v):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        for name in ("robots_ttl", "robots_retry_after", "robots_fetch_timeout", "host_idle_ttl",
                     "target_concurrency"):
            v = getattr(self, name)
            if not v > 0 or math.isinf(v):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if self.robots_max_hosts < 1 or self.robots_max_rules < 1:
            raise ValueError("robots_max_hosts and robots_max_rules must be >= 1")
        if self.max_delay < self.min_delay:
            raise ValueError(f"max_delay ({self.max_delay}) must not be below min_delay ({self.min_delay})")
        if self.backoff_max < self.backoff_base:
            raise ValueError(f"backoff_max ({self.backoff_max}) must not be below backoff_base "
                             f"({self.backoff_base})")
        if not self.user_agent.strip():
            raise ValueError("user_agent must not be empty")


@dataclass(frozen=True, slots=True)
class HostLimits:
    """A host's own concurrency limit and spacing, where a site's policy (crawler/sites.py) sets them: they take
    the place of PolitenessConfig.max_per_host and min_delay for that host. A Crawl-delay, the adaptive delay and
    the 429/503 backoff apply on top, as for any host."""

    max_per_host: int | None
    min_delay: float


# A host's limits, by the gate's host key (an origin, scheme://host[:port]); None: the crawl's. Called once per
# host the gate starts keeping, not per request.
LimitsOf = Callable[[str], HostLimits | None]


class _HostState:
    __slots__ = ("adaptive_delay", "crawl_delay", "in_flight", "last_start", "max_per_host", "min_delay",
                 "paused_until", "throttled_at", "throttles", "touched")

    def __init__(self, now: float, limits: HostLimits) -> None:
        self.max_per_host = limits.max_per_host
        self.min_delay = limits.min_delay
        self.in_flight = 0
        self.last_start = -math.inf             # when the latest start was due (see SLACK_SHARE)
        self.crawl_delay: float | None = None   # already capped
        self.adaptive_delay: float | None = None
        self.paused_until = -math.inf           # a 429/503 stops every start until then
        self.throttled_at = -math.inf           # when the latest 429/503 came back
        self.throttles = 0                      # 429/503 in a row, each to a request started after the last
        self.touched = now


class HostGate:
    """Per-host concurrency limit and minimum spacing of request starts, across all workers.

    Hosts are kept in order of last use; idle ones are dropped as ``now`` moves on, so memory follows the
    hosts in use, not every host ever seen. A host with a Crawl-delay is kept robots_ttl after its last use
    instead of host_idle_ttl, the lifetime of the robots.txt it came from, so forgetting it does not shorten
    its spacing while those rules are in force.

    limits_of gives a host's own limits (a site's policy); it is asked when the gate starts keeping a host, and
    the answer stays with the host's state, so the per-request path costs no lookup. longest_delay: the largest
    min_delay limits_of can answer, so no host is forgotten before its spacing has passed.
    """

    def __init__(self, cfg: PolitenessConfig, limits_of: LimitsOf | None = None, longest_delay: float = 0.0) -> None:
        self.cfg = cfg
        self._crawl_limits = HostLimits(cfg.max_per_host, cfg.min_delay)
        self._limits_of = limits_of
        self._longest = max(cfg.crawl_delay_cap, cfg.min_delay, longest_delay)
        # Whether any host can have a concurrency limit: what the master's slot hand-over looks at.
        self.limited = cfg.max_per_host is not None or limits_of is not None
        self._hosts: OrderedDict[str, _HostState] = OrderedDict()
        self._delayed: OrderedDict[str, _HostState] = OrderedDict()   # idle hosts kept for their Crawl-delay
        self._clock = -math.inf   # the latest `now` seen, for set_crawl_delay, which is not given one

    def __len__(self) -> int:
        return len(self._hosts) + len(self._delayed)

    def limits(self, host: str) -> HostLimits:
        """host's concurrency limit and min_delay: its site's where a site sets them, else the crawl's."""
        st = self._peek(host)
        if st is not None:
            return HostLimits(st.max_per_host, st.min_delay)
        return self._limits_for(host)

    def delay(self, host: str) -> float:
        """The spacing in force for host: max(min_delay, its capped Crawl-delay, its adaptive delay)."""
        st = self._peek(host)
        return self._limits_for(host).min_delay if st is None else self._delay_of(st)

    def max_per_host(self, host: str) -> int | None:
        st = self._peek(host)
        return self._limits_for(host).max_per_host if st is None else st.max_per_host

    def paused_until(self, host: str) -> float:
        """Until when a 429/503 stops every start to host (-inf: not paused)."""
        st = self._peek(host)
        return st.paused_until if st is not None else -math.inf

    def in_flight(self, host: str) -> int:
        st = self._peek(host)
        return st.in_flight if st is not None else 0

    def try_acquire(self, host: str, now: float) -> bool:
        """True if a request to host may start now; it then counts as in flight until release()."""
        self._expire(now)
        st = self._touch(host, now)
        limit = st.max_per_host
        if limit is not None and st.in_flight >= limit:
            return False
        delay = self._delay_of(st)
        due = max(_earliest(st.last_start, delay), st.paused_until)
        if now < due:
            return False
        st.in_flight += 1
        st.last_start = now if due == -math.inf else max(due, now - min(delay * SLACK_SHARE, SLACK_CAP))
        return True

    def release(self, host: str, now: float) -> None:
        """The request ended, successfully or not."""
        st = self._peek(host)
        if st is None or st.in_flight == 0:
            raise RuntimeError(f"release({host!r}) without a matching try_acquire")
        st.in_flight -= 1
        self._touch(host, now)
        self._expire(now)

    def ready_at(self, host: str, now: float) -> float:
        """The earliest time try_acquire(host) could succeed: now if it would now, inf until a release."""
        st = self._peek(host)
        if st is None:
            return now
        limit = st.max_per_host
        if limit is not None and st.in_flight >= limit:
            return math.inf
        return max(now, _earliest(st.last_start, self._delay_of(st)), st.paused_until)

    def throttled(self, host: str, started: float, now: float, retry_after: float | None = None) -> float:
        """The host answered 429 or 503 to a request that started at `started`: pause every start to it.

        The pause is the longer of the Retry-After (capped at retry_after_cap) and an exponential step,
        backoff_base doubled for each 429/503 in a row up to backoff_max. Answers to requests that were
        already out when the previous one came back belong to the same burst: they may lengthen the pause to
        their own Retry-After but do not double the step. Returns when the pause ends.
        """
        self._expire(now)
        st = self._touch(host, now)
        cfg = self.cfg
        if started >= st.throttled_at or st.throttles == 0:
            st.throttles += 1
        st.throttled_at = now
        step = min(cfg.backoff_base * 2.0 ** min(st.throttles - 1, 64), cfg.backoff_max)
        wait = step
        if retry_after is not None and retry_after > 0:   # also drops NaN
            wait = max(wait, min(retry_after, cfg.retry_after_cap))
        st.paused_until = max(st.paused_until, now + wait)
        st.touched = max(st.touched, st.paused_until)   # not forgotten while paused
        return st.paused_until

    def responded(self, host: str, started: float, now: float, latency: float | None,
                  ok: bool = True) -> None:
        """A request that started at `started` got an answer other than 429/503 after `latency` seconds.

        An answer to a request sent after the latest 429/503 ends the run of them (the next one starts the
        backoff from backoff_base again). With adaptive on, the latency moves the host's delay the way
        Scrapy's AutoThrottle does: towards latency / target_concurrency, averaged with the delay in force,
        never below that target, clamped to [min_delay, max_delay]; an error answer (ok False) may raise the
        delay but not lower it, as errors are often fast. The Crawl-delay still applies on top (delay()).
        """
        st = self._peek(host)
        if st is None:
            return
        if started >= st.throttled_at:
            st.throttles = 0
        cfg = self.cfg
        if not cfg.adaptive or latency is None or not latency >= 0 or math.isinf(latency):
            return
        current = st.adaptive_delay if st.adaptive_delay is not None else st.min_delay
        target = latency / cfg.target_concurrency
        new = max(target, (current + target) / 2.0)
        new = min(max(st.min_delay, new), max(cfg.max_delay, st.min_delay))
        if not ok and new < current:
            return
        st.adaptive_delay = new

    def set_crawl_delay(self, host: str, delay: float | None) -> None:
        """Apply a robots.txt Crawl-delay (None removes it); it is capped at crawl_delay_cap."""
        if delay is not None and not delay > 0:   # also drops NaN
            delay = None
        st = self._peek(host)
        if st is None:
            if delay is None:
                return
            st = self._hosts[host] = _HostState(self._clock, self._limits_for(host))
        st.crawl_delay = None if delay is None else min(delay, self.cfg.crawl_delay_cap)

    def _limits_for(self, host: str) -> HostLimits:
        if self._limits_of is None:
            return self._crawl_limits
        own = self._limits_of(host)
        return self._crawl_limits if own is None else own

    def _delay_of(self, st: _HostState) -> float:
        d = st.min_delay
        if st.crawl_delay is not None and st.crawl_delay > d:
            d = st.crawl_delay
        if st.adaptive_delay is not None and st.adaptive_delay > d:
            d = st.adaptive_delay
        return d

    def _peek(self, host: str) -> _HostState | None:
        st = self._hosts.get(host)
        return st if st is not None else self._delayed.get(host)

    def _touch(self, host: str, now: float) -> _HostState:
        st = self._hosts.get(host)
        if st is None:
            st = self._delayed.pop(host, None) or _HostState(now, self._limits_for(host))
            self._hosts[host] = st
        else:
            self._hosts.move_to_end(host)
        st.touched = max(st.touched, now)
        return st

    def _expire(self, now: float) -> None:
        # Both dicts are in order of last touch, so expired hosts sit at the front: each is removed once
        # (amortised O(1) a call). A host still in flight is moved to the back: it is in use. No host is
        # forgotten before the longest spacing any Crawl-delay could ask for has passed since its last start,
        # so a delay learnt later (a refetched robots.txt) finds nothing it should have remembered.
        self._clock = max(self._clock, now)
        longest = self._longest
        hosts = self._hosts
        # At most 8 hosts in use are moved back per call, and none twice (a crawl of one site has one host).
        idle_ttl, skips = max(self.cfg.host_idle_ttl, longest), min(8, len(hosts))
        while hosts:
            host, st = next(iter(hosts.items()))
            if st.in_flight or st.touched == -math.inf:   # the latter: set_crawl_delay before any clock
                if skips == 0:
                    break
                skips -= 1
                st.touched = max(st.touched, now)
                hosts.move_to_end(host)
                continue
            if now < st.touched + idle_ttl:
                break
            del hosts[host]
            if st.crawl_delay is not None:
                self._delayed[host] = st
        delayed, keep = self._delayed, max(self.cfg.robots_ttl, longest)
        while delayed:
            host, st = next(iter(delayed.items()))
            if now < st.touched + keep and len(delayed) <= self.cfg.robots_max_hosts:
                break
            # Past the cap, the longest idle goes first: the robots.txt it came from is likely forgotten too.
            del delayed[host]


def _earliest(last_start: float, delay: float) -> float:
    """The first float t with t - last_start >= delay, the test try_acquire applies.

    The plain sum is rounded: it can land an ulp either side of that, or on last_start itself for a tiny delay.
    """
    t = last_start + delay
    while t - last_start < delay:
        t = math.nextafter(t, math.inf)
    while (earlier := math.nextafter(t, -math.inf)) - last_start >= delay:
        t = earlier
    return t


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (RFC 9110 10.2.3): delay-seconds or an HTTP-date.

    now is the wall-clock time (Unix seconds) the answer came, for a date. None when absent or unreadable;
    a date in the past is 0.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > 64:
        return None
    if value.isascii() and value.isdigit():
        return float(min(int(value), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:   # RFC 9110 dates are GMT; a zone-less one is read as such
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def robots_url(host_url: str) -> str:
    return host_url + "/robots.txt"


class _Robots:
    __slots__ = ("allow_all", "expires", "parser", "pending_until", "rules")

    def __init__(self) -> None:
        self.parser: robots.Robots | None = None
        self.rules = 0                  # what the parsed file costs, counted against robots_max_rules
        self.allow_all = False          # meaningful only when parser is None and expires is set
        self.expires = -math.inf        # rules are in force until then
        self.pending_until = -math.inf


class RobotsRules:
    """robots.txt per host (scheme://host[:port]), with the status semantics of RFC 9309; a file is read as
    Google reads it (crawler/robots.py), for the product token of cfg.user_agent.

    The master asks state(); on "unknown" it marks the host pending, fetches /robots.txt once and calls
    store(). Rules expire after robots_ttl and are refetched; while that fetch is out, the old rules still
    answer allowed().

    Bounded: at most robots_max_hosts hosts and robots_max_rules rules in all; past either, the least
    recently used host is forgotten (its robots.txt is fetched again when its URLs come up).
    """

    def __init__(self, cfg: PolitenessConfig) -> None:
        self.cfg = cfg
        self._hosts: OrderedDict[str, _Robots] = OrderedDict()   # least recently stored or used first
        self._rules = 0

    def __len__(self) -> int:
        return len(self._hosts)

    def state(self, host_url: str, now: float) -> str:
        if not self.cfg.obey_robots:
            return KNOWN
        self._expire(now)
        r = self._hosts.get(host_url)
        if r is None:
            return UNKNOWN
        if now < r.pending_until:
            return PENDING
        return KNOWN if now < r.expires else UNKNOWN

    def mark_pending(self, host_url: str, now: float) -> None:
        r = self._hosts.pop(host_url, None) or _Robots()
        r.pending_until = now + self.cfg.robots_fetch_timeout
        self._hosts[host_url] = r
        self._evict()

    def store(self, host_url: str, status: int | None, body: bytes | None, now: float,
              parsed: ParsedRobots | None = None) -> float | None:
        """Record the outcome of fetching host_url's robots.txt; returns its Crawl-delay for our user agent.

        status is the final HTTP status after redirects, None for a network error. parsed is
        parse_robots(body, cfg.user_agent) when the caller parsed it already (off the event loop). The returned
        delay is the file's own value: HostGate.set_crawl_delay applies the cap.
        """
        r = self._hosts.pop(host_url, None) or _Robots()
        self._hosts[host_url] = r
        r.pending_until = -math.inf
        self._rules -= r.rules
        r.rules = 0
        delay = None
        if status is not None and 200 <= status < 300:
            if parsed is None or parsed.agent != robots.product_token(self.cfg.user_agent):
                parsed = parse_robots(body or b"", self.cfg.user_agent)
            r.parser, r.rules = parsed, len(parsed.rules)
            self._rules += r.rules
            r.expires = now + self.cfg.robots_ttl
            delay = parsed.crawl_delay
        elif status is not None and (300 <= status < 400 or (400 <= status < 500 and status != 429)):
            # RFC 9309 2.3.1.2-3: a redirect chain that did not end in a file, or a 4xx, means "unavailable":
            # crawl freely.
            r.parser, r.allow_all, r.expires = None, True, now + self.cfg.robots_ttl
        else:
            # RFC 9309 2.3.1.4: unreachable (5xx, network error) means complete disallow. 429 is counted here
            # too: the host is asking us to back off, not saying it has no rules.
            r.parser, r.allow_all, r.expires = None, False, now + self.cfg.robots_retry_after
        if delay is not None and not delay >= 0:
            delay = None
        self._evict(keep=host_url)
        return delay

    def sitemaps(self, host_url: str) -> list[str]:
        """The Sitemap: lines of host_url's stored robots.txt (absolute URLs, as RFC 9309 2.2.4 asks), capped
        at robots.MAX_SITEMAPS."""
        r = self._hosts.get(host_url)
        if r is None or r.parser is None:
            return []
        return list(r.parser.sitemaps)

    def allowed(self, url: str) -> bool:
        """Whether url may be fetched by its host's rules; the host must have been stored (state "known")."""
        if not self.cfg.obey_robots:
            return True
        host = host_url_of(url)
        r = self._hosts.get(host)
        if r is None or r.expires == -math.inf:
            raise LookupError(f"robots.txt of {host} has not been stored yet")
        if r.parser is None:
            return r.allow_all
        self._hosts.move_to_end(host)
        return r.parser.allowed(url)

    def _evict(self, keep: str | None = None) -> None:
        hosts, cfg = self._hosts, self.cfg
        while hosts and (len(hosts) > cfg.robots_max_hosts or self._rules > cfg.robots_max_rules):
            host = next(iter(hosts))
            if host == keep:
                break    # the file just stored stays, even alone over the budget (it is capped itself)
            self._rules -= hosts.pop(host).rules

    def _expire(self, now: float) -> None:
        # Stale rules are kept a little past expiry, for the refetch the master should start on seeing
        # "unknown" (they answer allowed() until it reports), then dropped. The dict is in order of last
        # update, so stale entries gather at the front; a short-lived one (after a 5xx) behind a long-lived
        # one waits for it, and state() already reports it as unknown.
        hosts, grace = self._hosts, self.cfg.robots_fetch_timeout
        while hosts:
            host, r = next(iter(hosts.items()))
            if now < r.expires + grace or now < r.pending_until:
                break
            del hosts[host]
            self._rules -= r.rules


ParsedRobots = robots.Robots


def parse_robots(body: bytes, user_agent: str) -> ParsedRobots:
    """A robots.txt body cut to ROBOTS_MAX_BYTES, read as it applies to user_agent's product token.

    Pure and bounded (rules, lines and sitemaps capped in crawler/robots.py; about 0.25 s at worst at the caps):
    the master runs it in a thread.
    """
    if len(body) > ROBOTS_MAX_BYTES:
        # Cut at the last full line: half a "Disallow: /private" line would become a different rule.
        cut = max(body.rfind(b"\n", 0, ROBOTS_MAX_BYTES), body.rfind(b"\r", 0, ROBOTS_MAX_BYTES))
        body = body[:cut + 1] if cut >= 0 else b""
    return robots.parse(body, robots.product_token(user_agent))
