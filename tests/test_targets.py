"""Addresses the crawler may reach: checked after DNS, on every connection and redirect hop."""

import asyncio
import socket

import aiohttp.abc
import httpx
import pytest
from aiohttp import web

from crawler.http.getter import Stack
from crawler.http.targets import TargetPolicy, TargetRefused, TargetResolver, is_public, parse_network
from crawler.http.transport import build_client, build_transport
from crawler.web.urls import host_port
from crawler.worker.fetcher import FetchError, PageFetcher


@pytest.mark.parametrize(("address", "public"), [
    ("93.184.215.14", True), ("2606:4700::6810:84e5", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("10.1.2.3", False), ("172.16.0.1", False),
    ("192.168.1.1", False), ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("239.255.255.250", False), ("240.0.0.1", False), ("255.255.255.255", False),
    ("fe80::1", False), ("fe80::1%eth0", False), ("fc00::1", False), ("ff02::1", False), ("::", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("192.0.2.1", False), ("198.18.0.1", False),
    # IPv6 forms that carry an IPv4 address are judged by it: 6to4, Teredo's client, NAT64, IPv4-compatible.
    ("2002:a00:1::1", False), ("2002:7f00:1::", False), ("2002:a9fe:a9fe::1", False), ("2002:5db8:d70e::1", True),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False), ("2001:0:4136:e378:8000:63bf:a247:28f1", True),
    ("64:ff9b::127.0.0.1", False), ("64:ff9b::10.0.0.1", False), ("64:ff9b::93.184.215.14", True),
    ("::10.0.0.1", False), ("::127.0.0.1", False),
    ("fec0::1", False), ("fec0::a00:1", False), ("feff::1", False),      # site-local
])
def test_special_addresses_are_not_public(address, public):
    assert is_public(address) is public


def test_policy_allows_named_origins_and_networks_only():
    policy = TargetPolicy.for_crawl(["http://127.0.0.1:8080/", "https://Intranet.Example/", "http://[::1]:81/"],
                                    ["10.0.0.0/8"])
    assert policy.permits("127.0.0.1", 8080, "127.0.0.1")
    assert not policy.permits("127.0.0.1", 8081, "127.0.0.1")            # same host, another port
    assert policy.permits("::1", 81, "::1")
    # A seed named by host name opens nothing private: its DNS may point the name anywhere.
    assert not policy.permits("intranet.example", 443, "192.168.7.7")
    assert not policy.permits("intranet.example", 443, "169.254.169.254")
    assert policy.permits("intranet.example", 443, "10.1.1.1")            # unless a configured network covers it
    assert policy.permits("anything.example", 80, "10.9.9.9")             # a configured network
    assert not policy.permits("anything.example", 80, "169.254.169.254")
    assert policy.permits("anything.example", 80, "93.184.215.14")        # the public internet
    assert host_port("http://[::1]:81/x") == ("::1", 81) and host_port("mailto:x@y") is None
    assert policy.origins == {("127.0.0.1", 8080), ("::1", 81)}
    assert TargetPolicy([("localhost", 80)], []).origins == frozenset()    # told by a master: names dropped too
    with pytest.raises(ValueError):
        parse_network("not-a-net")


@pytest.fixture
async def servers():
    """Two servers on loopback: the crawl's site, and a 'private service' on another port."""
    async def secret(request):
        return web.Response(text="internal admin page", content_type="text/html")

    inner = web.Application()
    inner.router.add_get("/secret", secret)
    inner_runner = web.AppRunner(inner)
    await inner_runner.setup()
    await web.TCPSite(inner_runner, "127.0.0.1", 0).start()
    inner_url = f"http://127.0.0.1:{inner_runner.addresses[0][1]}"

    async def redirect(request):
        raise web.HTTPFound(inner_url + "/secret")

    async def by_name(request):
        raise web.HTTPFound(f"http://localhost:{request.url.port}/page")

    async def page(request):
        return web.Response(text="<html>site</html>", content_type="text/html")

    site = web.Application()
    site.router.add_get("/redirect", redirect)
    site.router.add_get("/by-name", by_name)
    site.router.add_get("/page", page)
    site_runner = web.AppRunner(site)
    await site_runner.setup()
    await web.TCPSite(site_runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{site_runner.addresses[0][1]}", inner_url
    await site_runner.cleanup()
    await inner_runner.cleanup()


def client_for(policy: TargetPolicy):
    transport = build_transport(max_connections=4, dns_ttl=60, policy=policy)
    return transport, build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=3)


async def test_redirects_and_names_to_unnamed_private_addresses_are_refused(servers):
    site, inner = servers
    transport, client = client_for(TargetPolicy.for_crawl([site + "/"], []))
    try:
        assert (await client.get(site + "/page")).text == "<html>site</html>"
        with pytest.raises(TargetRefused, match="127.0.0.1"):
            await client.get(site + "/redirect")       # every hop is checked, not just the first
        with pytest.raises(TargetRefused, match="localhost"):
            await client.get(site + "/by-name")        # a name for loopback is loopback
        with pytest.raises(FetchError) as e:
            await PageFetcher(Stack(transport, client)).fetch(inner + "/secret", max_bytes=1000)
        assert not e.value.transient                   # refused for good, not retried
    finally:
        await client.aclose()


async def test_an_empty_policy_refuses_loopback_and_a_network_allows_it(servers):
    site, _inner = servers
    _, client = client_for(TargetPolicy())
    try:
        with pytest.raises(TargetRefused):
            await client.get(site + "/page")
    finally:
        await client.aclose()
    _, client = client_for(TargetPolicy([], [parse_network("127.0.0.0/8")]))
    try:
        assert (await client.get(site + "/redirect")).text == "internal admin page"
    finally:
        await client.aclose()


async def test_a_policy_learnt_later_applies_to_cached_answers(servers):
    site, _ = servers
    policy = TargetPolicy([], [parse_network("127.0.0.0/8"), parse_network("::1")])
    _, client = client_for(policy)
    try:
        url = site.replace("127.0.0.1", "localhost") + "/page"
        assert (await client.get(url, headers={"Connection": "close"})).status_code == 200
        policy.allow([], [])                           # the DNS answer is cached; the check is not
        with pytest.raises(httpx.RequestError):
            await client.get(url, headers={"Connection": "close"})
    finally:
        await client.aclose()


class NameResolver(aiohttp.abc.AbstractResolver):
    """DNS as a hostile seed site runs it: its own name answers with whatever address it likes (loopback here)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [{"hostname": host, "host": self.names[host], "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self):
        pass


async def test_a_seed_named_by_host_name_reaches_only_public_addresses_unless_a_network_allows(servers):
    site, inner = servers
    # The seed site points its own name at a private service on the seed's port (here: loopback, another server).
    inner_port = int(inner.rsplit(":", 1)[1])
    seed = f"http://seed.test:{inner_port}/"
    resolver = NameResolver({"seed.test": "127.0.0.1"})
    for networks, allowed in (([], False), (["127.0.0.0/8"], True)):
        policy = TargetPolicy.for_crawl([seed], networks)
        transport = build_transport(max_connections=4, dns_ttl=60, policy=policy, resolver=resolver)
        client = build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=3)
        try:
            if allowed:
                assert (await client.get(seed + "secret")).text == "internal admin page"
            else:
                with pytest.raises(TargetRefused, match="seed.test"):
                    await client.get(seed + "secret")
        finally:
            await client.aclose()
    # A seed named by its IP literal still opens its own host and port, and only those.
    transport, client = client_for(TargetPolicy.for_crawl([inner + "/"], []))
    try:
        assert (await client.get(inner + "/secret")).text == "internal admin page"
        with pytest.raises(TargetRefused):
            await client.get(site + "/page")
    finally:
        await client.aclose()


class CountingResolver(aiohttp.abc.AbstractResolver):
    """Every name answers 93.184.215.14 (public); counts the queries that reach it."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.gate: asyncio.Event | None = None

    async def resolve(self, host, port=0, family=socket.AF_INET):
        self.asked.append(host)
        if self.gate is not None:
            await self.gate.wait()
        return [{"hostname": host, "host": "93.184.215.14", "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self):
        pass


async def test_the_resolver_caches_answers_for_their_ttl_within_its_size_and_checks_each_time():
    now = [0.0]
    dns = CountingResolver()
    policy = TargetPolicy()
    resolver = TargetResolver(policy, ttl=60, max_size=2, resolver=dns, clock=lambda: now[0])
    for _ in range(3):
        assert [h["host"] for h in await resolver.resolve("a.example", 80)] == ["93.184.215.14"]
    assert dns.asked == ["a.example"]
    now[0] = 61.0                                          # the answer expired: asked again
    await resolver.resolve("a.example", 80)
    assert dns.asked == ["a.example"] * 2
    await resolver.resolve("b.example", 80)
    await resolver.resolve("c.example", 80)                # three names in a cache of two: the oldest goes
    await resolver.resolve("a.example", 80)
    assert dns.asked == ["a.example", "a.example", "b.example", "c.example", "a.example"]
    policy.allow([], [parse_network("93.184.0.0/16")])
    dns.asked.clear()
    await resolver.resolve("c.example", 80)
    assert dns.asked == []
    # The policy judges cached answers too, and IP literals without asking DNS.
    resolver.policy = TargetPolicy([("127.0.0.1", 8080)], [])
    with pytest.raises(TargetRefused):
        await resolver.resolve("127.0.0.1", 8081)
    assert [h["host"] for h in await resolver.resolve("127.0.0.1", 8080)] == ["127.0.0.1"]
    resolver.check_literal("127.0.0.1", 8080)
    resolver.check_literal("c.example", 80)                # a name is judged once resolved
    with pytest.raises(TargetRefused):
        resolver.check_literal("::1", 80)
    assert dns.asked == []


async def test_concurrent_look_ups_of_one_name_share_one_query_and_a_cancelled_one_leaves_it_to_the_rest():
    dns = CountingResolver()
    dns.gate = asyncio.Event()
    resolver = TargetResolver(None, ttl=60, max_size=10, resolver=dns)
    first = asyncio.create_task(resolver.resolve("a.example", 80))
    second = asyncio.create_task(resolver.resolve("a.example", 80))
    await asyncio.sleep(0)
    first.cancel()
    dns.gate.set()
    assert [h["host"] for h in await second] == ["93.184.215.14"]
    assert dns.asked == ["a.example"]
