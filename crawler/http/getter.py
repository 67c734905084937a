"""What the crawler's HTTP users take: a Getter, one stack's GETs under that stack's bounds.

The page fetcher, the downloader, the resolvers and the master's robots.txt fetch do not build HTTP stacks of
their own, each with its own timeouts, body cap and target check: they are handed a Getter. It offers two ways
into the same connections, DNS cache and target policy:

- ``get``: one GET on the lean path (http1.py), no redirect followed, the answer once its head is in; the caller
  iterates ``answer.stream`` and closes the answer. Page fetches and downloads: they want nothing else and cannot
  afford more per request;
- ``client``: the same stack behind httpx's API (redirects, query building, JSON): resolvers' API calls, playlists,
  the robots.txt fetch.

``timeouts`` are the stack's own (connect, read, pool, total), a caller's starting point; the request headers its
client's (User-Agent, Accept-Encoding naming the codings bodies.py decodes).

Stack is the crawler's Getter (build_stack makes one); ClientGetter wraps any httpx client, for tools and tests
that hand a plain one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Protocol

import httpx
import yarl

from crawler.archive import NO_ARCHIVE, Archive, NoArchive
from crawler.http.egress import Egress
from crawler.http.http1 import Answer, Timeouts
from crawler.http.recording import RecordingTransport
from crawler.http.targets import Dns, TargetPolicy
from crawler.http.transport import DNS_CACHE_SIZE, AiohttpTransport, build_client, build_transport


class Getter(Protocol):
    @property
    def client(self) -> httpx.AsyncClient: ...

    @property
    def timeouts(self) -> Timeouts: ...

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts, max_body: int,
                  read_size: int, cut: bool = False) -> Answer:
        """GET url; max_body caps the decoded body (past it BodyError, or with ``cut`` the body ends one byte past
        the cap), read_size bounds the bytes waiting for the reader. Raises httpx's errors (TargetRefused and
        BodyError among them)."""
        ...


class Stack:
    """The crawler's HTTP stack: the aiohttp transport (its lean path for ``get``) and the httpx client over it."""

    def __init__(self, transport: AiohttpTransport, client: httpx.AsyncClient) -> None:
        """client: an httpx client whose transport is ``transport``."""
        self._transport = transport
        self._client = client
        t = client.timeout
        self._timeouts: Timeouts = (t.connect, t.read, t.pool, transport.total_timeout)

    @property
    def client(self) -> httpx.AsyncClient:
        return self._client

    @property
    def timeouts(self) -> Timeouts:
        return self._timeouts

    @property
    def egress(self) -> Egress | None:
        """The proxies this stack's requests go through: the browser's connections take the same way."""
        return self._transport.egress

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts, max_body: int,
                  read_size: int, cut: bool = False) -> Answer:
        return await self._transport.get(url, headers, timeout=timeout, max_body=max_body, read_size=read_size,
                                         cut=cut)

    async def aclose(self) -> None:
        await self._client.aclose()          # and the transport under it

    async def __aenter__(self) -> Stack:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


def build_stack(*, user_agent: str, connect_timeout: float, read_timeout: float, max_redirects: int,
                max_connections: int, dns_ttl: float, max_body: int = 5 * 1024 * 1024,
                total_timeout: float | None = None, policy: TargetPolicy | None = None,
                dns_cache_size: int = DNS_CACHE_SIZE, resolver: Dns | None = None,
                archive: Archive = NO_ARCHIVE, role: str | None = "api",
                clock: Callable[[], float] = time.time, egress: Egress | None = None) -> Stack:
    """A stack as build_transport and build_client make its parts.

    archive: where the client's exchanges go (recording.py), each recorded as ``role`` unless the request or its
    context names another (None: only those); clock its wall-clock time. With NO_ARCHIVE the client talks to the
    transport directly. The lean path (``get``) is not recorded here: its callers record what they fetch.

    egress: the proxies requests go through (crawler/http/egress.py), both paths alike; None: always direct."""
    transport = build_transport(max_connections=max_connections, dns_ttl=dns_ttl, max_body=max_body,
                                total_timeout=total_timeout, policy=policy, dns_cache_size=dns_cache_size,
                                resolver=resolver, egress=egress)
    under: httpx.AsyncBaseTransport = transport
    if not isinstance(archive, NoArchive):
        under = RecordingTransport(transport, archive, role=role, clock=clock)
    return Stack(transport, build_client(under, user_agent=user_agent, connect_timeout=connect_timeout,
                                         read_timeout=read_timeout, max_redirects=max_redirects))


class _ResponseBody:
    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._response.aiter_raw()

    async def aclose(self) -> None:
        await self._response.aclose()


class ClientGetter:
    """A Getter over any httpx client: ``get`` sends through the client's public API, redirects not followed.

    Its bounds are the client's transport's: the crawler's transport honours the ``max_body``, ``read_size``,
    ``cut_body`` and ``total_timeout`` extensions ``get`` sets, another transport ignores them."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        t = client.timeout
        self._timeouts: Timeouts = (t.connect, t.read, t.pool, None)

    @property
    def client(self) -> httpx.AsyncClient:
        return self._client

    @property
    def timeouts(self) -> Timeouts:
        return self._timeouts

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts, max_body: int,
                  read_size: int, cut: bool = False) -> Answer:
        connect, read, pool, total = timeout
        extensions: dict[str, Any] = {"max_body": max_body, "read_size": read_size, "cut_body": cut}
        if total is not None:
            extensions["total_timeout"] = total
        request = self._client.build_request(
            "GET", str(url), headers=headers, extensions=extensions,
            timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=pool))
        response = await self._client.send(request, stream=True, follow_redirects=False)
        return Answer(response.status_code, tuple(response.headers.raw), response.extensions,
                      _ResponseBody(response))

    async def aclose(self) -> None:
        await self._client.aclose()
