"""The per-site cookie jar (crawler/web/cookies.py): RFC 6265's rules for what is kept and sent, the site's
bounds, and Set-Cookie headers a hostile site writes."""

import calendar

import pytest

from crawler.web.cookies import (
    MAX_COOKIE_BYTES,
    MAX_JAR_BYTES,
    MAX_JAR_COOKIES,
    MAX_SET_COOKIE,
    CookieJar,
    CookieRecord,
    parse_cookie_date,
    set_cookie_values,
)

NOW = 1_800_000_000.0


def jar(pattern="shop.example", *set_cookies, url="http://shop.example/a/b.html", now=NOW):
    j = CookieJar(pattern)
    j.receive(url, list(set_cookies), now)
    return j


def test_a_host_only_cookie_goes_back_to_its_host_only():
    j = jar("*.example.com", "sid=1", url="http://a.example.com/")
    assert j.header("http://a.example.com/x", NOW) == "sid=1"
    assert j.header("http://b.example.com/x", NOW) is None        # the same site, another host: host-only


def test_a_domain_cookie_goes_to_the_sites_hosts_under_its_domain():
    j = jar("*.example.com", "sid=1; Domain=.example.com", url="http://a.example.com/")
    assert j.header("http://b.example.com/", NOW) == "sid=1"
    assert j.header("http://x.y.example.com/", NOW) == "sid=1"
    # Never outside the site, whatever the cookie's domain says.
    assert j.header("http://example.org/", NOW) is None
    assert j.header("http://evil-example.com/", NOW) is None


@pytest.mark.parametrize("value", [
    "sid=1; Domain=other.example",          # another site
    "sid=1; Domain=example",                # a parent of the site's host: would reach other hosts
    "sid=1; Domain=com",                    # a public suffix
    "sid=1; Domain=sub.shop.example",       # a name the answering host is not in
])
def test_a_cookie_whose_domain_is_outside_the_site_is_refused(value):
    j = jar("shop.example", value)
    assert len(j) == 0 and j.refused == 1


def test_a_domain_outside_a_wildcard_sites_pattern_is_refused():
    j = jar("*.example.com", "a=1; Domain=com", "b=1; Domain=other.com", "c=1; Domain=a.example.com",
            url="http://a.example.com/")
    assert [c.name for c in j.cookies(NOW)] == ["c"]


def test_an_answer_from_another_host_is_not_kept_by_the_site():
    j = jar("shop.example", "sid=1", url="http://tracker.example/")
    assert len(j) == 0


def test_path_matching_and_the_default_path():
    j = jar("shop.example", "a=1", "b=2; Path=/", "c=3; Path=/a/deep", url="http://shop.example/a/b.html")
    assert j.header("http://shop.example/a/x", NOW) == "a=1; b=2"      # /a before /, then by age
    # Longer paths first (RFC 6265, 5.4 step 2).
    assert j.header("http://shop.example/a/deep/x", NOW).split("; ")[0] == "c=3"
    assert j.header("http://shop.example/", NOW) == "b=2"            # the default path is /a
    assert j.header("http://shop.example/ab", NOW) == "b=2"          # /a does not match /ab


def test_secure_cookies_go_over_https_only_and_only_a_secure_origin_sets_them():
    j = jar("shop.example", "s=1; Secure", url="https://shop.example/")
    assert j.header("https://shop.example/", NOW) == "s=1"
    assert j.header("http://shop.example/", NOW) is None
    assert len(jar("shop.example", "s=1; Secure", url="http://shop.example/")) == 0


def test_httponly_is_kept_and_does_not_stop_the_cookie_going_back():
    j = jar("shop.example", "h=1; HttpOnly", url="http://shop.example/")
    assert j.cookies(NOW)[0].http_only and j.header("http://shop.example/", NOW) == "h=1"


def test_max_age_and_expires_with_time_passed_in():
    j = jar("shop.example", "a=1; Max-Age=10", "b=2; Expires=Wed, 01 Jan 2031 00:00:00 GMT",
            "c=3; Max-Age=10; Expires=Wed, 01 Jan 2031 00:00:00 GMT", url="http://shop.example/")
    assert {c.name for c in j.cookies(NOW + 9)} == {"a", "b", "c"}     # Max-Age wins over Expires
    assert {c.name for c in j.cookies(NOW + 11)} == {"b"}
    assert j.header("http://shop.example/", calendar.timegm((2031, 1, 1, 0, 0, 1))) is None


def test_an_expiry_in_the_past_deletes_the_cookie():
    j = jar("shop.example", "sid=1", url="http://shop.example/")
    j.receive("http://shop.example/", ["sid=gone; Max-Age=0"], NOW)
    assert len(j) == 0
    j.receive("http://shop.example/", ["sid=1", "sid=2; Expires=Thu, 01 Jan 1970 00:00:00 GMT"], NOW)
    assert len(j) == 0


