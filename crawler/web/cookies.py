"""Cookies: the records of a Netscape cookies file (what curl, wget and browser extensions write).

The master reads a site's ``cookies_file`` (parse_cookie_file) and sends its records to the workers in the
Welcome; each worker's session jar (crawler/worker/sessions.py) starts from them.
"""

from __future__ import annotations

from typing import NamedTuple

from crawler.errors import ConfigError

# A cookies file bigger than this, or with more records, is not a session's: refused at load.
MAX_COOKIE_FILE = 1024 * 1024
MAX_COOKIES = 1000


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
