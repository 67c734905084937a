"""Per-site figures for the status: what each site of the ``sites:`` table (crawler/sites.py) has cost and is
costing now.

Pure and bounded: counts by site pattern (at most MAX_SITES of them), the origins a site's pages and downloads
went to (at most MAX_ORIGINS each, the ones in the gates' figures), and a site lookup cached per origin. Nothing
is kept at all when the crawl has no sites. The counts are this run's (the store keeps the crawl's by node).

For each site: pages done, failed and in flight, audio items found at its hosts, the delay in force (the largest
over its hosts in use: its min_delay, a robots.txt Crawl-delay, the adaptive delay) against its own, and its
pages' and downloads' in flight against their max_per_host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from crawler import protocol as p
from crawler.politeness import HostGate
from crawler.sites import SiteTable
from crawler.web.urls import host_url_of

MAX_ORIGINS = 64     # origins of one site whose gates are read for its figures


class _Counts:
    __slots__ = ("audio", "done", "failed", "origins")

    def __init__(self) -> None:
        self.done = 0
        self.failed = 0
        self.audio = 0
        self.origins: dict[str, None] = {}


class SiteStats:
    def __init__(self, table: SiteTable) -> None:
        self.table = table
        self._counts: dict[str, _Counts] = {pol.pattern: _Counts() for pol in table.policies}

    def __bool__(self) -> bool:
        return bool(self.table)

    def site_of(self, origin: str) -> str | None:
        """The pattern of the site an origin (scheme://host[:port]) belongs to, or None."""
        pol = self.table.lookup_url(origin)
        return None if pol is None else pol.pattern

    def _counts_of(self, url: str) -> _Counts | None:
        try:
            origin = host_url_of(url)
        except ValueError:
            return None
        site = self.site_of(origin)
        if site is None:
            return None
        c = self._counts[site]
        if origin not in c.origins and len(c.origins) < MAX_ORIGINS:
            c.origins[origin] = None
        return c

    def pages(self, results: Iterable[p.Result]) -> None:
        """A report's page outcomes (a retry is neither done nor failed: the page is still to do)."""
        if not self.table:
            return
        for r in results:
            if r.status == p.RETRY:
                continue
            c = self._counts_of(r.url)
            if c is not None:
                if r.status == p.DONE:
                    c.done += 1
                else:
                    c.failed += 1

    def audio(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Catalogue rows added: each counts for the site of its audio address."""
        if not self.table:
            return
        for row in rows:
            url = row.get("url")
            if isinstance(url, str) and url and (c := self._counts_of(url)) is not None:
                c.audio += 1

    def view(self, pages: HostGate | None, downloads: HostGate | None,
             waiting: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """The figures by site pattern, JSON-able, in the table's order. waiting: the sites waiting for their
        login (Crawl.waiting_view), shown as login_waiting (None for a site that does not wait)."""
        waiting = waiting or {}
        out: dict[str, dict[str, Any]] = {}
        for pol in self.table.policies:
            c = self._counts[pol.pattern]
            sp = pol.politeness
            in_flight = audio_in_flight = 0
            delay = 0.0
            max_per_host = sp.max_per_host if sp.max_per_host is not None or pages is None \
                else pages.cfg.max_per_host
            min_delay = sp.min_delay if sp.min_delay is not None or pages is None else pages.cfg.min_delay
            audio_max = sp.audio_max_per_host if sp.audio_max_per_host is not None or downloads is None \
                else downloads.cfg.max_per_host
            audio_delay = sp.audio_min_delay if sp.audio_min_delay is not None or downloads is None \
                else downloads.cfg.min_delay
            for origin in c.origins:
                if pages is not None:
                    in_flight += pages.in_flight(origin)
                    delay = max(delay, pages.delay(origin))
                    lim = pages.limits(origin)
                    max_per_host, min_delay = lim.max_per_host, lim.min_delay
                if downloads is not None:
                    audio_in_flight += downloads.in_flight(origin)
                    audio_max = downloads.limits(origin).max_per_host
            out[pol.pattern] = {
                "pages_done": c.done, "pages_failed": c.failed, "pages_in_flight": in_flight,
                "audio": c.audio, "audio_in_flight": audio_in_flight,
                "delay_s": round(max(delay, min_delay or 0.0), 3),
                "min_delay_s": min_delay, "max_per_host": max_per_host, "audio_max_per_host": audio_max,
                "audio_min_delay_s": audio_delay, "max_depth": pol.max_depth,
                "user_agent": pol.user_agent is not None, "headers": len(pol.headers),
                "hosts": len(c.origins),
                "login_waiting": dict(w) if (w := waiting.get(pol.pattern)) is not None else None,
            }
        return out
