"""The master's read-only web server on web.listen: the status page, /api/status and /metrics.

aiohttp.web on the master's own event loop. Every handler is cheap and bounded: the status and the chart come
from memory and the store's in-memory counters; catalogue searches run in a thread on their own read-only
connection (one at a time, with a time limit), so a slow LIKE over a big catalogue never holds up the crawl.

Access: with web.token_file set, every request needs the token, as `Authorization: Bearer <token>` or in the
cookie the login form at /login sets. The routes:

GET /             the page (crawler/master/page.py), refreshing itself from the three below
GET /api/status   the status object (as `crawler-master status --json` prints it)
GET /api/recent   pages per minute over the last hours and the recent errors
GET /api/audio    catalogue rows: ?q= searches title, artist and URLs; no q gives the newest; ?limit= up to 100
GET /metrics      Prometheus text format
GET|POST /login   the login form
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from crawler.logs import iso_utc
from crawler.master.observe import Observer
from crawler.master.page import LOGIN_PAGE, PAGE
from crawler.master.store import MasterStore, StoreError
from crawler.metrics import metrics_response

log = logging.getLogger("crawler.master.web")

COOKIE = "crawler_token"
SEARCH_LIMIT = 100
SEARCH_SECONDS = 2.0        # a search is cut off after this long
MAX_QUERY = 200
WEB_ADDR_FILE = "web.addr"


def _search(db_path: Path | str, query: str, limit: int) -> list[dict[str, Any]]:
    store = MasterStore.open_readonly(db_path)
    store.limit_time(SEARCH_SECONDS)
    try:
        return store.search_audio(query, limit)
    finally:
        store.close()


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj, ensure_ascii=False), status=status, content_type="application/json")


class WebServer:
    def __init__(self, observer: Observer, db_path: Path | str, token: str | None) -> None:
        self.obs = observer
        self.db_path = db_path
        self.token = token
        self._search_lock = asyncio.Lock()
        self.runner: web.AppRunner | None = None
        self.address: str | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024)
        r = app.router
        r.add_get("/", self.page)
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_get("/api/status", self.api_status)
        r.add_get("/api/recent", self.api_recent)
        r.add_get("/api/audio", self.api_audio)
        r.add_get("/metrics", self.metrics)
        return app

    async def start(self, host: str, port: int) -> str:
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        bound = self.runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.address = f"{shown}:{bound[1]}"
        return self.address

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # ------------------------------------------------------------------ access
    def _authorised(self, request: web.Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else request.cookies.get(COOKIE, "")
        return hmac.compare_digest(given.encode(), self.token.encode())

    @web.middleware
    async def _auth(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.path == "/login" or self._authorised(request):
            await self.obs.master.store_ready()   # the status reads the master's store: not mid-commit
            resp = await handler(request)
            resp.headers.setdefault("Cache-Control", "no-store")
            return resp
        if request.path == "/":
            return web.Response(text=LOGIN_PAGE.replace("{message}", ""), status=401, content_type="text/html")
        return web.Response(text="401: a token is needed (Authorization: Bearer <token>)\n", status=401,
                            headers={"WWW-Authenticate": "Bearer"})

    async def login_form(self, request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_PAGE.replace("{message}", ""), content_type="text/html")

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        given = str(form.get("token", "")).strip()
        if self.token is None or hmac.compare_digest(given.encode(), self.token.encode()):
            resp = web.HTTPSeeOther("/")
            if self.token is not None:
                resp.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
            return resp
        return web.Response(text=LOGIN_PAGE.replace("{message}", "That token is not right."), status=401,
                            content_type="text/html")

    # ------------------------------------------------------------------ pages
    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def api_status(self, request: web.Request) -> web.Response:
        return _json(self.obs.status())

    async def api_recent(self, request: web.Request) -> web.Response:
        chart = self.obs.chart()
        chart["end"] = iso_utc(chart["end"])
        return _json(chart)

    async def api_audio(self, request: web.Request) -> web.Response:
        query = request.query.get("q", "").strip()[:MAX_QUERY]
        try:
            limit = max(1, min(SEARCH_LIMIT, int(request.query.get("limit", "20"))))
        except ValueError:
            limit = 20
        if self._search_lock.locked() and query:
            return _json({"error": "another search is running; try again in a moment"}, status=429)
        async with self._search_lock:
            try:
                rows = await asyncio.to_thread(_search, self.db_path, query, limit)
            except (sqlite3.OperationalError, StoreError) as e:
                msg = "the search took too long; try a longer text" if "interrupt" in str(e) else str(e)
                return _json({"error": msg}, status=503)
        for row in rows:
            row["found_at"] = iso_utc(row["found_at"])
        return _json({"query": query, "items": rows})

    async def metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.obs.render_metrics())
