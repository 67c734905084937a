"""A loopback site behind a login form, for the session tests: what a members-only music site does.

- ``/`` and ``/public/<n>.html``: the public part, for anyone (each answer sets a ``visitor`` cookie, as trackers do);
- ``GET /login``: the form; ``POST /login`` (form-urlencoded ``user`` and ``password``): right, a new session
  (``sid`` cookie, HttpOnly, Path=/) and a 303 to ``/account``, which shows the success text; wrong, the form again
  with "Wrong user name or password" (no success text);
- ``/members/index.html`` (lists the songs), ``/members/song-<k>.html`` (links its audio) and ``/audio/<k>.mp3``:
  only with a valid session; without one a page is a 302 to ``/login`` and audio a 403. Every members page and
  ``/account`` show the success text (``SUCCESS``). While ``login_down`` is set, ``POST /login`` answers 503 (the
login server down), whatever the password.

A session expires ``session_ttl`` seconds after it was made (the server's clock: the cookie itself has no
expiry), or after ``session_requests`` requests used it, so a test can force re-logins whatever the crawl's
pace; ``expire_all()`` ends every session at once. Every request is logged
(``hits``: when it arrived and was answered, method, path, status, its Cookie header, all its headers, and whether
it came with a valid session). In-process: ``async with LoginSite(...) as site``.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from aiohttp import web

from testkit.loopback import LoopbackSite

SUCCESS = "Log out"


@dataclass(frozen=True, slots=True)
class Hit:
    start: float                 # time.monotonic() when the request arrived
    end: float                   # when its answer was made
    method: str
    path: str
    status: int
    cookie: str                  # the Cookie header, "" without one
    headers: dict[str, str]
    session: bool                # it carried a valid session


def mp3(size: int, seed: int) -> bytes:
    return b"ID3\x03\x00\x00\x00\x00\x00\x00" + random.Random(seed).randbytes(size - 10)


@dataclass
class LoginSite(LoopbackSite):
    user: str = "alice"
    password: str = "s3cret"
    songs: int = 6
    public_pages: int = 3
    session_ttl: float = 3600.0
    session_requests: int | None = None    # a session also ends after this many requests that used it
    latency: float = 0.0
    links: tuple[str, ...] = ()            # other sites' URLs linked from the public pages (not from "/")
    login_down: bool = False               # POST /login answers 503 while set (the login server is down)
    hits: list[Hit] = field(default_factory=list)
    sessions: dict[str, float] = field(default_factory=dict)     # sid -> made at (monotonic)
    uses: dict[str, int] = field(default_factory=dict)           # sid -> requests that used it
    max_in_flight: int = 0
    url: str = ""
    _in_flight: int = 0
    _runner: web.ServerRunner | None = None

    # ------------------------------------------------------------------ what a test reads
    def audio(self, k: int) -> bytes:
        return mp3(20_000 + 1000 * k, k)

    def member_paths(self) -> set[str]:
        """Every path only a session reaches: the members pages and the audio."""
        return ({"/members/index.html"} | {f"/members/song-{k}.html" for k in range(self.songs)}
                | {f"/audio/{k}.mp3" for k in range(self.songs)})

    def public_paths(self) -> set[str]:
        return {"/"} | {f"/public/{n}.html" for n in range(self.public_pages)}

    def logins(self, *, ok: bool | None = None) -> list[Hit]:
        """The POSTs to /login (ok: those that made a session, or those that did not)."""
        return [h for h in self.hits if h.method == "POST" and h.path == "/login"
                and (ok is None or (h.status == 303) == ok)]

    def expire_all(self) -> None:
        self.sessions.clear()

    # ------------------------------------------------------------------ serving
    def _valid(self, request: web.BaseRequest, now: float) -> bool:
        sid = request.cookies.get("sid")
        made = self.sessions.get(sid) if sid else None
        if made is None:
            return False
        assert sid is not None
        used = self.uses[sid] = self.uses.get(sid, 0) + 1
        if now - made > self.session_ttl or (self.session_requests is not None and used > self.session_requests):
            del self.sessions[sid]
            return False
        return True

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.monotonic()
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        valid = self._valid(request, start)
        status = 500
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            resp = await self._answer(request, valid)
            status = resp.status
            return resp
        finally:
            self._in_flight -= 1
            self.hits.append(Hit(start, time.monotonic(), request.method, request.path, status,
                                 request.headers.get("Cookie", ""), dict(request.headers), valid))

    async def _answer(self, request: web.BaseRequest, valid: bool) -> web.StreamResponse:
        path = request.path
        if path == "/login" and request.method == "POST":
            if self.login_down:
                return web.Response(status=503, text="login service unavailable")
            form = dict(parse_qsl((await request.read()).decode("utf-8", "replace")))
            if form.get("user") == self.user and form.get("password") == self.password:
                sid = secrets.token_hex(8)
                self.sessions[sid] = time.monotonic()
                resp = web.Response(status=303, headers={"Location": "/account"})
                resp.headers["Set-Cookie"] = f"sid={sid}; Path=/; HttpOnly"
                return resp
            return _html(_form("Wrong user name or password."))
        if path == "/login":
            return _html(_form(""))
        if path == "/robots.txt":
            return web.Response(status=404, text="no rules")
        if path == "/" or (path.startswith("/public/") and path.endswith(".html")):
            links = "".join(f'<a href="/public/{n}.html">public {n}</a>\n' for n in range(self.public_pages))
            if path != "/":
                links += "".join(f'<a href="{u}">elsewhere</a>\n' for u in self.links)
            resp = _html(f"{links}<a href=\"/members/index.html\">members</a> <a href=\"/login\">sign in</a>")
            resp.headers["Set-Cookie"] = "visitor=1; Path=/"
            return resp
        if path == "/account" or path.startswith("/members/"):
            if not valid:
                return web.Response(status=302, headers={"Location": f"/login?next={path}"})
            if path == "/members/index.html":
                body = "".join(f'<a href="/members/song-{k}.html">song {k}</a>\n' for k in range(self.songs))
                return _html(f"<p>{SUCCESS}</p>{body}")
            if path.startswith("/members/song-") and path.endswith(".html"):
                k = path[len("/members/song-"):-len(".html")]
                return _html(f'<p>{SUCCESS}</p><a href="/audio/{k}.mp3">song {k}.mp3</a>')
            if path == "/account":
                return _html(f"<p>Welcome, {self.user}. {SUCCESS}</p>")
            return web.Response(status=404, text="not found")
        if path.startswith("/audio/") and path.endswith(".mp3"):
            if not valid:
                return web.Response(status=403, text="members only")
            k = path[len("/audio/"):-len(".mp3")]
            if not k.isdigit() or int(k) >= self.songs:
                return web.Response(status=404, text="not found")
            return web.Response(body=self.audio(int(k)), content_type="audio/mpeg")
        return web.Response(status=404, text="not found")


def _form(message: str) -> str:
    return (f"<p>{message}</p><form method=post action=/login><input name=user><input name=password type=password>"
            "<input type=submit></form>")


def _html(body: str) -> web.Response:
    return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")
