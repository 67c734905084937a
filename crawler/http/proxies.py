"""Proxies as the configs name them: one parsed form for the master, the sites table and the workers.

A proxy is given as a URL, ``http://host:port`` (absolute-form requests for http, CONNECT for https) or
``socks5://host:port`` (RFC 1928; names resolved by the proxy, as socks5h means elsewhere), optionally as a mapping
``{url: URL, credentials_file: PATH}`` whose file holds ``user:password`` on its first line, so a password stays
out of the config. Credentials in the URL itself are refused for the same reason.

``Proxy.label`` (no credentials) is what logs, metrics and the status page show; ``Proxy.wire`` (with them) is what
the master sends a worker in its Welcome (an authenticated frame of a trusted link), ``parse_wire`` reads it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from crawler.errors import ConfigError

SCHEMES = ("http", "socks5")
DEFAULT_PORTS = {"http": 8080, "socks5": 1080}
# A list longer than this is a mistake, and each proxy costs a pool and a metric series per node.
MAX_PROXIES = 64
# RFC 1929: a SOCKS5 user name and password are each at most 255 bytes; the same bound serves HTTP's Basic.
MAX_CREDENTIAL = 255


@dataclass(frozen=True, order=True)
class Proxy:
    scheme: str                   # one of SCHEMES
    host: str
    port: int
    username: str | None = None
    password: str | None = None

    @property
    def label(self) -> str:
        """The proxy without its credentials: for logs, metrics and the status page."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def wire(self) -> str:
        """The proxy as a URL with its credentials percent-encoded: what a Welcome carries (parse_wire reads it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        auth = ""
        if self.username is not None:
            auth = quote(self.username, safe="") + ":" + quote(self.password or "", safe="") + "@"
        return f"{self.scheme}://{auth}{host}:{self.port}"


def _check_credential(key: str, what: str, value: str) -> str:
    if not value or len(value.encode("utf-8")) > MAX_CREDENTIAL or any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise ConfigError(key, f"the proxy {what} must be 1 to {MAX_CREDENTIAL} bytes of printable text")
    return value


def _split(key: str, url: str, *, credentials_allowed: bool) -> Proxy:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(key, f"{url!r} is not a proxy URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(key, f"{url!r}: a proxy URL starts with {' or '.join(s + '://' for s in SCHEMES)}")
    if not parts.hostname:
        raise ConfigError(key, f"{url!r}: the proxy URL names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(key, f"{url!r}: a proxy URL is scheme://host:port, nothing after it")
    username = password = None
    if parts.username is not None or parts.password is not None:
        if not credentials_allowed:
            raise ConfigError(key, f"{parts.scheme}://{parts.hostname}: put the proxy's credentials in a "
                                   "credentials_file ({url: ..., credentials_file: PATH}), not in the config")
        username = _check_credential(key, "user name", unquote(parts.username or ""))
        password = _check_credential(key, "password", unquote(parts.password or ""))
    return Proxy(scheme, parts.hostname, port or DEFAULT_PORTS[scheme], username, password)


def read_credentials(key: str, path: Path) -> tuple[str, str]:
    """``user:password`` from the first line of a file."""
    try:
        line = path.read_text(encoding="utf-8").splitlines()[0:1]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(key, f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    user, sep, password = (line[0] if line else "").strip().partition(":")
    if not sep:
        raise ConfigError(key, f"{path}: expected user:password on its first line")
    return _check_credential(key, "user name", user), _check_credential(key, "password", password)


def parse_proxy(key: str, value: Any, base: Path) -> Proxy:
    """One entry of a ``proxies`` list: a URL, or ``{url: URL, credentials_file: PATH}``."""
    if isinstance(value, str) and value:
        return _split(key, value.strip(), credentials_allowed=False)
    if isinstance(value, dict):
        unknown = set(value) - {"url", "credentials_file"}
        if unknown:
            raise ConfigError(f"{key}.{sorted(map(str, unknown))[0]}", "unknown key (known keys: credentials_file, url)")
        url = value.get("url")
        if not isinstance(url, str) or not url:
            raise ConfigError(f"{key}.url", "required: the proxy's URL")
        proxy = _split(f"{key}.url", url.strip(), credentials_allowed=False)
        cred = value.get("credentials_file")
        if cred is None:
            return proxy
        if not isinstance(cred, str) or not cred:
            raise ConfigError(f"{key}.credentials_file", f"expected a path, got {cred!r}")
        path = Path(cred).expanduser()
        user, password = read_credentials(f"{key}.credentials_file", path if path.is_absolute() else base / path)
        return Proxy(proxy.scheme, proxy.host, proxy.port, user, password)
    raise ConfigError(key, f"expected a proxy URL or {{url: ..., credentials_file: ...}}, got {value!r}")


def parse_proxies(key: str, value: Any, base: Path) -> tuple[Proxy, ...]:
    """A ``proxies`` config key: a list of entries (parse_proxy), none repeated, at most MAX_PROXIES."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(key, f"expected a list of proxy URLs, got {type(value).__name__}")
    if len(value) > MAX_PROXIES:
        raise ConfigError(key, f"{len(value)} proxies; at most {MAX_PROXIES}")
    out = tuple(parse_proxy(f"{key}[{i}]", v, base) for i, v in enumerate(value))
    labels = [p.label for p in out]
    for label in labels:
        if labels.count(label) > 1:
            raise ConfigError(key, f"{label} is listed twice")
    return out


def parse_wire(urls: Iterable[str]) -> tuple[Proxy, ...]:
    """Proxies as a Welcome carries them (Proxy.wire); ConfigError (key "proxies") for one that is not."""
    return tuple(_split("proxies", u, credentials_allowed=True) for u in urls)
