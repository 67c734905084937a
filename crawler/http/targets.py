"""Which addresses the crawler may connect to: the public internet, and the private places its crawl names.

A page, a redirect or a resolver's answer can name any URL, so a hostile site could make the crawler request
its own machine, the local network or a cloud metadata service (server-side request forgery) and catalogue
what they answer. The check runs where the address is finally known: after DNS resolution, on every connection
the HTTP transport opens (every redirect hop, every download, the master's robots.txt fetch), inside the
resolver whose DNS cache the answers come from (TargetResolver below). A host name that resolves to a
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

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypedDict

import httpx

from crawler.web.urls import InvalidURL, host_port, normalize

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Key = tuple[str, int, socket.AddressFamily]     # host, port, address family


class ResolveResult(TypedDict):
    """One address a name resolves to, as aiohttp's connector takes it (aiohttp.abc.ResolveResult's keys)."""

    hostname: str
    host: str
    port: int
    family: int
    proto: int
    flags: int


class Dns(Protocol):
    """What answers a name (the system's resolver by default; tests bring their own)."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]: ...

    async def close(self) -> None: ...


_AI_ADDRCONFIG = socket.AI_ADDRCONFIG & getattr(socket, "AI_MASK", -1)


class SystemDns:
    """getaddrinfo in the loop's executor, answered as aiohttp's ThreadedResolver answers: one entry per stream
    address, a link-local IPv6 one with its zone (the one case that needs getnameinfo)."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family, flags=_AI_ADDRCONFIG)
        hosts: list[ResolveResult] = []
        for fam, _, proto, _, address in infos:
            if fam == socket.AF_INET6:
                if len(address) < 3:     # an interpreter or host without IPv6
                    continue
                if address[3]:           # a scope id: the zone goes into the host ("fe80::1%eth0")
                    found, service = await loop.getnameinfo(address, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
                    found_port = int(service)
                else:
                    found, found_port = str(address[0]), int(address[1])
            else:
                found, found_port = str(address[0]), int(address[1])
            hosts.append({"hostname": host, "host": found, "port": found_port, "family": fam, "proto": proto,
                          "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV})
        return hosts

    async def close(self) -> None:
        pass


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


class TargetResolver:
    """DNS with a bounded cache, every answer checked against a TargetPolicy: the one resolver of both HTTP paths.

    aiohttp's connector takes it as its resolver (aio.py; with aiohttp's own DNS cache off), and the lean client
    (http1.py) calls it for every connection it opens, so the check runs on every connection, cached answer or
    not. Answers are remembered per (host, port, family) for ``ttl`` seconds, at most ``max_size`` of them, least
    recently used out; concurrent look-ups of one name share one query. An IP literal is judged as it is, without
    DNS; aiohttp's connector never asks a resolver about one, so the transport asks ``check_literal`` before each
    request it sends through aiohttp (every redirect hop is a request of its own).
    """

    def __init__(self, policy: TargetPolicy | None, *, ttl: float, max_size: int,
                 resolver: Dns | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """resolver: the DNS behind the cache (SystemDns when None); policy None: any address."""
        self.policy = policy
        self._ttl = ttl
        self._max_size = max_size
        self._inner = resolver
        self._owns_inner = resolver is None
        self._clock = clock
        self._cache: OrderedDict[_Key, tuple[float, list[ResolveResult]]] = OrderedDict()
        self._pending: dict[_Key, asyncio.Future[list[ResolveResult]]] = {}

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if _is_ip(host):
            literal = ipaddress.ip_address(host)
            hosts: list[ResolveResult] = [{
                "hostname": host, "host": host, "port": port, "proto": 0, "flags": socket.AI_NUMERICHOST,
                "family": socket.AF_INET6 if literal.version == 6 else socket.AF_INET}]
        else:
            hosts = await self._lookup(host, port, family)
        return self._permitted(host, port, hosts)

    def check_literal(self, host: str, port: int) -> None:
        """TargetRefused when host is an IP literal the policy refuses; a name is judged once it is resolved."""
        if _is_ip(host):
            self._permitted(host, port, [{"hostname": host, "host": host, "port": port, "family": 0, "proto": 0,
                                          "flags": socket.AI_NUMERICHOST}])

    def _permitted(self, host: str, port: int, hosts: list[ResolveResult]) -> list[ResolveResult]:
        policy = self.policy
        if policy is None:
            return hosts
        allowed = [h for h in hosts if policy.permits(host, port, h["host"])]
        if not allowed:
            refused = hosts[0]["host"] if hosts else "no address"
            raise TargetRefused(f"{host}:{port} resolves to {refused}, outside the public internet and not "
                                "named by the crawl (its seeds or crawl.allowed_networks)")
        return allowed

    async def _lookup(self, host: str, port: int, family: socket.AddressFamily) -> list[ResolveResult]:
        key = (host, port, family)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now < cached[0]:
            self._cache.move_to_end(key)
            return cached[1]
        pending = self._pending.get(key)
        if pending is None:
            if self._inner is None:
                self._inner = SystemDns()
            pending = self._pending[key] = asyncio.ensure_future(self._inner.resolve(host, port, family=family))
            pending.add_done_callback(lambda done: self._settle(key, done))
        # Shielded: one caller cancelled (its request timed out) leaves the query to the others.
        return list(await asyncio.shield(pending))

    def _settle(self, key: _Key, done: asyncio.Future[list[ResolveResult]]) -> None:
        del self._pending[key]
        if done.cancelled() or done.exception() is not None:    # retrieved here: a failure is not cached
            return
        self._cache[key] = (self._clock() + self._ttl, done.result())
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_size:
            self._cache.popitem(last=False)

    async def close(self) -> None:
        self._cache.clear()
        if self._owns_inner and self._inner is not None:
            await self._inner.close()
            self._inner = None
