"""Addresses the crawler may reach: checked after DNS, on every connection and redirect hop."""

import httpx
import pytest
from aiohttp import web

from crawler.targets import TargetPolicy, TargetRefused, is_public, parse_network
from crawler.web.urls import host_port
from crawler.worker.fetcher import FetchError, PageFetcher, build_client, build_transport


@pytest.mark.parametrize(("address", "public"), [
    ("93.184.215.14", True), ("2606:4700::6810:84e5", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("10.1.2.3", False), ("172.16.0.1", False),
    ("192.168.1.1", False), ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("239.255.255.250", False), ("240.0.0.1", False), ("255.255.255.255", False),
    ("fe80::1", False), ("fe80::1%eth0", False), ("fc00::1", False), ("ff02::1", False), ("::", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("192.0.2.1", False), ("198.18.0.1", False),
])
def test_special_addresses_are_not_public(address, public):
    assert is_public(address) is public


def test_policy_allows_named_origins_and_networks_only():
    policy = TargetPolicy.for_crawl(["http://127.0.0.1:8080/", "https://Intranet.Example/"], ["10.0.0.0/8"])
    assert policy.permits("127.0.0.1", 8080, "127.0.0.1")
    assert not policy.permits("127.0.0.1", 8081, "127.0.0.1")            # same host, another port
    assert policy.permits("intranet.example", 443, "192.168.7.7")         # the seed names it, whatever it resolves to
    assert not policy.permits("intranet.example", 80, "192.168.7.7")
    assert policy.permits("anything.example", 80, "10.9.9.9")             # a configured network
    assert not policy.permits("anything.example", 80, "169.254.169.254")
    assert policy.permits("anything.example", 80, "93.184.215.14")        # the public internet
    assert host_port("http://[::1]:81/x") == ("::1", 81) and host_port("mailto:x@y") is None
    # A seed's host as the connector will see it: IDNA-encoded.
    assert ("xn--mnchen-3ya.example", 80) in TargetPolicy.for_crawl(["http://München.example/"], []).origins
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
            await PageFetcher(transport, client).fetch(inner + "/secret", max_bytes=1000)
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
    policy = TargetPolicy([("localhost", int(site.rsplit(":", 1)[1]))], [])
    _, client = client_for(policy)
    try:
        url = site.replace("127.0.0.1", "localhost") + "/page"
        assert (await client.get(url, headers={"Connection": "close"})).status_code == 200
        policy.allow([], [])                           # the DNS answer is cached; the check is not
        with pytest.raises(httpx.RequestError):
            await client.get(url, headers={"Connection": "close"})
    finally:
        await client.aclose()
