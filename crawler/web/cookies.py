"""Cookies: the records of a Netscape cookies file, and one site's cookie jar.

The master reads a site's ``cookies_file`` (parse_cookie_file) and sends its records to the workers in the
Welcome; each worker's session jar (crawler/worker/sessions.py) starts from them.

``CookieJar`` is pure (no I/O, no clock: ``now`` is passed in, Unix seconds) and belongs to one site of the
``sites:`` table. It follows RFC 6265 for what it keeps and what it sends (Set-Cookie's Domain, Path, Expires and
Max-Age, Secure, HttpOnly; host-only and domain cookies; domain and path matching), with two rules of its own:

- a site's cookies are its own: a cookie whose Domain reaches outside the site's pattern (``host``,
  ``host:port``, ``*.domain``) is refused, and the jar is only ever asked for the Cookie header of that site's
  URLs, so a site's session never goes to another host;
- everything is bounded, since the Set-Cookie headers are the site's to write: a Set-Cookie longer than
  MAX_SET_COOKIE is refused unread, a cookie whose name and value pass MAX_COOKIE_BYTES is refused, and past
  MAX_JAR_COOKIES cookies or MAX_JAR_BYTES bytes in all the oldest are dropped first (so a Cookie header, made of
  the jar's cookies, stays under MAX_JAR_BYTES too). Expiry is capped at MAX_AGE (RFC 6265bis: 400 days).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from crawler.errors import ConfigError

# A cookies file bigger than this, or with more records, is not a session's: refused at load.
MAX_COOKIE_FILE = 1024 * 1024
MAX_COOKIES = 1000

# A jar's bounds (per site, per node): what a browser allows a domain, about.
MAX_SET_COOKIE = 8192          # characters of one Set-Cookie value, attributes included
MAX_COOKIE_BYTES = 4096        # name and value of one cookie (RFC 6265, 6.1)
MAX_JAR_COOKIES = 64
MAX_JAR_BYTES = 8192           # name=value bytes of the whole jar: the largest Cookie header it can make
MAX_AGE = 400 * 86400          # seconds a cookie may live (RFC 6265bis)
# Headers at most considered in one answer (the answer's head is bounded already; this bounds the work).
MAX_SET_COOKIES_PER_ANSWER = 64


class CookieRecord(NamedTuple):
    domain: str              # without the leading dot
    include_subdomains: bool
    path: str
    secure: bool
    expires: int             # Unix seconds; 0: a session cookie
    name: str
    value: str
    http_only: bool = False


def parse_cookie_file(text: str, key: str = "cookies_file") -> tuple[CookieRecord, ...]:
    """The records of a Netscape cookies file: seven tab-separated fields a line (domain, subdomains flag, path,
    secure flag, expiry, name, value); '#' lines are comments, except curl's '#HttpOnly_' prefix."""
    if len(text) > MAX_COOKIE_FILE:
        raise ConfigError(key, f"a cookies file of {len(text)} characters; at most {MAX_COOKIE_FILE}")
    out: list[CookieRecord] = []
    for n, line in enumerate(text.splitlines(), 1):
        http_only = False
        if line.startswith("#HttpOnly_"):
            line, http_only = line[len("#HttpOnly_"):], True
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.rstrip("\r\n").split("\t")
        if len(f) != 7:
            raise ConfigError(key, f"line {n}: expected 7 tab-separated fields, got {len(f)}")
        domain, sub, path, secure, expires, name, value = f
        if not domain or not name or not expires.lstrip("-").isdigit():
            raise ConfigError(key, f"line {n}: not a cookie (domain, name and a numeric expiry are required)")
        out.append(CookieRecord(domain.lstrip(".").lower(), sub.upper() == "TRUE", path or "/",
                                secure.upper() == "TRUE", max(0, int(expires)), name, value, http_only))
        if len(out) > MAX_COOKIES:
            raise ConfigError(key, f"more than {MAX_COOKIES} cookies")
    return tuple(out)


# ----------------------------------------------------------------------------------------------- the jar
@dataclass(slots=True)
class Cookie:
    name: str
    value: str
    domain: str                # lower case, no leading dot
    host_only: bool            # sent to exactly `domain`, not to its subdomains
    path: str
    secure: bool
    http_only: bool
    expires: float | None      # Unix seconds; None: until the process ends
    created: int               # order of arrival: the oldest go first when the jar is full

    @property
    def size(self) -> int:
        return len(self.name) + len(self.value) + 1


def _pattern_host(pattern: str) -> str:
    """The host a ``host`` or ``host:port`` pattern names (brackets off an IPv6 address)."""
    if pattern.startswith("["):
        return pattern[1:pattern.find("]")] if "]" in pattern else pattern
    host, sep, port = pattern.rpartition(":")
    return host if sep and port.isdigit() else pattern


