"""A loopback site for politeness measurements: a flat set of pages, a latency, throttling, a request log.

The home page links to every page; a page links to nothing. Each request is logged when it arrives and when
its answer goes out (time.monotonic()), so the spacing and concurrency a crawl really kept can be read back.
The site can answer slowly (a fixed latency, or one that the caller changes while a crawl runs) and can answer
429 or 503 with a Retry-After for a while, as an overloaded site does. robots.txt is 404 (no rules) unless one
is given.

Used by the politeness benchmark and the end-to-end tests; in-process (`async with PoliteSite(...)`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web

from testkit.loopback import LoopbackSite


@dataclass(frozen=True, slots=True)
class Hit:
    start: float      # time.monotonic() when the request arrived
    end: float        # when its answer was written
    path: str
    status: int
    agent: str        # the User-Agent: tells the workers apart when each is given its own


class PoliteSite(LoopbackSite):
    def __init__(self, pages: int, *, latency: float = 0.0, robots: bytes | None = None) -> None:
        self.pages = pages
        self.robots = robots                  # served as /robots.txt (200) when given
        self.latency = latency                # seconds before each page answer; may be changed while running
        self.throttle_until = -1.0            # requests arriving before this (monotonic) get throttle_status
        self.throttle_status = 429
        self.retry_after: str | None = None   # the Retry-After header sent with a throttled answer
        self._armed: float | None = None      # throttle for this long from the first page request
        self.hits: list[Hit] = []
        self._in_flight = 0
        self.max_in_flight = 0
        self._runner: web.ServerRunner | None = None
        self.url = ""

    def page_url(self, i: int) -> str:
        return f"{self.url}/p/{i}.html"

    def throttle(self, seconds: float, *, status: int = 429, retry_after: str | None = None) -> None:
        """Answer every request arriving in the next `seconds` with status (and Retry-After)."""
        self.throttle_status = status
        self.retry_after = retry_after
        self.throttle_until = time.monotonic() + seconds

    def throttle_from_first_page(self, seconds: float, *, status: int = 429, retry_after: str | None = None) -> None:
        """Like throttle(), but the `seconds` start when the first page (not the home page) is asked for."""
        self.throttle_status = status
        self.retry_after = retry_after
        self._armed = seconds

    def page_hits(self, *, status: int | None = None) -> list[Hit]:
        return [h for h in self.hits if h.path.startswith("/p/") and (status is None or h.status == status)]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.monotonic()
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        status = 500
        try:
            path = request.path
            if self._armed is not None and path.startswith("/p/"):
                self.throttle_until, self._armed = start + self._armed, None
            if path == "/robots.txt" and self.robots is not None:
                status, resp = 200, web.Response(body=self.robots, content_type="text/plain")
            elif path == "/robots.txt":
                status, resp = 404, web.Response(status=404, text="no rules")
            elif start < self.throttle_until and path != "/":
                headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
                status = self.throttle_status
                resp = web.Response(status=status, text="slow down", headers=headers)
            elif path == "/":
                links = "".join(f'<a href="/p/{i}.html">{i}</a>\n' for i in range(self.pages))
                status, resp = 200, web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")
            elif path.startswith("/p/") and path.endswith(".html"):
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                status, resp = 200, web.Response(text=f"<html><body>{path}</body></html>", content_type="text/html")
            else:
                status, resp = 404, web.Response(status=404, text="not found")
            return resp
        finally:
            self._in_flight -= 1
            self.hits.append(Hit(start, time.monotonic(), request.path, status,
                                 request.headers.get("User-Agent", "")))
