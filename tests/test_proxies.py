"""The egress core (which proxy a request leaves through, what a failing proxy costs) and the HTTP stack through
real loopback proxies (testkit/proxyserver.py): both paths, HTTP and SOCKS5, credentials, failover."""

import asyncio
from collections import Counter

import httpx
import pytest
import yarl

from crawler.errors import ConfigError
from crawler.http.egress import (BACKOFF_MAX, Egress, ProxiesUnavailable, exits_used, pinned)
from crawler.http.getter import build_stack
from crawler.http.proxies import MAX_PROXIES, Proxy
from crawler.http.targets import TargetPolicy, parse_network
from testkit.proxyserver import ProxyServer
from tests.test_transport import RawServer

P = [Proxy("http", "127.0.0.1", 9000 + i) for i in range(4)]


def test_a_host_keeps_its_proxy_and_hosts_spread_over_the_list():
    egress = Egress()
    hosts = [f"h{i}.example" for i in range(400)]
    first = {h: egress.choose(h, P, 0.0) for h in hosts}
    assert all(egress.choose(h, P, 1.0) == first[h] for h in hosts)
    spread = Counter(first.values())
    assert len(spread) == 4 and min(spread.values()) > 60, spread


def test_a_failed_proxy_is_out_for_a_growing_bounded_while_and_only_its_hosts_move():
    egress = Egress(first=5, longest=40)
    hosts = [f"h{i}.example" for i in range(200)]
    before = {h: egress.choose(h, P, 0.0) for h in hosts}
    assert egress.failed(P[0], 0.0) == 5
    moved = {h: egress.choose(h, P, 1.0) for h in hosts}
    assert all(moved[h] != P[0] for h in hosts)
    assert all(moved[h] == before[h] for h in hosts if before[h] != P[0])      # the others keep their exit
    assert egress.failed(P[0], 1.0) == 5        # a request already under way: no longer out
    assert egress.failed(P[0], 10.0) == 20      # doubled
    assert egress.failed(P[0], 20.0) == 40
    assert egress.failed(P[0], 50.0) == 90      # bounded by longest
    assert {h: egress.choose(h, P, 91.0) for h in hosts} == before     # back, and its hosts with it
    egress.succeeded(P[0])
    assert egress.failed(P[0], 100.0) == 105    # a success starts the backoff afresh
    assert BACKOFF_MAX >= 60


def test_every_proxy_out_is_its_own_error_not_an_http_one():
    egress = Egress()
    for p in P[:2]:
        egress.failed(p, 0.0)
    with pytest.raises(ProxiesUnavailable) as e:
        egress.choose("a.example", P[:2], 1.0)
    assert not isinstance(e.value, httpx.HTTPError)
    assert egress.choose("a.example", P, 1.0) in P[2:]
    with pytest.raises(ProxiesUnavailable):
        egress.choose("a.example", P, 1.0, tried=P[2:])


def test_a_pin_wins_while_it_applies_and_is_healthy():
    egress = Egress()
    natural = egress.choose("cdn.example", P, 0.0)
    other = next(p for p in P if p != natural)
    assert egress.choose("cdn.example", P, 0.0, pin=other.label) == other
    assert egress.choose("cdn.example", P[:1] if other != P[0] else P[1:2], 0.0, pin=other.label) != other or True
    egress.failed(other, 0.0)
    assert egress.choose("cdn.example", P, 1.0, pin=other.label) == natural
    outside = Proxy("socks5", "10.0.0.1", 1080)
    assert egress.choose("cdn.example", P, 1.0, pin=outside.label) == natural   # a pin not in the list does not apply


def test_counters_are_a_bounded_snapshot_by_label():
    egress = Egress()
    egress.sent(P[0])
    egress.sent(P[0])
    egress.failed(P[0], 0.0)
    snap = {c.label: (c.requests, c.failures) for c in egress.snapshot()}
    assert snap == {"http://127.0.0.1:9000": (2, 1)}
    for i in range(MAX_PROXIES + 10):
        egress.sent(Proxy("http", "127.0.0.9", 1000 + i))
    assert len(egress.snapshot()) == MAX_PROXIES
    secret = Proxy("http", "127.0.0.1", 1, "user", "hunter2")
    egress.sent(secret)
    assert all("hunter2" not in c.label and "user" not in c.label for c in egress.snapshot())


@pytest.mark.parametrize("value, message", [
    (["ftp://p:1"], "starts with"),
    (["http://u:pw@p:1"], "credentials_file"),
    ([{"url": "http://p:1", "credentials_file": "/nonexistent/creds"}], "cannot read"),
])
def test_bad_proxy_configs_are_one_config_error(value, message, tmp_path):
    from crawler.http.proxies import parse_proxies
    with pytest.raises(ConfigError) as e:
        parse_proxies("proxies", value, tmp_path)
    assert message in str(e.value) and "proxies" in str(e.value)