def test_a_cookie_set_again_replaces_the_old_one_and_keeps_its_age():
    j = jar("shop.example", "a=1", "b=1", url="http://shop.example/")
    j.receive("http://shop.example/", ["a=2"], NOW)
    assert [(c.name, c.value) for c in j.cookies(NOW)] == [("a", "2"), ("b", "1")]


@pytest.mark.parametrize("text,want", [
    ("Wed, 21 Oct 2015 07:28:00 GMT", (2015, 10, 21, 7, 28, 0)),
    ("Wednesday, 21-Oct-15 07:28:00 GMT", (2015, 10, 21, 7, 28, 0)),     # RFC 850, two-digit year
    ("Wed Oct 21 07:28:00 2015", (2015, 10, 21, 7, 28, 0)),              # asctime
    ("21 Oct 99 07:28:00", (1999, 10, 21, 7, 28, 0)),
])
def test_cookie_dates_in_the_forms_servers_write(text, want):
    assert parse_cookie_date(text) == calendar.timegm((*want, 0, 0, 0))


@pytest.mark.parametrize("text", ["", "tomorrow", "Wed, 32 Oct 2015 07:28:00 GMT", "Wed, 21 Foo 2015 07:28:00",
                                  "Wed, 21 Oct 2015 25:28:00 GMT", "Wed, 21 Oct 1500 07:28:00 GMT",
                                  "9" * 5000, "Wed, 21 Oct 99999999999999 07:28:00 GMT"])
def test_bad_dates_are_ignored_and_the_cookie_lasts_the_session(text):
    assert parse_cookie_date(text) is None
    j = jar("shop.example", f"sid=1; Expires={text}", url="http://shop.example/")
    assert j.cookies(NOW)[0].expires is None


def test_expiry_is_capped_at_400_days():
    j = jar("shop.example", "a=1; Max-Age=999999999999", "b=1; Expires=Fri, 01 Jan 9999 00:00:00 GMT",
            url="http://shop.example/")
    assert all(c.expires is not None and c.expires <= NOW + 400 * 86400 for c in j.cookies(NOW))


@pytest.mark.parametrize("value", [
    "x" * (MAX_SET_COOKIE + 1),                         # refused unread
    "big=" + "v" * MAX_COOKIE_BYTES,                    # name and value past the cookie's bound
    "noequals",
    "=value",
    "bad\x00name=1",
    "a=b\x7fc",
])
def test_hostile_set_cookie_values_are_refused(value):
    j = jar("shop.example", value, url="http://shop.example/")
    assert len(j) == 0 and j.refused == 1


def test_many_cookies_drop_the_oldest_first():
    j = jar("shop.example", *(f"c{i}=1" for i in range(40)), url="http://shop.example/")
    j.receive("http://shop.example/", [f"d{i}=1" for i in range(40)], NOW)
    names = [c.name for c in j.cookies(NOW)]
    assert len(names) <= MAX_JAR_COOKIES and names[-1] == "d39" and "c0" not in names


def test_big_cookies_keep_the_jar_and_its_header_under_the_byte_bound():
    j = CookieJar("shop.example")
    for i in range(10):
        j.receive("http://shop.example/", [f"c{i}=" + "v" * 3000], NOW)
    header = j.header("http://shop.example/", NOW)
    assert header is not None and len(header) <= MAX_JAR_BYTES
    assert header.endswith("v" * 10) and "c9=" in header and "c0=" not in header    # the newest kept


def test_one_answer_with_thousands_of_set_cookies_costs_bounded_work():
    j = jar("shop.example", *(f"c{i}=1" for i in range(5000)), url="http://shop.example/")
    assert len(j) <= MAX_JAR_COOKIES


def test_the_jar_starts_from_the_cookies_files_records_within_the_site():
    j = CookieJar("*.example.com")
    j.load([CookieRecord("example.com", True, "/", False, 0, "sid", "1"),
            CookieRecord("a.example.com", False, "/", False, int(NOW) + 60, "host", "2"),
            CookieRecord("other.com", True, "/", False, 0, "leak", "3"),                 # another site: refused
            CookieRecord("a.example.com", False, "/", False, int(NOW) - 60, "old", "4")],  # expired already
           NOW)
    assert j.header("http://a.example.com/", NOW) == "sid=1; host=2"
    assert j.header("http://b.example.com/", NOW) == "sid=1"
    assert j.header("http://a.example.com/", NOW + 61) == "sid=1"
    assert j.refused == 1


def test_a_host_port_site_keeps_its_cookies_for_its_host():
    j = jar("127.0.0.1:8080", "sid=1", url="http://127.0.0.1:8080/login")
    assert j.header("http://127.0.0.1:8080/x", NOW) == "sid=1"
    assert len(jar("127.0.0.1:8080", "sid=1; Domain=0.0.1", url="http://127.0.0.1:8080/")) == 0


def test_set_cookie_values_are_read_one_by_one_from_raw_headers():
    raw = [(b"Set-Cookie", b"a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT"), (b"content-type", b"text/html"),
           (b"set-cookie", b"b=2")]
    assert set_cookie_values(raw) == ["a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT", "b=2"]
