"""The request headers of a URL by its site: one definition for every request a worker makes.

A site's policy (crawler/sites.py, from the master's Welcome) may name its own ``user_agent`` and extra
``headers``. They go on every request to that site, whatever kind: page fetches (fetcher.py), downloads
(downloader.py, and HLS/DASH segments and playlists through the client), resolvers' API calls and the
browser's context. What wins, from first to last:

1. the HTTP layer's own headers (Host, Range, validators, Accept-Encoding, Cookie): a site cannot set them
   (crawler/sites.py RESERVED_HEADERS);
2. a resolver's client identity for an item (items.RequestIdentity: Kugou's user agent, a Referer): a signed
   address is bound to the client that resolved it, so it is fetched as that client, site or not; likewise a
   header a resolver sets on its own API request;
3. the site's ``user_agent`` and ``headers``;
4. the worker's own (its config's ``user_agent``, the client's defaults).

robots.txt is read by the master for the crawl's product token (politeness.user_agent), not a site's user agent.

Cheap when no site matches (the common case): the lookup is one check of an empty table, and nothing is built per
request; a site's headers are worked out once per origin and kept (a bounded cache).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from crawler.sites import SiteTable
from crawler.web.urls import host_port

_APPLIED = "crawler.site_headers"   # a request extension: the SiteHeaders the hook put on it


@dataclass(frozen=True, slots=True)
class SiteHeaders:
    """A site's own request headers: its user agent (None: the worker's) and its extra headers."""

    user_agent: str | None
    headers: tuple[tuple[str, str], ...]

    def overrides(self) -> dict[str, str]:
        """As a mapping to lay under an identity's (a dict update order: the site's first, then the identity)."""
        out = dict(self.headers)
        if self.user_agent:
            out["User-Agent"] = self.user_agent
        return out

    def over(self, base: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """base (the worker's headers, as a list) with the site's set over it."""
        names = {k.lower() for k, _ in self.headers}
        if self.user_agent:
            names.add("user-agent")
        out = [(k, v) for k, v in base if k.lower() not in names]
        if self.user_agent:
            out.append(("User-Agent", self.user_agent))
        out.extend(self.headers)
        return out


class SiteRules:
    """The sites' request headers, looked up by host and port (the URL's, default included)."""

    def __init__(self, table: SiteTable | None = None) -> None:
        self.set_table(table if table is not None else SiteTable())

    def set_table(self, table: SiteTable) -> None:
        """A new Welcome's sites: every holder of this object sees them at once."""
        self.table = table
        # Each site's headers made once (the table remembers which site a host is of).
        self._headers = {p.pattern: SiteHeaders(p.user_agent, p.headers) for p in table.policies
                         if p.user_agent is not None or p.headers}

    def __bool__(self) -> bool:
        return bool(self.table)

    def of(self, host: str | None, port: int | None) -> SiteHeaders | None:
        """The site headers for a request to host:port, or None (no site, or one that sets neither)."""
        if not self._headers or not host:
            return None
        p = self.table.lookup(host.lower().strip("[]"), port)
        return None if p is None else self._headers.get(p.pattern)

    def of_url(self, url: str) -> SiteHeaders | None:
        if not self.table:
            return None
        hp = host_port(url)
        return None if hp is None else self.of(*hp)

    def user_agent(self, url: str) -> str | None:
        """The site's user agent for a request to url (None: the worker's), where no resolver's identity names
        one."""
        site = self.of_url(url)
        return site.user_agent if site is not None else None

    def hook(self, default_user_agent: str) -> Callable[[httpx.Request], Awaitable[None]]:
        """An httpx request hook that puts the site's headers on a client's requests (resolvers' API calls,
        playlists, HLS/DASH segments): the site's user agent where the request carries the client's default,
        the site's headers where the request has not set the same one (a resolver's own, or an identity's,
        wins)."""
        default = default_user_agent

        async def on_request(request: httpx.Request) -> None:
            url = request.url
            site = self.of(url.host, url.port or (443 if url.scheme == "https" else 80))
            # A redirect's request starts as a copy of the one before, headers and extensions alike: what a site
            # put on it must not follow it to another host (an API key, say).
            before = request.extensions.get(_APPLIED)
            if before is site:
                return
            h = request.headers
            if before is not None:
                if before.user_agent and h.get("user-agent") == before.user_agent:
                    h["User-Agent"] = default
                for k, v in before.headers:
                    if h.get(k) == v:
                        del h[k]
            if site is not None:
                if site.user_agent and h.get("user-agent", default) == default:
                    h["User-Agent"] = site.user_agent
                for k, v in site.headers:
                    if k not in h:
                        h[k] = v
            request.extensions = {**request.extensions, _APPLIED: site}

        return on_request


def install(client: httpx.AsyncClient, rules: SiteRules) -> None:
    """Put rules' hook on client (once; none while no site sets headers, so the client costs what it did)."""
    hooks = client.event_hooks
    kept = [h for h in hooks.get("request", []) if not getattr(h, "_site_rules", False)]
    if any(p.user_agent is not None or p.headers for p in rules.table.policies):
        hook = rules.hook(str(client.headers.get("user-agent", "")))
        hook._site_rules = True   # type: ignore[attr-defined]
        kept.append(hook)
    client.event_hooks = {**hooks, "request": kept}