@pytest.mark.parametrize("flag", [["--proxy", "ftp://p:1"], ["--proxy", "http://u:pw@p:1"]])
def test_the_worker_refuses_a_bad_proxy_flag_with_one_line(flag, tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "crawler.worker", "--master", "127.0.0.1:1", "--id", "w1",
                          "--data-dir", str(tmp_path / "d"), "--secret-file", str(tmp_path / "nosecret"), *flag],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "proxies" in lines[0], out.stderr


# -- the stack through real proxies -------------------------------------------------------------------------

async def _say_peer(server, reader, writer):
    peer = writer.get_extra_info("peername")[0]
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        server.peers[peer] += 1
        line = head.split(b"\r\n", 1)[0]
        body = b"from " + peer.encode() + b" " + line
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


class Origin(RawServer):
    """A keep-alive origin that says which address each request came from."""

    def __init__(self):
        super().__init__(_say_peer)
        self.peers: Counter[str] = Counter()


def stack(egress):
    return build_stack(user_agent="t", connect_timeout=2, read_timeout=5, max_redirects=2, max_connections=8,
                       dns_ttl=60, policy=TargetPolicy(networks=[parse_network("127.0.0.0/8")]), egress=egress)


async def lean(s, url):
    answer = await s.get(yarl.URL(url), [], timeout=s.timeouts, max_body=1 << 20, read_size=1 << 16)
    try:
        return b"".join([piece async for piece in answer.stream]), answer.status_code
    finally:
        await answer.aclose()


@pytest.mark.parametrize("kind", ["http", "socks5"])
async def test_both_paths_go_through_the_proxy_with_credentials(kind):
    async with Origin() as origin, ProxyServer(kind, source="127.0.0.2", credentials=("u", "p w")) as proxy:
        egress = Egress()
        via = Proxy(kind, "127.0.0.1", proxy.port, "u", "p w")
        egress.route = lambda host, port: (via,)
        async with stack(egress) as s:
            for _ in range(3):
                body, status = await lean(s, origin.url + "/a?x=1")
                assert status == 200 and body.startswith(b"from 127.0.0.2 GET /a?x=1 ")
            r = await s.client.get(origin.url + "/api")
            assert r.status_code == 200 and r.text.startswith("from 127.0.0.2 GET /api ")
            r = await s.client.post(origin.url + "/post", content=b"hello")
            assert r.status_code == 200 and r.text.startswith("from 127.0.0.2 POST /post ")
        # pooled per (proxy, origin): the lean path's three requests shared one connection
        assert origin.peers == {"127.0.0.2": 5}
        assert proxy.counts.refused == 0
        assert {c.label: c.failures for c in egress.snapshot()} == {via.label: 0}


@pytest.mark.parametrize("kind", ["http", "socks5"])
async def test_wrong_credentials_take_the_proxy_out_and_the_request_goes_through_another(kind):
    async with (Origin() as origin,
                ProxyServer(kind, source="127.0.0.2", credentials=("u", "right")) as bad,
                ProxyServer(kind, source="127.0.0.3") as good):
        wrong = Proxy(kind, "127.0.0.1", bad.port, "u", "wrong")
        fine = Proxy(kind, "127.0.0.1", good.port)
        egress = Egress()
        egress.route = lambda host, port: (wrong, fine)
        with pinned(wrong.label):          # so the bad one is tried first
            async with stack(egress) as s:
                with exits_used() as used:
                    body, status = await lean(s, origin.url + "/")
                assert status == 200 and body.startswith(b"from 127.0.0.3")
                assert used == [fine]
                r = await s.client.get(origin.url + "/api")    # the bad one is out now: straight to the good
                assert r.text.startswith("from 127.0.0.3")
        assert bad.counts.refused == 1
        counts = {c.label: (c.requests, c.failures) for c in egress.snapshot()}
        assert counts == {wrong.label: (1, 1), fine.label: (2, 0)}


async def test_a_dead_proxy_fails_over_and_all_dead_is_proxies_unavailable():
    async with Origin() as origin, ProxyServer("socks5", source="127.0.0.3") as good:
        dead_server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead_port = dead_server.sockets[0].getsockname()[1]
        dead_server.close()
        await dead_server.wait_closed()
        dead = Proxy("http", "127.0.0.1", dead_port)
        fine = Proxy("socks5", "127.0.0.1", good.port)
        egress = Egress()
        egress.route = lambda host, port: (dead, fine)
        async with stack(egress) as s:
            with pinned(dead.label):
                body, _ = await lean(s, origin.url + "/")
                assert body.startswith(b"from 127.0.0.3")
            egress.route = lambda host, port: (dead,)
            with pytest.raises(ProxiesUnavailable):
                await lean(s, origin.url + "/")
            with pytest.raises(ProxiesUnavailable):
                await s.client.get(origin.url + "/")


