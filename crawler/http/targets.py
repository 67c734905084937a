"""Which addresses the crawler may connect to: the public internet, and the private places its crawl names.

A page, a redirect or a resolver's answer can name any URL, so a hostile site could make the crawler request
its own machine, the local network or a cloud metadata service (server-side request forgery) and catalogue
what they answer. The check runs where the address is finally known: after DNS resolution, on every connection
the HTTP transport opens (every redirect hop, every download, the master's robots.txt fetch), inside the
connector whose DNS cache the answers come from (TargetConnector below). A host name that resolves to a
loopback, private, link-local, multicast, reserved or otherwise special address is refused unless:

- its host is an IP literal and it and the port are one of the crawl's seeds' (``host:port``; a crawl of an
  intranet site names it), or
- the address is inside a network the crawl's config lists (``crawl.allowed_networks``).

A seed named by host name opens nothing beyond the public internet: whoever runs that name's DNS (a hostile seed
site) could point it at a metadata service or an intranet host on the seed's port. A crawl of an intranet site by
name lists its network in ``crawl.allowed_networks``.

Refusal raises TargetRefused, an httpx.RequestError: a permanent failure of that URL, not a network fault.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
import aiohttp.tracing
import httpx
from aiohttp.abc import ResolveResult

from crawler.web.urls import InvalidURL, host_port, normalize

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TargetRefused(httpx.RequestError):
    """The URL's host resolves to an address outside the public internet that the crawl did not name."""


def parse_network(text: str) -> Network:
    """'10.0.0.0/8', '127.0.0.1' (one address) or an IPv6 network; ValueError says what is wrong."""
    return ipaddress.ip_network(text.strip(), strict=False)


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")        # RFC 6052: the well-known prefix, IPv4 in the last 32 bits
_COMPATIBLE = ipaddress.IPv6Network("::/96")          # RFC 4291's deprecated IPv4-compatible addresses


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries and reaches (IPv4-mapped, IPv4-compatible, 6to4, Teredo's client,
    NAT64), or None. A relay or translator delivers to that IPv4 address, so it is what the policy judges."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):    # :: and ::1 are themselves, not IPv4
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(address: str) -> bool:
    """True for an address on the public internet; False for loopback, private, link-local, site-local,
    multicast, reserved, unspecified and the other special-purpose ranges (RFC 6890), and for an IPv6 form that
    carries an IPv4 address (see embedded_ipv4) unless that IPv4 address is public."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:            # fec0::/10: deprecated, but routed inside sites that still use it
            return False
        inner = embedded_ipv4(ip)
        if inner is not None:
            ip = inner
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_loopback
                                 or ip.is_link_local)


class TargetPolicy:
    """The addresses a daemon may connect to. Mutable so a worker can learn its crawl's from the master."""

    def __init__(self, origins: Iterable[tuple[str, int]] = (), networks: Sequence[Network] = ()) -> None:
        self.origins: frozenset[tuple[str, int]] = frozenset()
        self.networks: tuple[Network, ...] = ()
        self.allow(origins, networks)

    @classmethod
    def for_crawl(cls, seeds: Iterable[str], networks: Iterable[str]) -> TargetPolicy:
        origins = []
        for seed in seeds:
            try:
                seed = normalize(seed)     # the host as the connector sees it: IDNA, lower case
            except InvalidURL:
                continue
            origin = host_port(seed)
            if origin is not None:
                origins.append(origin)
        return cls(origins, [parse_network(n) for n in networks])

    def allow(self, origins: Iterable[tuple[str, int]], networks: Sequence[Network]) -> None:
        """Origins named by host name are dropped: a name may resolve anywhere its owner likes."""
        self.origins = frozenset((str(ipaddress.ip_address(h)), p) for h, p in origins if _is_ip(h))
        self.networks = tuple(networks)

    def permits(self, host: str, port: int, address: str) -> bool:
        if is_public(address):
            return True
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if _is_ip(host) and ipaddress.ip_address(host) == ip and (str(ip), port) in self.origins:
            return True
        return any(ip in net for net in self.networks if net.version == ip.version)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class TargetConnector(aiohttp.TCPConnector):
    """aiohttp's connector with every resolved address checked against a TargetPolicy before connecting.

    aiohttp resolves once per (host, port) per DNS TTL and caches the answer (its cache is bounded:
    ``dns_cache_max_size`` entries, least recently used out); the check runs on every connection, cached
    answer or not, and on IP literals, which skip DNS.
    """

    def __init__(self, *, policy: TargetPolicy | None, **kw: Any) -> None:
        super().__init__(**kw)
        self._policy = policy

    async def _resolve_host(self, host: str, port: int,
                            traces: Sequence[aiohttp.tracing.Trace] | None = None) -> list[ResolveResult]:
        hosts = await super()._resolve_host(host, port, traces=traces)
        policy = self._policy
        if policy is None:
            return hosts
        allowed = [h for h in hosts if policy.permits(host, port, h["host"])]
        if not allowed:
            refused = hosts[0]["host"] if hosts else "no address"
            raise TargetRefused(f"{host}:{port} resolves to {refused}, outside the public internet and not "
                                "named by the crawl (its seeds or crawl.allowed_networks)")
        return allowed
