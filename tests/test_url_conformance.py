"""The WHATWG URL standard's own tests (web-platform-tests' urltestdata.json, tests/data/README) as the judge
of how links resolve, with Python's two usual joins (urllib.parse.urljoin, yarl) as anchors.

A case counts for http(s) when the browser's answer is an http(s) URL, or a failure for input that names
http(s) or is relative to an http(s) base. A join passes a case when it would fetch what a browser fetches: the same
request (scheme, host and port, path and query: user info and fragment are never part of it) or, where the
standard fails, nothing. The crawler's answer is what it queues: normalize(resolve_link(base, input)), or
normalize(input) without a base (a seed).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urljoin

import pytest
import yarl

from crawler.politeness import HostGate, PolitenessConfig, RobotsRules
from crawler.web.urls import InvalidURL, host_url_of, link_joiner, normalize, resolve, resolve_link

_DATA = Path(__file__).parent / "data" / "urltestdata.json"
_CASES: list[dict[str, str | bool | None]] = [
    c for c in json.loads(_DATA.read_text("utf-8")) if isinstance(c, dict)]
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _scheme(text: str) -> str | None:
    head = text.lstrip("".join(map(chr, range(0x21))))
    colon = head.find(":")
    if colon <= 0 or not head[0].isalpha() or not all(ch.isalnum() or ch in "+-." for ch in head[:colon]):
        return None
    return head[:colon].lower()


def _is_web_case(case: dict[str, str | bool | None]) -> bool:
    if case.get("failure"):
        scheme, base = _scheme(str(case["input"])), str(case.get("base") or "")
        return scheme in _DEFAULT_PORTS or (scheme is None and base.startswith(("http:", "https:")))
    return str(case["href"]).startswith(("http:", "https:"))


WEB_CASES = [c for c in _CASES if _is_web_case(c)]


def _request(url: str | None) -> tuple[str, str, int | None, str] | None:
    """What fetching ``url`` asks for: scheme, host, port (as an HTTP client, yarl like the worker's, reads
    them: case-blind, as DNS and the Host header are) and the request target as written; None when the client
    refuses the URL."""
    if url is None:
        return None
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError, UnicodeError):
        return None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.raw_host:
        return None
    rest = url.partition("://")[2]
    end = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    target = rest[end:].partition("#")[0]
    return (parsed.scheme, parsed.raw_host.lower(), parsed.port,
            target if target.startswith("/") else "/" + target)


def _browser(case: dict[str, str | bool | None]) -> tuple[str, str, int | None, str] | None:
    return None if case.get("failure") else _request(str(case["href"]))


def _ours(case: dict[str, str | bool | None]) -> str | None:
    ref, base = str(case["input"]), case.get("base")
    try:
        if base is None:
            return normalize(ref)
        url = resolve_link(str(base), ref)
        return None if url is None else normalize(url)
    except InvalidURL:
        return None


def _urljoin(case: dict[str, str | bool | None]) -> str | None:
    ref, base = str(case["input"]), case.get("base")
    try:
        return ref if base is None else urljoin(str(base), ref)
    except ValueError:
        return None


def _yarl(case: dict[str, str | bool | None]) -> str | None:
    ref, base = str(case["input"]), case.get("base")
    try:
        return str(yarl.URL(ref) if base is None else yarl.URL(str(base)).join(yarl.URL(ref)))
    except (ValueError, TypeError, UnicodeError):
        return None


# Where the crawler deliberately fetches something else than a browser, by (input, base).
_SAME_PAGE = "a reference to the page itself (or a fragment of it) is not a link: the page is fetched already"
_EMPTY_QUERY = "an empty query is dropped from keys: 'page?' and 'page' are one resource to a crawl"
_ESCAPES = ("percent-encoding made canonical (RFC 3986 6.2.2): escapes of unreserved characters decoded, hex "
            "upper case, a '%' that starts no escape and characters RFC 3986 does not allow raw ([ ] ` { } |) "
            "escaped")
_DOTS = "a domain's trailing dots are dropped (one host to DNS, so one key and one politeness slot)"
_DOTS_ONLY = "a host made only of dots has no name left once its trailing dots go: refused"
DIFFERENCES: dict[tuple[str, str | None], str] = {
    ("", "http://example.org/foo/bar"): _SAME_PAGE,
    ("  \t", "http://example.org/foo/bar"): _SAME_PAGE,
    ("#", "http://example.org/foo/bar"): _SAME_PAGE,
    ("#/", "http://example.org/foo/bar"): _SAME_PAGE,
    ("#\\", "http://example.org/foo/bar"): _SAME_PAGE,
    ("#;?", "http://example.org/foo/bar"): _SAME_PAGE,
    ("#β", "http://example.org/foo/bar"): _SAME_PAGE,
    ("http:", "http://example.org/foo/bar"): _SAME_PAGE,
    ("", "http://user:pass@example.org:21/smth"): _SAME_PAGE,
    ("#link", "https://example.org/##link"): _SAME_PAGE,
    ("?", "http://example.org/foo/bar"): _EMPTY_QUERY,
    ("http://example.org/test?#", None): _EMPTY_QUERY,
    ("https://x/?#\x00y", None): _EMPTY_QUERY,
    ("https://x/?#\uffffy", None): _EMPTY_QUERY,
    ("[61:24:74]:98", "http://example.org/foo/bar"): _ESCAPES,
    ("http:[61:27]/:foo", "http://example.org/foo/bar"): _ESCAPES,
    ("/a%2fc", "http://example.org/foo/bar"): _ESCAPES,
    ("/a/%2f/c", "http://example.org/foo/bar"): _ESCAPES,
    ("http://example.com/foo/%2e%2", None): _ESCAPES,
    ("http://example.com/foo/%2e./%2e%2e/.%2e/%2e.bar", None): _ESCAPES,
    ("http://example.com/foo%", None): _ESCAPES,
    ("http://example.com/foo%2", None): _ESCAPES,
    ("http://example.com/foo%2zbar", None): _ESCAPES,
    ("http://example.com/foo%2Â©zbar", None): _ESCAPES,
    ("http://example.com/foo%41%7a", None): _ESCAPES,
    ("http://example.com/foo%00%51", None): _ESCAPES,
    ("http://example.com/%3A%3a%3C%3c", None): _ESCAPES,
    ("http://www/foo%2Ehtml", None): _ESCAPES,
    ("http://`{}:`{}@h/`{}?`{}", "http://doesnotmatter/"): _ESCAPES,
    ("http://example.org/test?%GH", None): _ESCAPES,
    ("http://foo.09..", None): _DOTS,
    ("http://./", None): _DOTS_ONLY,
    ("http://../", None): _DOTS_ONLY,
}


def _passes(join: object) -> list[bool]:
    assert callable(join)
    return [_request(join(case)) == _browser(case) for case in WEB_CASES]


def test_links_resolve_as_browsers_resolve_them() -> None:
    assert len(WEB_CASES) == 432
    ours, joined, yarls = _passes(_ours), _passes(_urljoin), _passes(_yarl)
    print(f"\nWHATWG URL tests, {len(WEB_CASES)} http(s) cases fetched as a browser would: "
          f"crawler {sum(ours)}, urllib.parse.urljoin {sum(joined)}, yarl {sum(yarls)}")
    assert sum(ours) >= max(sum(joined), sum(yarls))
    failures = {(str(c["input"]), c.get("base")) for c, ok in zip(WEB_CASES, ours, strict=True) if not ok}
    assert failures == set(DIFFERENCES)


def test_every_join_gives_one_answer() -> None:
    """resolve_link (cached by directory, or joined to the origin) says what resolve says, for any page of the
    base's directory; a redirect's Location goes through resolve too."""
    for case in WEB_CASES:
        base, ref = case.get("base"), str(case["input"])
        if base is None or not str(base).startswith(("http:", "https:")):
            continue
        for page in (str(base), str(base).split("#")[0].rsplit("/", 1)[0] + "/sibling?x=1"):
            try:
                expected: str | None = resolve(page, ref)
            except InvalidURL:
                expected = None
            got = resolve_link(page, ref)
            if got is None:
                # only what is not followed: failures, other schemes, this page itself
                assert expected is None or not expected.startswith(("http:", "https:")) or (
                    expected.split("#")[0] == resolve(page, "").split("#")[0])
            else:
                assert got == expected, (page, ref)


def test_a_pages_joiner_answers_as_resolve_link() -> None:
    """link_joiner(page) is resolve_link(page, ...) for every reference, asked once and again (remembered)."""
    extra = ["/a b", "/\tx", " /x", "/x ", "/%2e/x", "/./x", "/../x", "//other.example/x", "/x#f", "/x?q=1", "/",
             "/x\\y", "/caf\u00e9", "/x:y@z", "?q", "#f", "", "x/y", "javascript:x", "http:/x", "/x/."]
    pages = []
    for case in WEB_CASES:
        base = case.get("base")
        if base is not None:
            pages += [str(base), str(base).split("#")[0].rsplit("/", 1)[0] + "/sibling?x=1"]
    refs = [str(case["input"]) for case in WEB_CASES] + extra
    for page in pages[:200] + ["http://h.example/p/q.html", "http://u:p@h.example:81/p", "https://h.example"]:
        join = link_joiner(page)
        for ref in refs:
            for _ in range(2):
                assert join(ref) == resolve_link(page, ref), (page, ref)


# Where the politeness key differs from the WHATWG origin, by input.
KEY_DIFFERENCES = {"http://./": _DOTS_ONLY, "http://../": _DOTS_ONLY}


def test_politeness_key_is_the_origin() -> None:
    cases = [c for c in WEB_CASES if "origin" in c]
    differ = set()
    for case in cases:
        href = str(case["href"])
        try:
            key = host_url_of(normalize(href))     # what the master keys a queued URL by
        except InvalidURL:
            key = None
        if key != case["origin"]:
            differ.add(str(case["input"]))
        else:
            assert host_url_of(href) == key        # and an URL as written (a download's) gets the same key
    print(f"\npoliteness key == WHATWG origin on {len(cases) - len(differ)} of {len(cases)} cases")
    assert differ == set(KEY_DIFFERENCES)


def test_user_info_and_the_roots_dot_share_one_slot_and_one_robots_fetch() -> None:
    cfg = PolitenessConfig(max_per_host=1, min_delay=5.0)
    gate, robots = HostGate(cfg), RobotsRules(cfg)
    urls = ["http://a@victim.example/1", "http://b:pw@victim.example/2", "http://victim.example./3",
            "HTTP://VICTIM.example:80/4"]
    keys = {host_url_of(normalize(u)) for u in urls} | {host_url_of(u) for u in urls}
    assert keys == {"http://victim.example"}
    assert [normalize(u) for u in urls] == [f"http://victim.example/{i}" for i in range(1, 5)]
    key = host_url_of(urls[0])
    assert robots.state(key, 0.0) == "unknown"
    robots.mark_pending(key, 0.0)
    assert all(robots.state(host_url_of(u), 0.0) == "pending" for u in urls)   # one robots.txt fetch for all
    robots.store(key, 200, b"User-agent: *\nDisallow: /2\n", 1.0)
    assert [robots.allowed(normalize(u)) for u in urls] == [True, False, True, True]
    assert gate.try_acquire(host_url_of(urls[0]), 1.0)
    assert not any(gate.try_acquire(host_url_of(u), 1.0) for u in urls)        # one slot
    gate.release(host_url_of(urls[1]), 2.0)
    assert not gate.try_acquire(host_url_of(urls[2]), 3.0)                      # one delay
    assert gate.try_acquire(host_url_of(urls[3]), 7.0)
    assert len(gate) == 1 and len(robots) == 1