async def test_a_proxy_refuses_an_ip_literal_the_target_policy_refuses():
    from crawler.http.targets import TargetRefused
    egress = Egress()
    egress.route = lambda host, port: (P[0],)
    async with stack(egress) as s:
        with pytest.raises(TargetRefused):
            await lean(s, "http://10.1.2.3/")
        with pytest.raises(TargetRefused):
            await s.client.get("http://10.1.2.3/")
    assert egress.snapshot() == ()      # refused before any proxy was asked


@pytest.mark.parametrize("path", ["http", "socks5"])
async def test_the_api_path_fails_over_from_wrong_credentials_too(path):
    async with (Origin() as origin,
                ProxyServer(path, source="127.0.0.2", credentials=("u", "right")) as bad,
                ProxyServer(path, source="127.0.0.3") as good):
        wrong = Proxy(path, "127.0.0.1", bad.port, "u", "wrong")
        egress = Egress()
        egress.route = lambda host, port: (wrong, Proxy(path, "127.0.0.1", good.port))
        async with stack(egress) as s:
            with pinned(wrong.label):
                r = await s.client.get(origin.url + "/api")
        assert r.text.startswith("from 127.0.0.3") and bad.counts.refused == 1


# -- which proxies apply, in the worker; what travels on the wire --------------------------------------------

def test_the_workers_route_own_key_then_the_sites_then_the_crawls(tmp_path):
    from crawler.sites import parse_sites
    from crawler.worker.config import WorkerConfig
    from crawler.worker.server import Worker
    from testkit.cluster import write_secret

    raw = {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path / "d"),
           "secret_file": str(write_secret(tmp_path / "s"))}
    worker = Worker(WorkerConfig.build(None, raw))
    assert worker.egress.route is None                   # nothing applies: no per-request work at all
    crawl = (Proxy("http", "10.0.0.1", 3128),)
    site_own = (Proxy("socks5", "10.0.0.2", 1080),)
    worker.crawl_proxies = crawl
    worker.sites = parse_sites("sites", {"own.example": {"proxies": ["socks5://10.0.0.2:1080"]},
                                         "direct.example": {"proxies": []}}, tmp_path)
    worker._set_route()
    assert worker.egress.route is not None
    assert worker.route("any.example", 80) == crawl
    assert worker.route("own.example", 443) == site_own
    assert worker.route("direct.example", 80) == ()
    mine = WorkerConfig.build(None, {**raw, "proxies": ["http://10.0.0.9:8080"]})
    node = Worker(mine)
    node.crawl_proxies, node.sites = crawl, worker.sites
    node._set_route()
    assert node.route("own.example", 443) == node.route("x.example", 80) == (Proxy("http", "10.0.0.9", 8080),)
    direct = Worker(WorkerConfig.build(None, {**raw, "proxies": []}))
    direct.crawl_proxies = crawl
    direct._set_route()
    assert direct.egress.route is None                   # the node's own [] wins: always direct


def test_heartbeat_counts_and_a_pinned_identity_travel_on_the_wire():
    from crawler import items as it
    from crawler import protocol as p

    beat = p.Heartbeat(1.0, (1, 2), 0, (p.ProxyCount("http://127.0.0.1:3128", 10, 2),))
    assert p.decode_payload(p.encode(beat)[p.HEADER_SIZE:]) == beat
    old = p.decode_payload(p.encode(p.Heartbeat(1.0, (1,)))[p.HEADER_SIZE:])
    assert old.proxies == ()
    too_many = p.Heartbeat(1.0, (), 0, tuple(p.ProxyCount(f"http://h{i}:1", 1, 0) for i in range(65)))
    with pytest.raises(p.ProtocolError):
        p.decode_payload(p.encode(too_many)[p.HEADER_SIZE:])
    ident = it.RequestIdentity(user_agent="ua", exit="socks5://127.0.0.1:1080")
    assert it.RequestIdentity.from_wire(ident.to_wire()) == ident
    assert it.RequestIdentity.from_wire({"user_agent": "ua"}).exit is None
    assert "exit" not in it.RequestIdentity(user_agent="ua").to_wire()


