"""Per-site policy: the ``sites:`` table of the master's config, one definition for both daemons.

Keyed by ``host``, ``host:port`` or ``*.domain`` (any subdomain of domain, not domain itself), each entry may set
its own ``politeness`` (min_delay, max_per_host, audio_max_per_host, audio_min_delay), ``user_agent``,
``headers``, ``max_depth``, ``proxies``, ``cookies_file`` (Netscape format, read by the master) and ``login``
(``{url, fields: {name: value | {file: PATH}}, success: TEXT}``). The master enforces what is its own
(politeness, depth) and sends the rest to the workers in its Welcome.

SiteTable.lookup finds the entry of a URL's host and port: ``host:port`` first, then ``host``, then the longest
``*.domain`` that covers the host (overlapping patterns are fine: the most specific wins).

A site's ``user_agent`` is what its requests send; robots.txt is still read for the product token of
``politeness.user_agent`` (the crawl's name for itself), whatever a site's requests call themselves.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawler.errors import ConfigError
from crawler.http.proxies import Proxy, parse_proxies, parse_wire
from crawler.politeness import HostLimits, LimitsOf
from crawler.protocol import (
    HANDSHAKE_MAX_FRAME,
    HEADER_SIZE,
    MAC_SIZE,
    CookieWire,
    LoginWire,
    SiteWire,
    Welcome,
    encode,
)
from crawler.web.cookies import CookieRecord, parse_cookie_file
from crawler.web.urls import host_port

# A sites table longer than this is not a config a person keeps; each entry costs state on every node.
MAX_SITES = 1000
MAX_HEADERS = 32
MAX_LOGIN_FIELDS = 32
MAX_SECRET_FILE = 64 * 1024
# Hosts whose site a table remembers (SiteTable.lookup), least recently asked out.
LOOKUPS_KEPT = 4096
# Headers a site entry may not set: the HTTP layer owns them.
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "range", "if-range",
                              "cookie", "accept-encoding", "te", "upgrade", "proxy-authorization",
                              "if-none-match", "if-modified-since"})


@dataclass(frozen=True)
class SitePoliteness:
    """A site's own politeness; None: the crawl's setting."""

    min_delay: float | None = None
    max_per_host: int | None = None
    audio_max_per_host: int | None = None
    audio_min_delay: float | None = None


@dataclass(frozen=True)
class LoginSpec:
    url: str                               # the form's action: fields are POSTed there (form-urlencoded)
    fields: tuple[tuple[str, str], ...]    # values read from their files already
    success: str                           # text a logged-in page shows (in the login answer and later pages)


@dataclass(frozen=True)
class SitePolicy:
    pattern: str                           # "host", "host:port" or "*.domain", lower case
    politeness: SitePoliteness = SitePoliteness()
    user_agent: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    max_depth: int | None = None
    proxies: tuple[Proxy, ...] | None = None   # None: the crawl's (or the worker's) proxies; (): go direct
    cookies: tuple[CookieRecord, ...] = ()
    login: LoginSpec | None = None

    @property
    def has_session(self) -> bool:
        """A cookie jar is kept for this site on every node."""
        return bool(self.cookies) or self.login is not None


class SiteTable:
    """The sites' policies by pattern, and the lookup of a host's."""

    def __init__(self, policies: Iterable[SitePolicy] = ()) -> None:
        self.policies: tuple[SitePolicy, ...] = tuple(policies)
        self._exact: dict[str, SitePolicy] = {}
        self._wild: dict[str, SitePolicy] = {}
        self._answers: OrderedDict[tuple[str, int | None], SitePolicy | None] = OrderedDict()
        for p in self.policies:
            if p.pattern.startswith("*."):
                self._wild[p.pattern[2:]] = p
            else:
                self._exact[p.pattern] = p

    def __bool__(self) -> bool:
        return bool(self.policies)

    def __len__(self) -> int:
        return len(self.policies)

    def lookup(self, host: str, port: int | None = None) -> SitePolicy | None:
        """The policy for host (lower case, no brackets) and port (the URL's, default included), or None.
        The table does not change, so answers are remembered (the last LOOKUPS_KEPT hosts): its callers ask per
        URL (the master's routing, depth limits and figures, a worker's requests) and keep no cache of their own."""
        if not self.policies:
            return None
        key = (host, port)
        cache = self._answers
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        found = self._find(host, port)
        cache[key] = found
        if len(cache) > LOOKUPS_KEPT:
            cache.popitem(last=False)
        return found

    def _find(self, host: str, port: int | None) -> SitePolicy | None:
        if port is not None and (p := self._exact.get(f"{host}:{port}")) is not None:
            return p
        if (p := self._exact.get(host)) is not None:
            return p
        if self._wild:
            rest = host
            while (dot := rest.find(".")) >= 0:
                rest = rest[dot + 1:]
                if (p := self._wild.get(rest)) is not None:
                    return p
        return None

    def lookup_url(self, url: str) -> SitePolicy | None:
        """The policy for an http(s) URL (or an origin) by the host and port it connects to, or None."""
        hp = host_port(url)
        return None if hp is None else self.lookup(*hp)


# ----------------------------------------------------------------------------------------------- parsing
def _pattern(key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(key, f"a site is keyed by host, host:port or *.domain, got {raw!r}")
    p = raw.strip().lower()
    host, sep, port = p.rpartition(":") if not p.startswith("[") else (p, "", "")
    if sep and not port.isdigit():
        raise ConfigError(key, f"{raw!r}: the port must be a number")
    name = host if sep else p
    if name.startswith("*."):
        if sep:
            raise ConfigError(key, f"{raw!r}: a *.domain pattern takes no port")
        name = name[2:]
    if not name or "*" in name or "/" in name or " " in name:
        raise ConfigError(key, f"{raw!r}: a site is keyed by host, host:port or *.domain")
    return p


def _number(key: str, v: Any, *, integer: bool, positive: bool) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)) \
            or not math.isfinite(v):
        raise ConfigError(key, f"expected {'an integer' if integer else 'a number'}, got {v!r}")
    if positive and v <= 0:
        raise ConfigError(key, "must be greater than 0")
    if v < 0:
        raise ConfigError(key, "must not be negative")
    return v if integer else float(v)


def _mapping(key: str, v: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(key, f"expected a mapping, got {type(v).__name__}")
    for k in v:
        if k not in known:
            raise ConfigError(f"{key}.{k}", f"unknown key (known keys: {', '.join(sorted(known))})")
    return v


def _text(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v or any(c in v for c in "\r\n\0"):
        raise ConfigError(key, f"expected a one-line string, got {v!r}")
    return v


def _read_file(key: str, raw: Any, base: Path) -> str:
    if not isinstance(raw, str) or not raw:
        raise ConfigError(key, f"expected a path, got {raw!r}")
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        if path.stat().st_size > MAX_SECRET_FILE * 16:
            raise ConfigError(key, f"{path} is too big")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(key, f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _login(key: str, raw: Any, base: Path) -> LoginSpec:
    m = _mapping(key, raw, ("url", "fields", "success"))
    url = _text(f"{key}.url", m.get("url"))
    if host_port(url) is None:
        raise ConfigError(f"{key}.url", f"expected an http(s) URL, got {url!r}")
    fields_raw = m.get("fields")
    if not isinstance(fields_raw, dict) or not fields_raw:
        raise ConfigError(f"{key}.fields", "required: the form's fields, {name: value, ...}")
    if len(fields_raw) > MAX_LOGIN_FIELDS:
        raise ConfigError(f"{key}.fields", f"at most {MAX_LOGIN_FIELDS} fields")
    fields: list[tuple[str, str]] = []
    for name, value in fields_raw.items():
        fkey = f"{key}.fields.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(fkey, "a field name must be a non-empty string")
        if isinstance(value, dict):
            f = _mapping(fkey, value, ("file",))
            if "file" not in f:
                raise ConfigError(fkey, "expected a value or {file: PATH}")
            text = _read_file(f"{fkey}.file", f["file"], base)
            value = text.splitlines()[0] if text else ""
            if not value:
                raise ConfigError(f"{fkey}.file", "the file is empty")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        elif not isinstance(value, str):
            raise ConfigError(fkey, f"expected a value or {{file: PATH}}, got {value!r}")
        fields.append((name, value))
    success = _text(f"{key}.success", m.get("success"))
    return LoginSpec(url, tuple(fields), success)


def parse_site(key: str, pattern: str, raw: Any, base: Path) -> SitePolicy:
    m = _mapping(key, raw, ("politeness", "user_agent", "headers", "max_depth", "proxies", "cookies_file",
                            "login"))
    pol = _mapping(f"{key}.politeness", m.get("politeness"),
                   ("min_delay", "max_per_host", "audio_max_per_host", "audio_min_delay"))
    politeness = SitePoliteness(
        min_delay=None if pol.get("min_delay") is None else
        _number(f"{key}.politeness.min_delay", pol["min_delay"], integer=False, positive=False),
        max_per_host=None if pol.get("max_per_host") is None else
        _number(f"{key}.politeness.max_per_host", pol["max_per_host"], integer=True, positive=True),
        audio_max_per_host=None if pol.get("audio_max_per_host") is None else
        _number(f"{key}.politeness.audio_max_per_host", pol["audio_max_per_host"], integer=True, positive=True),
        audio_min_delay=None if pol.get("audio_min_delay") is None else
        _number(f"{key}.politeness.audio_min_delay", pol["audio_min_delay"], integer=False, positive=False))
    user_agent = None if m.get("user_agent") is None else _text(f"{key}.user_agent", m["user_agent"])
    headers: list[tuple[str, str]] = []
    raw_headers = m.get("headers") or {}
    if not isinstance(raw_headers, dict):
        raise ConfigError(f"{key}.headers", "expected a mapping of header names to values")
    if len(raw_headers) > MAX_HEADERS:
        raise ConfigError(f"{key}.headers", f"at most {MAX_HEADERS} headers")
    for name, value in raw_headers.items():
        hkey = f"{key}.headers.{name}"
        if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ConfigError(hkey, "not a header name")
        if name.lower() in RESERVED_HEADERS or name.lower() == "user-agent":
            raise ConfigError(hkey, "the crawler sets this header itself" + (
                " (use user_agent)" if name.lower() == "user-agent" else ""))
        headers.append((name, _text(hkey, str(value) if isinstance(value, (int, float)) else value)))
    max_depth = None if m.get("max_depth") is None else \
        _number(f"{key}.max_depth", m["max_depth"], integer=True, positive=False)
    proxies = None if "proxies" not in m else parse_proxies(f"{key}.proxies", m["proxies"] or [], base)
    cookies: tuple[CookieRecord, ...] = ()
    if m.get("cookies_file") is not None:
        ckey = f"{key}.cookies_file"
        cookies = parse_cookie_file(_read_file(ckey, m["cookies_file"], base), ckey)
    login = None if m.get("login") is None else _login(f"{key}.login", m["login"], base)
    return SitePolicy(pattern, politeness, user_agent, tuple(headers), max_depth, proxies, cookies, login)


def parse_sites(key: str, value: Any, base: Path) -> SiteTable:
    """The ``sites`` config key: a mapping of pattern to entry (parse_site)."""
    if value is None:
        return SiteTable()
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a mapping of host, host:port or *.domain to a site's settings, "
                               f"got {type(value).__name__}")
    if len(value) > MAX_SITES:
        raise ConfigError(key, f"{len(value)} sites; at most {MAX_SITES}")
    seen: dict[str, str] = {}
    out = []
    for raw_pattern, entry in value.items():
        pkey = f"{key}.{raw_pattern}"
        pattern = _pattern(pkey, raw_pattern)
        if pattern in seen:
            raise ConfigError(pkey, f"the same site as {seen[pattern]!r}")
        seen[pattern] = str(raw_pattern)
        out.append(parse_site(pkey, pattern, entry, base))
    return SiteTable(out)


# ----------------------------------------------------------------------------------------------- the wire
def to_wire(table: SiteTable) -> tuple[SiteWire, ...]:
    """The sites' policies as a Welcome carries them (what the workers need; politeness stays at the master)."""
    out = []
    for p in table.policies:
        login = None if p.login is None else LoginWire(p.login.url, p.login.fields, p.login.success)
        out.append(SiteWire(p.pattern, p.user_agent, p.headers, p.max_depth,
                            None if p.proxies is None else tuple(x.wire for x in p.proxies),
                            tuple(CookieWire(*c) for c in p.cookies), login))
    return tuple(out)


def from_wire(sites: Iterable[SiteWire]) -> SiteTable:
    """A Welcome's sites back as a SiteTable; ConfigError for a proxy URL that is not one."""
    out = []
    for w in sites:
        login = None if w.login is None else LoginSpec(w.login.url, tuple(w.login.fields), w.login.success)
        out.append(SitePolicy(w.pattern, SitePoliteness(), w.user_agent, tuple(w.headers), w.max_depth,
                              None if w.proxies is None else parse_wire(w.proxies),
                              tuple(CookieRecord(c.domain, c.include_subdomains, c.path, c.secure, c.expires, c.name,
                                                 c.value, c.http_only) for c in w.cookies), login))
    return SiteTable(out)


def check_welcome_fits(key: str, table: SiteTable, proxies: tuple[str, ...] = (), *,
                       rules: tuple[str, ...] = (), origins: tuple[str, ...] = (),
                       networks: tuple[str, ...] = (), drop_params: tuple[str, ...] = ()) -> None:
    """ConfigError(key) when a Welcome carrying this sites table would not fit HANDSHAKE_MAX_FRAME, the most a
    worker reads before the master has proved the secret (so a worker could never join)."""
    if not table and not proxies:
        return
    # The widest values of the numbers, so the real Welcome is never bigger than this one.
    w = Welcome(bytes(MAC_SIZE), 1e300, rules, 2**62, 2**62, origins, networks, True, drop_params, proxies,
                to_wire(table))
    size = len(encode(w, max_frame=1 << 62)) - HEADER_SIZE
    if size > HANDSHAKE_MAX_FRAME:
        raise ConfigError(key, f"the sites' policies take {size} bytes in the master's Welcome, more than the "
                               f"{HANDSHAKE_MAX_FRAME} a worker reads before the master proved the secret: "
                               f"fewer sites, headers or cookies")


# ----------------------------------------------------------------------------------------------- the master's
def gate_limits(table: SiteTable, *, audio: bool, max_per_host: int | None,
                min_delay: float) -> tuple[LimitsOf | None, float]:
    """What a master's HostGate takes for the sites' own politeness (crawler/politeness.py HostGate): the
    limits of a host key (an origin), from its site where the site sets politeness, else None (the crawl's);
    and the largest min_delay any site sets. audio: the downloads' gate (audio_max_per_host, audio_min_delay),
    else the pages'. A site that sets one of the pair keeps the crawl's other (max_per_host / min_delay given).
    (None, 0.0) when no site sets any, so the gate costs nothing more than it did."""
    own: list[SitePolicy] = []
    for p in table.policies:
        sp = p.politeness
        n, d = (sp.audio_max_per_host, sp.audio_min_delay) if audio else (sp.max_per_host, sp.min_delay)
        if n is not None or d is not None:
            own.append(p)
    if not own:
        return None, 0.0
    by_pattern = {p.pattern: p for p in own}

    def limits_of(origin: str) -> HostLimits | None:
        p = table.lookup_url(origin)
        if p is None or p.pattern not in by_pattern:
            return None
        sp = p.politeness
        n, d = (sp.audio_max_per_host, sp.audio_min_delay) if audio else (sp.max_per_host, sp.min_delay)
        return HostLimits(max_per_host if n is None else n, min_delay if d is None else d)

    longest = max((d for p in own
                   if (d := (p.politeness.audio_min_delay if audio else p.politeness.min_delay)) is not None),
                  default=0.0)
    return limits_of, longest


class DepthLimits:
    """The depth limit of a URL: its site's max_depth where the site sets one, else the crawl's (None: none).

    Cheap where it is asked most: a depth at or below every limit (floor) passes and one past every limit
    (ceiling) is cut without a lookup; only between them is the URL's site looked up (the table remembers its
    answers)."""

    def __init__(self, crawl: int | None, table: SiteTable) -> None:
        self.crawl = crawl
        self.table = table
        own = [p.max_depth for p in table.policies if p.max_depth is not None]
        limits = [crawl, *own]
        self.per_site = bool(own)
        # None is no limit: the floor is the smallest limit, the ceiling the largest (None if any is None).
        finite = [x for x in limits if x is not None]
        self.floor: int | None = min(finite) if finite else None
        self.ceiling: int | None = None if any(x is None for x in limits) else max(finite)

    def limit(self, url: str) -> int | None:
        """url's depth limit (None: no limit)."""
        if not self.per_site:
            return self.crawl
        p = self.table.lookup_url(url)
        return self.crawl if p is None or p.max_depth is None else p.max_depth

    def allows(self, url: str, depth: int, extra: int = 0) -> bool:
        """Whether url at depth is within its limit plus extra (the hops an audio reference may go past it)."""
        if self.floor is None or depth <= self.floor + extra:
            return True
        if self.ceiling is not None and depth > self.ceiling + extra:
            return False
        lim = self.limit(url)
        return lim is None or depth <= lim + extra
