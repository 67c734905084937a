"""The master's read-only web server on web.listen: the status page, /api/status and /metrics.

aiohttp.web on the master's own event loop. Every handler is cheap and bounded: the status and the chart come
from memory and the store's in-memory counters; catalogue searches run in a thread on their own read-only
connection (one at a time, with a time limit), so a slow LIKE over a big catalogue never holds up the crawl.

Access: with web.token_file set, every request needs the token, as `Authorization: Bearer <token>`, or the
session cookie the login form at /login sets: an expiry and an HMAC of it keyed with the token (never the token
itself), good for SESSION_SECONDS. Every request must name this server in its Host header (see host_allowed), so
a page whose own name was made to resolve to this machine (DNS rebinding: any browser on it, the crawler's own
Chromium included) reads nothing even with no token. Every answer forbids framing, sniffing and inline script.
The routes:

GET /             the page (crawler/master/page.py), refreshing itself from the three below
GET /status.js, /status.css   its script and style (no data in them: served without the token)
GET /api/status   the status object (as `crawler-master status --json` prints it)
GET /api/recent   pages per minute over the last hours and the recent errors
GET /api/audio    catalogue rows: ?q= searches title, artist and URLs; no q gives the newest; ?limit= up to 100
GET /metrics      Prometheus text format
GET|POST /login   the login form
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from crawler.logs import iso_utc
from crawler.master.observe import Observer
from crawler.master.page import LOGIN_PAGE, PAGE, STATUS_CSS, STATUS_JS
from crawler.master.store import MasterStore, StoreError
from crawler.metrics import metrics_response

log = logging.getLogger("crawler.master.web")

# Runs a request's handler through the master's store gate (StoreGate.guard).
Guard = Callable[[Awaitable[web.StreamResponse]], Awaitable[web.StreamResponse]]

COOKIE = "crawler_token"
SESSION_SECONDS = 12 * 3600     # a login cookie's life; signing in again gives a new one
_SESSION_LABEL = b"crawler-master web session|"
# No inline script or style, nothing from elsewhere, no framing: text from the crawl that ever reached the page
# as HTML could neither run nor load anything.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
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


def session_value(token: str, expires: int) -> str:
    """The login cookie's value: its expiry (Unix seconds) and an HMAC of it keyed with the token."""
    mac = hmac.new(token.encode(), _SESSION_LABEL + str(expires).encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def session_valid(token: str, value: str, now: float) -> bool:
    """Whether a cookie's value is a session this token made that has not expired (nor claims to last longer
    than a session can)."""
    expires, _, _mac = value.partition(".")
    if not expires.isdigit() or len(expires) > 12 or not now < int(expires) <= now + SESSION_SECONDS:
        return False
    return hmac.compare_digest(session_value(token, int(expires)).encode(), value.encode())


def allowed_hosts(listen_host: str, configured: Iterable[str]) -> tuple[frozenset[str], bool]:
    """The names a request's Host may give: loopback's, the listen address, the configured ones (lower case).
    The flag: any IP literal too, when listening on every address (an IP literal cannot be rebound)."""
    names = {"localhost", "127.0.0.1", "::1", listen_host.lower().strip("[]"), *(h.lower() for h in configured)}
    wildcard = listen_host.strip("[]") in ("0.0.0.0", "::", "")
    return frozenset(names), wildcard


def host_allowed(header: str | None, names: frozenset[str], any_ip: bool) -> bool:
    """Whether a Host header names this server. None (no Host: not a browser) passes."""
    if header is None:
        return True
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else ""
    else:
        name, colon, port = host.rpartition(":")
        if colon and port.isdigit():
            host = name
    host = host.rstrip(".")
    if host in names:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or any_ip


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj, ensure_ascii=False), status=status, content_type="application/json")


class WebServer:
    def __init__(self, observer: Observer, db_path: Path | str, token: str | None, *,
                 guard: Guard, hosts: tuple[str, ...] = (),
                 clock: Callable[[], float] = time.time) -> None:
        """observer: answers the status, chart and metrics; db_path: the store searches open read-only;
        guard: runs a request's handler so that it never reads the master's store mid-commit (the store gate)."""
        self.obs = observer
        self.guard = guard
        self.db_path = db_path
        self.token = token
        self.hosts = hosts               # web.allowed_hosts
        self.clock = clock               # wall-clock seconds: a cookie's expiry outlives the process
        self._names: frozenset[str] = frozenset()
        self._any_ip = False
        self._search_lock = asyncio.Lock()
        self.runner: web.AppRunner | None = None
        self.address: str | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard, self._auth], client_max_size=64 * 1024)
        r = app.router
        r.add_get("/", self.page)
        r.add_get("/status.js", self.script)
        r.add_get("/status.css", self.style)
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_get("/api/status", self.api_status)
        r.add_get("/api/recent", self.api_recent)
        r.add_get("/api/audio", self.api_audio)
        r.add_get("/metrics", self.metrics)
        return app

    async def start(self, host: str, port: int) -> str:
        self._names, self._any_ip = allowed_hosts(host, self.hosts)
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
        if header[:7].lower() == "bearer ":
            return hmac.compare_digest(header[7:].strip().encode(), self.token.encode())
        return session_valid(self.token, request.cookies.get(COOKIE, ""), self.clock())

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """A Host that does not name this server is refused before anything else; every answer gets the
        security headers (errors aiohttp raises included)."""
        if not host_allowed(request.headers.get("Host"), self._names, self._any_ip):
            resp: web.StreamResponse = web.Response(
                text="421: this server does not answer to that Host name (see web.allowed_hosts)\n", status=421)
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                e.headers.update(SECURITY_HEADERS)
                raise
        resp.headers.update(SECURITY_HEADERS)
        return resp

    @web.middleware
    async def _auth(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.path in ("/login", "/status.js", "/status.css") or self._authorised(request):
            # The status reads the master's store: run through the store gate, never mid-commit.
            resp = await self.guard(handler(request))
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
                expires = int(self.clock()) + SESSION_SECONDS
                resp.set_cookie(COOKIE, session_value(self.token, expires), httponly=True, samesite="Strict",
                                path="/", max_age=SESSION_SECONDS)
            return resp
        return web.Response(text=LOGIN_PAGE.replace("{message}", "That token is not right."), status=401,
                            content_type="text/html")

    # ------------------------------------------------------------------ pages
    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def script(self, request: web.Request) -> web.Response:
        return web.Response(text=STATUS_JS, content_type="text/javascript")

    async def style(self, request: web.Request) -> web.Response:
        return web.Response(text=STATUS_CSS, content_type="text/css")

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
            except StoreError as e:
                msg = "the search took too long; try a longer text" if "interrupt" in str(e) else str(e)
                return _json({"error": msg}, status=503)
        for row in rows:
            row["found_at"] = iso_utc(row["found_at"])
        return _json({"query": query, "items": rows})

    async def metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.obs.render_metrics())