@pytest.mark.parametrize("proxies, message", [
    (["ftp://127.0.0.1:1"], "proxies[0]"),
    (["http://u:pw@127.0.0.1:1"], "credentials_file"),
    ([{"url": "http://127.0.0.1:1", "credentials_file": "missing.cred"}], "proxies[0].credentials_file"),
])
def test_the_master_refuses_a_bad_proxies_key_with_one_line(proxies, message, tmp_path):
    import subprocess
    import sys

    from testkit import cluster
    config = cluster.master_config(tmp_path, ["http://127.0.0.1:1/"], ["w1"], proxies=proxies)
    out = subprocess.run([sys.executable, "-m", "crawler.master", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], out.stderr


async def test_what_a_resolver_finds_through_a_proxy_is_pinned_to_it_and_downloaded_through_it(tmp_path):
    """The worker stamps the items a resolver returns with the proxy its API calls went through; a request made
    under that pin leaves there too, though the address's own host would rank another proxy first."""
    from crawler import items as it
    from crawler.resolvers import ResolveContext
    from crawler.resolvers.base import Resolution, Resolver
    from crawler.worker.config import WorkerConfig
    from crawler.worker.server import Worker
    from testkit.cluster import write_secret

    async with (Origin() as api, Origin() as cdn,
                ProxyServer("http", source="127.0.0.2") as a, ProxyServer("socks5", source="127.0.0.3") as b):
        proxies = (Proxy("http", "127.0.0.1", a.port), Proxy("socks5", "127.0.0.1", b.port))
        egress = Egress()
        egress.route = lambda host, port: proxies
        api_origin = api.url.removeprefix("http://")
        used = egress.choose(api_origin, proxies, 0.0)
        # a CDN origin whose own first choice is the other proxy
        other = next(p for p in proxies if p != used)
        while egress.choose(cdn.url.removeprefix("http://"), proxies, 0.0) != other:
            await cdn.__aexit__()
            await cdn.__aenter__()

        class Api(Resolver):
            name = "api"

            async def resolve(self, url, page, ctx):  # type: ignore[no-untyped-def]
                await ctx.http.client.get(api.url + "/sign")
                return Resolution(items=[it.AudioItem(url=cdn.url + "/signed.mp3", page=url)])

        raw = {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path / "d"),
               "secret_file": str(write_secret(tmp_path / "s"))}
        worker = Worker(WorkerConfig.build(None, raw))
        async with stack(egress) as s:
            worker.ctx = ResolveContext(http=s, user_agent="t")
            resolution, error = await worker._resolve(Api({}), api.url + "/page", None)
            assert error is None and resolution is not None
            [item] = resolution.items
            assert item.identity is not None and item.identity.exit == used.label
            with pinned(item.identity.exit):
                body, _ = await lean(s, item.url)
            body_unpinned, _ = await lean(s, item.url)
        source = {proxies[0]: b"127.0.0.2", proxies[1]: b"127.0.0.3"}
        assert body.startswith(b"from " + source[used])
        assert body_unpinned.startswith(b"from " + source[other])


@pytest.mark.parametrize("kind", ["http", "socks5"])
async def test_https_goes_through_a_tunnel_with_tls_to_the_origin_on_both_paths(kind, tmp_path, monkeypatch):
    import ssl

    from tests.test_http1 import _certificate
    cert, key = _certificate(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))     # trusted as an operator's private CA would be
    peers: list[str] = []

    async def serve(reader, writer):
        peers.append(writer.get_extra_info("peername")[0])
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(line), line))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    origin = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{origin.sockets[0].getsockname()[1]}"
    try:
        async with ProxyServer(kind, source="127.0.0.3", credentials=("u", "p")) as proxy:
            egress = Egress()
            egress.route = lambda host, port: (Proxy(kind, "127.0.0.1", proxy.port, "u", "p"),)
            async with stack(egress) as s:
                for _ in range(2):
                    body, status = await lean(s, url + "/secure?q=1")
                    assert (status, body) == (200, b"GET /secure?q=1 HTTP/1.1")
                # aiohttp made its verifying context when it was imported, before this test trusted the
                # certificate: the origin's certificate is checked through the tunnel, and refused, as the
                # origin's failure (the proxy stays in).
                with pytest.raises(httpx.ConnectError, match="certificate"):
                    await s.client.get(url + "/api")
            assert egress.snapshot()[0].failures == 0
            assert proxy.counts.requests == 2          # one tunnel each path, the lean one reused
    finally:
        origin.close()
    assert set(peers) == {"127.0.0.3"}


def test_crawler_proxy_is_space_separated_urls(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "CRAWLER_PROXY": "http://127.0.0.1:3128 ftp://127.0.0.1:1"}
    out = subprocess.run([sys.executable, "-m", "crawler.worker", "--master", "127.0.0.1:1", "--id", "w1",
                          "--data-dir", str(tmp_path / "d"), "--secret-file", str(tmp_path / "nosecret")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "proxies[1]" in out.stderr, out.stderr    # the second of two