def _host_in_pattern(host: str, pattern: str) -> bool:
    """Whether a host is one of the site's: ``host`` and ``host:port`` name one host, ``*.domain`` its
    subdomains (the jar is keyed to URLs of the site by the sites table; this is the jar's own check)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == _pattern_host(pattern)


def _domain_in_pattern(domain: str, pattern: str) -> bool:
    """Whether a Domain attribute stays inside the site: for ``host`` (or ``host:port``) only that host; for
    ``*.domain`` the domain or any name under it (a cookie for the domain is sent to the site's hosts only)."""
    if pattern.startswith("*."):
        base = pattern[2:]
        return domain == base or domain.endswith("." + base)
    return _host_in_pattern(domain, pattern)


def domain_match(host: str, domain: str) -> bool:
    """RFC 6265, 5.1.3 (an IP address matches only itself)."""
    if host == domain:
        return True
    return host.endswith("." + domain) and not _is_ip(host)


def _is_ip(host: str) -> bool:
    return ":" in host or bool(re.fullmatch(r"[0-9.]+", host))


def default_path(path: str) -> str:
    """RFC 6265, 5.1.4: the directory of the request's path."""
    if not path.startswith("/") or path.count("/") == 1:
        return "/"
    return path[:path.rfind("/")]


def path_match(request_path: str, cookie_path: str) -> bool:
    """RFC 6265, 5.1.4."""
    if request_path == cookie_path:
        return True
    if request_path.startswith(cookie_path):
        return cookie_path.endswith("/") or request_path[len(cookie_path)] == "/"
    return False


_DELIMS = re.compile(r"[\x09\x20-\x2f\x3b-\x40\x5b-\x60\x7b-\x7e]+")
_TIME = re.compile(r"(\d{1,2}):(\d{1,2}):(\d{1,2})(?:[^\d].*)?$")
_DAY = re.compile(r"(\d{1,2})(?:[^\d].*)?$")
_YEAR = re.compile(r"(\d{2,4})(?:[^\d].*)?$")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def parse_cookie_date(text: str) -> float | None:
    """RFC 6265, 5.1.1: the date of an Expires attribute in Unix seconds, or None (the attribute is ignored)."""
    hms: tuple[int, int, int] | None = None
    day = month = year = None
    for token in _DELIMS.split(text[:256]):
        if not token:
            continue
        if hms is None and (m := _TIME.match(token)):
            hms = (int(m[1]), int(m[2]), int(m[3]))
        elif day is None and (m := _DAY.match(token)):
            day = int(m[1])
        elif month is None and token[:3].lower() in _MONTHS:
            month = _MONTHS.index(token[:3].lower()) + 1
        elif year is None and (m := _YEAR.match(token)):
            year = int(m[1])
    if hms is None or day is None or month is None or year is None:
        return None
    if 70 <= year <= 99:
        year += 1900
    elif 0 <= year <= 69:
        year += 2000
    h, mi, s = hms
    if not 1 <= day <= 31 or year < 1601 or h > 23 or mi > 59 or s > 59:
        return None
    try:
        return float(calendar.timegm((year, month, day, h, mi, s, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def _bad_text(s: str) -> bool:
    return any(ord(c) < 0x20 or c == "\x7f" for c in s) or ";" in s


class CookieJar:
    """One site's cookies (see the module's docstring for its rules and bounds). ``pattern``: the site's key in
    the sites table, lower case."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._cookies: dict[tuple[str, str, str], Cookie] = {}   # (domain, path, name) -> cookie, oldest first
        self._serial = 0
        self._bytes = 0
        self.refused = 0          # Set-Cookie values and records not kept: for tests and logs

    def __len__(self) -> int:
        return len(self._cookies)

    def cookies(self, now: float) -> list[Cookie]:
        self._purge(now)
        return list(self._cookies.values())

    # ------------------------------------------------------------------ in
    def load(self, records: Iterable[CookieRecord], now: float) -> None:
        """The site's cookies file: its records as cookies (those outside the site, or expired, are left out)."""
        for r in records:
            domain = r.domain.lstrip(".").lower()
            if not domain or not _domain_in_pattern(domain, self.pattern) or _bad_text(r.name) \
                    or _bad_text(r.value) or len(r.name) + len(r.value) > MAX_COOKIE_BYTES:
                self.refused += 1
                continue
            expires = float(r.expires) if r.expires else None
            if expires is not None and expires <= now:
                continue
            self._keep(Cookie(r.name, r.value, domain, not r.include_subdomains, r.path or "/", r.secure,
                              r.http_only, expires, 0), now)

    def receive(self, url: str, set_cookies: Iterable[str], now: float) -> int:
        """An answer from url set these cookies (its Set-Cookie values); returns how many were kept."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return 0
        host = (parts.hostname or "").lower()
        if not _host_in_pattern(host, self.pattern):
            return 0          # not the site's: its cookies are not this jar's to keep
        kept = 0
        for n, value in enumerate(set_cookies):
            if n >= MAX_SET_COOKIES_PER_ANSWER:
                self.refused += 1
                break
            cookie = self._parse(value, host, parts.path or "/", parts.scheme == "https", now)
            if cookie is None:
                self.refused += 1
                continue
            self._keep(cookie, now)
            kept += 1
        return kept

    def _parse(self, text: str, host: str, path: str, secure_origin: bool, now: float) -> Cookie | None:
        """RFC 6265, 5.2 and 5.3, with the jar's own refusals (outside the site, too big)."""
        if len(text) > MAX_SET_COOKIE:
            return None
        pair, *attrs = text.split(";")
        name, eq, value = pair.partition("=")
        name, value = name.strip(" \t"), value.strip(" \t")
        if not eq or not name or len(name) + len(value) > MAX_COOKIE_BYTES or _bad_text(name) or _bad_text(value):
            return None
        domain = ""
        cookie_path: str | None = None
        expires: float | None = None
        max_age: float | None = None
        secure = http_only = False
        for attr in attrs:
            key, _, val = attr.partition("=")
            key, val = key.strip(" \t").lower(), val.strip(" \t")
            if key == "expires":
                date = parse_cookie_date(val)
                if date is not None:
                    expires = date
            elif key == "max-age":
                if re.fullmatch(r"-?\d{1,12}", val):
                    max_age = float(val)
            elif key == "domain":
                domain = val.lstrip(".").lower()
            elif key == "path":
                cookie_path = val if val.startswith("/") else None
            elif key == "secure":
                secure = True
            elif key == "httponly":
                http_only = True
        if max_age is not None:
            expires = now + min(max_age, MAX_AGE) if max_age > 0 else now - 1
        elif expires is not None:
            expires = min(expires, now + MAX_AGE)
        if domain:
            # The answering host must be in the Domain (RFC 6265, 5.3 step 6), and the Domain in the site.
            if not domain_match(host, domain) or not _domain_in_pattern(domain, self.pattern):
                return None
            host_only = False
        else:
            domain, host_only = host, True
        if secure and not secure_origin:
            return None        # RFC 6265bis: only a secure origin may set a Secure cookie
        return Cookie(name, value, domain, host_only, cookie_path or default_path(path), secure, http_only,
                      expires, 0)

    def _keep(self, cookie: Cookie, now: float) -> None:
        key = (cookie.domain, cookie.path, cookie.name)
        old = self._cookies.get(key)
        if cookie.expires is not None and cookie.expires <= now:
            if old is not None:    # an expiry in the past deletes the cookie (and is not kept)
                self._bytes -= self._cookies.pop(key).size
            return
        if old is not None:
            # A replaced cookie keeps its age (RFC 6265, 5.3 step 11.3), and its place in the dict's order.
            cookie.created = old.created
            self._bytes -= old.size
        else:
            self._serial += 1
            cookie.created = self._serial
        self._cookies[key] = cookie
        self._bytes += cookie.size
        if len(self._cookies) > MAX_JAR_COOKIES or self._bytes > MAX_JAR_BYTES:
            self._purge(now)
            while self._cookies and (len(self._cookies) > MAX_JAR_COOKIES or self._bytes > MAX_JAR_BYTES):
                oldest = next(iter(self._cookies))
                self._bytes -= self._cookies.pop(oldest).size

    def _purge(self, now: float) -> None:
        gone = [k for k, c in self._cookies.items() if c.expires is not None and c.expires <= now]
        for k in gone:
            self._bytes -= self._cookies.pop(k).size

    # ------------------------------------------------------------------ out
    def header(self, url: str, now: float) -> str | None:
        """The Cookie header for a request to url (RFC 6265, 5.4), or None: nothing to send, or not the site's."""
        if not self._cookies:
            return None
        try:
            parts = urlsplit(url)
        except ValueError:
            return None
        host = (parts.hostname or "").lower()
        if not _host_in_pattern(host, self.pattern):
            return None
        self._purge(now)
        path = parts.path or "/"
        https = parts.scheme == "https"
        chosen = [c for c in self._cookies.values()
                  if (host == c.domain if c.host_only else domain_match(host, c.domain))
                  and path_match(path, c.path) and (https or not c.secure)]
        if not chosen:
            return None
        chosen.sort(key=lambda c: (-len(c.path), c.created))
        return "; ".join(f"{c.name}={c.value}" for c in chosen)


def set_cookie_values(raw_headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """The Set-Cookie values of an answer's raw headers (each its own: never joined, as dates hold commas)."""
    return [v.decode("latin-1") for k, v in raw_headers if k.lower() == b"set-cookie"][:MAX_SET_COOKIES_PER_ANSWER]
