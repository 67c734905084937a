"""The sites: table: parsing (one ConfigError line naming the key), lookup precedence, the wire, the Welcome's size
and the per-site depth limits."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crawler import protocol as p
from crawler.config import ConfigError
from crawler.master.config import MasterConfig
from crawler.sites import (
    LOOKUPS_KEPT,
    DepthLimits,
    SitePolicy,
    SiteTable,
    check_welcome_fits,
    from_wire,
    gate_limits,
    parse_sites,
    to_wire,
)
from testkit.cluster import write_secret


def base(tmp: Path) -> dict:
    return {"listen": "127.0.0.1:7700", "data_dir": "data", "secret_file": str(write_secret(tmp / "secret")),
            "nodes": ["a"], "seeds": ["http://127.0.0.1:8000/"]}


@pytest.mark.parametrize(("sites", "key", "words"), [
    ([], "sites", "expected a mapping"),
    ({"a.example": {"politeness": {"min_delay": -1}}}, "sites.a.example.politeness.min_delay", "negative"),
    ({"a.example": {"politeness": {"min_delay": "soon"}}}, "sites.a.example.politeness.min_delay", "a number"),
    ({"a.example": {"politeness": {"max_per_host": 0}}}, "sites.a.example.politeness.max_per_host",
     "greater than 0"),
    ({"a.example": {"politeness": {"max_per_host": 1.5}}}, "sites.a.example.politeness.max_per_host",
     "an integer"),
    ({"a.example": {"politeness": {"audio_max_per_host": True}}},
     "sites.a.example.politeness.audio_max_per_host", "an integer"),
    ({"a.example": {"politeness": {"audio_min_delay": float("inf")}}},
     "sites.a.example.politeness.audio_min_delay", "a number"),
    ({"a.example": {"politeness": {"delay": 1}}}, "sites.a.example.politeness.delay", "unknown key"),
    ({"a.example": {"speed": 1}}, "sites.a.example.speed", "unknown key"),
    ({"a.example:http": {}}, "sites.a.example:http", "port must be a number"),
    ({"*.a.example:80": {}}, "sites.*.a.example:80", "takes no port"),
    ({"a.*.example": {}}, "sites.a.*.example", "host, host:port or *.domain"),
    ({"A.example": {}, "a.example": {}}, "sites.a.example", "the same site"),
    ({"a.example": {"user_agent": "two\nlines"}}, "sites.a.example.user_agent", "one-line"),
    ({"a.example": {"headers": {"Host": "b"}}}, "sites.a.example.headers.Host", "sets this header itself"),
    ({"a.example": {"headers": {"User-Agent": "b"}}}, "sites.a.example.headers.User-Agent", "use user_agent"),
    ({"a.example": {"headers": {"X Bad": "b"}}}, "sites.a.example.headers.X Bad", "not a header name"),
    ({"a.example": {"max_depth": -1}}, "sites.a.example.max_depth", "negative"),
])
def test_a_bad_site_is_one_line_naming_its_key(tmp_path, sites, key, words):
    raw = base(tmp_path) | {"sites": sites}
    with pytest.raises(ConfigError) as e:
        MasterConfig.from_mapping(raw, tmp_path)
    assert e.value.key == key, str(e.value)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_site_stops_the_master_with_exit_2_and_one_line(tmp_path):
    raw = base(tmp_path) | {"sites": {"a.example": {"politeness": {"max_per_host": 0}}}}
    cfg = tmp_path / "master.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    done = subprocess.run([sys.executable, "-m", "crawler.master", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "sites.a.example.politeness.max_per_host" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def table(raw: dict) -> SiteTable:
    return parse_sites("sites", raw, Path("."))


def test_lookup_takes_host_port_then_host_then_the_longest_domain():
    t = table({"a.example:8080": {"user_agent": "port"}, "a.example": {"user_agent": "host"},
               "*.example": {"user_agent": "wide"}, "*.b.example": {"user_agent": "narrow"}})

    def ua(host, port=80):
        pol = t.lookup(host, port)
        return pol.user_agent if pol else None

    assert ua("a.example", 8080) == "port"
    assert ua("a.example", 80) == "host"
    assert ua("a.example", None) == "host"
    assert ua("x.b.example") == "narrow"         # overlapping patterns: the longest domain wins
    assert ua("y.x.b.example") == "narrow"
    assert ua("b.example") == "wide"            # *.b.example covers subdomains only, not b.example itself
    assert ua("example") is None
    assert ua("other.test") is None
    assert t.lookup_url("http://a.example:8080/x").user_agent == "port"
    assert t.lookup_url("https://a.example/x").user_agent == "host"
    assert t.lookup_url("http://[::1/") is None


def test_an_empty_table_looks_up_nothing():
    t = table({})
    assert not t and t.lookup("a.example", 80) is None and t.lookup_url("http://x/") is None
    assert not parse_sites("sites", None, Path("."))


def test_wire_round_trip_keeps_what_workers_need():
    t = table({"a.example": {"user_agent": "ua/1", "headers": {"X-Key": "v", "Accept-Language": "fi"},
                             "max_depth": 7, "politeness": {"min_delay": 2}},
               "*.b.example": {"proxies": []}})
    wire = to_wire(t)
    back = from_wire(wire)
    a = back.lookup("a.example", 80)
    assert a is not None and a.user_agent == "ua/1" and a.headers == (("X-Key", "v"), ("Accept-Language", "fi"))
    assert a.max_depth == 7
    assert a.politeness.min_delay is None        # politeness stays at the master
    b = back.lookup("x.b.example", 443)
    assert b is not None and b.proxies == ()
    # And through a real Welcome frame.
    w = p.Welcome(bytes(p.MAC_SIZE), 1.0, sites=wire)
    frame = p.encode(w, max_frame=p.HANDSHAKE_MAX_FRAME)
    decoded = p.decode_payload(frame[p.HEADER_SIZE:])
    assert isinstance(decoded, p.Welcome)
    assert from_wire(decoded.sites).lookup("a.example", 80).headers == a.headers


def test_a_sites_table_whose_welcome_does_not_fit_is_refused_at_load(tmp_path):
    big = "v" * 4000
    sites = {f"h{i}.example": {"headers": {f"X-H{j}": big for j in range(32)}} for i in range(40)}
    with pytest.raises(ConfigError) as e:
        MasterConfig.from_mapping(base(tmp_path) | {"sites": sites}, tmp_path)
    assert e.value.key == "sites" and "Welcome" in str(e.value) and "\n" not in str(e.value)
    # A table that fits is taken, and its Welcome is readable before the master's proof.
    ok = {f"h{i}.example": {"headers": {"X-H": big}} for i in range(40)}
    cfg = MasterConfig.from_mapping(base(tmp_path) | {"sites": ok}, tmp_path)
    check_welcome_fits("sites", cfg.sites)
    frame = p.encode(p.Welcome(bytes(p.MAC_SIZE), 1.0, sites=to_wire(cfg.sites)), max_frame=p.HANDSHAKE_MAX_FRAME)
    assert len(frame) < p.HANDSHAKE_MAX_FRAME


def test_depth_limits_per_site():
    t = table({"deep.example": {"max_depth": 8}, "shallow.example": {"max_depth": 1}, "plain.example": {}})
    d = DepthLimits(5, t)
    assert (d.floor, d.ceiling) == (1, 8)
    assert d.limit("http://deep.example/x") == 8
    assert d.limit("http://shallow.example/x") == 1
    assert d.limit("http://plain.example/x") == 5        # a site without max_depth keeps the crawl's
    assert d.limit("http://other.example/x") == 5
    assert d.allows("http://deep.example/x", 8) and not d.allows("http://deep.example/x", 9)
    assert d.allows("http://shallow.example/x", 1) and not d.allows("http://shallow.example/x", 2)
    assert d.allows("http://other.example/x", 5) and not d.allows("http://other.example/x", 6)
    assert d.allows("http://shallow.example/x", 3, extra=2)     # an audio reference's hops past the limit
    # No site sets a depth: the crawl's limit alone, no lookups.
    plain = DepthLimits(5, table({"a.example": {"user_agent": "x"}}))
    assert not plain.per_site and (plain.floor, plain.ceiling) == (5, 5) and plain.limit("http://a.example/") == 5
    # The remembered answers stay bounded.
    for i in range(LOOKUPS_KEPT + 50):
        d.limit(f"http://h{i}.example/")
    assert len(d.table._answers) <= LOOKUPS_KEPT


def test_gate_limits_only_where_a_site_sets_politeness():
    t = table({"a.example": {"politeness": {"min_delay": 0.5}},
               "b.example:8080": {"politeness": {"max_per_host": 1, "audio_min_delay": 2.0}},
               "c.example": {"user_agent": "x"}})
    pages, longest = gate_limits(t, audio=False, max_per_host=4, min_delay=0.1)
    assert pages is not None and longest == 0.5
    a = pages("http://a.example")
    assert a is not None and (a.max_per_host, a.min_delay) == (4, 0.5)     # the crawl's max_per_host kept
    b = pages("http://b.example:8080")
    assert b is not None and (b.max_per_host, b.min_delay) == (1, 0.1)
    assert pages("http://b.example") is None                               # another port: not that site
    assert pages("http://c.example") is None                               # no politeness of its own
    audio, longest = gate_limits(t, audio=True, max_per_host=None, min_delay=0.0)
    assert audio is not None and longest == 2.0
    ab = audio("http://b.example:8080")
    assert ab is not None and (ab.max_per_host, ab.min_delay) == (None, 2.0)
    assert audio("http://a.example") is None
    assert gate_limits(table({"c.example": {"user_agent": "x"}}), audio=False, max_per_host=None,
                       min_delay=0) == (None, 0.0)


def test_site_policy_defaults():
    pol = SitePolicy("a.example")
    assert pol.user_agent is None and pol.headers == () and not pol.has_session
