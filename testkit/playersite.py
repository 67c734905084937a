"""A music site whose audio appears only through scripts, for the browser resolver's tests.

    /                 index: links to the three song pages and /about (no player on it)
    /song/1           the address is assembled in JavaScript: "/m/" + id + ".mp3" set on an <audio>
    /song/2           a click on Play makes the player call /api/play with a computed signature; the API sets a
                      session cookie and answers a /stream/<token> address (no extension) that only serves
                      the client holding that cookie and sending the site's Referer
    /song/3           an HLS-only song: Play fetches the master playlist, the audio media playlist, the
                      AES-128 key and a segment, as hls.js would
    /about            text and a script, no player: the browser must not visit it
    /more             linked only from the page song1.js builds (the crawl must find it through the browser)
    /hang             a script that never yields (the per-page deadline)
    /escape           a script that navigates to another host (must not be followed)
    /reach?port=N     a script that opens a WebSocket to, then POSTs to, ``internal.test:N`` and ``127.0.0.1:N``
                      (an internal host by name and by address), then fetches /static/reached: the browser's
                      connections must obey the worker's target policy
    /hog/buffers      a script that fills ArrayBuffers without end (memory outside the JS heap)
    /hog/heap         a script that grows a JS array without end (the V8 heap)

Decoys on the song pages (images, a font, a video, JSON) must not become items or be fetched by the browser.
Every request is logged (path, host, User-Agent), so tests can tell what the browser fetched.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from testkit.hls import Stream, make_stream
from testkit.ports import on_one_port

PAGE_SECRET = "page-secret-42"
# A test browser's switch for /reach: internal.test resolves to loopback, any other name to nothing.
REACH_ARGS = ["--host-resolver-rules=MAP internal.test 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
HLS_KEY = bytes.fromhex("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf")


def fnv1a(text: str) -> str:
    """The player's signature function (32-bit FNV-1a of the UTF-8 bytes, 8 hex digits), as in song2.js."""
    h = 0x811C9DC5
    for byte in text.encode():
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def mp3_bytes(size: int, seed: int) -> bytes:
    return b"ID3\x03\x00\x00\x00\x00\x00\x00" + random.Random(seed).randbytes(size - 10)


@dataclass
class Request:
    host: str
    path: str
    user_agent: str
    status: int = 0
    peer: str = ""            # the address the request came from


@dataclass
class PlayerSite:
    assembled: bytes = field(default_factory=lambda: mp3_bytes(60_000, 1))
    signed: bytes = field(default_factory=lambda: mp3_bytes(80_000, 2))
    stream: Stream = field(default_factory=lambda: make_stream(segments=5, key=HLS_KEY, seed=3,
                                                               key_uri="../key.bin"))
    video: bytes = field(default_factory=lambda: b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomavc1"
                         + b"\x00\x00\x00\x30moov" + b"trak" + b"hdlr" + b"\x00" * 8 + b"vide" + bytes(4000))
    log: list[Request] = field(default_factory=list)
    api_calls: list[dict[str, str]] = field(default_factory=list)   # accepted signatures
    bad_signatures: int = 0
    sessions: dict[str, str] = field(default_factory=dict)          # cookie -> token
    stream_denied: int = 0

    def paths(self) -> list[str]:
        return [r.path for r in self.log]

    def browser_paths(self) -> list[str]:
        return [r.path for r in self.log if "HeadlessChrome" in r.user_agent or "SiteTestBrowser" in r.user_agent]


def _page(title: str, artist: str, body: str, script: str | None = None) -> str:
    tag = f'<script src="/static/{script}"></script>' if script else ""
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{title} - Player Site</title>"
            f'<meta property="og:title" content="{title}"><meta property="music:musician" content="{artist}">'
            f'<link rel="stylesheet" href="/static/site.css"></head><body><img src="/img/cover.jpg" alt="">'
            f"{body}{tag}</body></html>")


PAGES = {
    "/": ("<!doctype html><html><head><title>Player Site</title></head><body><h1>Songs</h1><ul>"
          '<li><a href="/song/1">one</a></li><li><a href="/song/2">two</a></li><li><a href="/song/3">three</a></li>'
          '<li><a href="/about">about us</a></li></ul></body></html>'),
    "/song/1": _page("Assembled Song", "Script Artist",
                     '<div class="track" data-title="Assembled Song" data-artist="Script Artist">'
                     '<audio id="player" preload="none"></audio></div><video src="/v/clip.mp4" muted></video>',
                     "song1.js"),
    "/song/2": _page("Signed Song", "API Artist",
                     '<div class="song" data-title="Signed Song" data-artist="API Artist">'
                     '<button class="play-button" aria-label="Play">&#9654;</button><audio id="a2"></audio></div>',
                     "song2.js"),
    "/song/3": _page("Streamed Song", "HLS Artist",
                     '<div class="player"><button id="go" class="btn play">Play</button></div>', "song3.js"),
    "/more": "<!doctype html><html><head><title>More</title></head><body><p>More soon.</p></body></html>",
    "/about": ("<!doctype html><html><head><title>About</title></head><body><p>We publish music.</p>"
               '<script src="/static/about.js"></script></body></html>'),
    "/hang": _page("Hanging", "Nobody", '<audio id="h"></audio>', "hang.js"),
    "/escape": _page("Escape", "Nobody", '<audio id="e"></audio>', "escape.js"),
    "/reach": _page("Reach", "Nobody", '<audio id="r"></audio>', "reach.js"),
    "/hog/buffers": _page("Hog", "Nobody", '<audio id="hb"></audio>', "hog-buffers.js"),
    "/hog/heap": _page("Hog", "Nobody", '<audio id="hh"></audio>', "hog-heap.js"),
}

SCRIPTS = {
    "song1.js": ('var id = "a7f3"; document.getElementById("player").src = "/m/" + id + ".mp3";'
                 'document.body.insertAdjacentHTML("beforeend", \'<a href="/more">more songs</a>\');'),
    "song2.js": """
function fnv(s) { let h = 0x811c9dc5; for (const c of new TextEncoder().encode(s)) { h ^= c;
  h = Math.imul(h, 0x01000193) >>> 0; } return h.toString(16).padStart(8, '0'); }
document.querySelector('.play-button').addEventListener('click', async () => {
  const id = 's2', t = String(Date.now());
  const r = await fetch('/api/play?id=' + id + '&t=' + t + '&sig=' + fnv(id + ':' + t + ':' + 'page-secret-42'));
  const j = await r.json();
  const a = document.getElementById('a2'); a.src = j.url; a.play().catch(() => {});
});""",
    "song3.js": """
document.getElementById('go').addEventListener('click', async () => {
  const base = '/hls/s3/';
  const master = await (await fetch(base + 'index.m3u8')).text();
  const lines = master.split('\\n');
  const audio = lines[lines.findIndex(l => l.includes('CODECS="mp4a')) + 1];
  const mediaUrl = new URL(audio, location.origin + base).href;
  const media = await (await fetch(mediaUrl)).text();
  const keyUri = /URI="([^"]+)"/.exec(media)[1];
  await (await fetch(new URL(keyUri, mediaUrl).href)).arrayBuffer();
  const seg = media.split('\\n').find(l => l && !l.startsWith('#'));
  await (await fetch(new URL(seg, mediaUrl).href)).arrayBuffer();
  document.title = 'Streamed Song - playing';
});""",
    "about.js": "fetch('/static/about-ran');",
    "hang.js": "document.getElementById('h').src = '/m/hang.mp3'; setTimeout(() => { for (;;) {} }, 0);",
    "escape.js": "location.href = location.href.replace('127.0.0.1', '127.0.0.2');",
    "reach.js": """
const port = new URLSearchParams(location.search).get('port');
const socket = (host) => new Promise((done) => {
  try { const ws = new WebSocket('ws://' + host + ':' + port + '/ws');
        ws.onopen = () => { ws.send('hello'); setTimeout(done, 100); }; ws.onerror = done; } catch (e) { done(); }
});
(async () => {
  for (const host of ['internal.test', '127.0.0.1']) {
    await socket(host);
    await fetch('http://' + host + ':' + port + '/secret', {method: 'POST', body: 'x', mode: 'no-cors'})
      .catch(() => {});
  }
  await fetch('/static/reached');
})();""",
    # Bounded (3 GiB) only so that a browser without a memory bound does not take the test machine with it.
    "hog-buffers.js": """
const kept = []; const grow = () => { if (kept.length >= 96) return;
  const b = new Uint8Array(32 << 20); b.fill(7); kept.push(b); setTimeout(grow, 10); }; grow();""",
    "hog-heap.js": """
const kept = []; const grow = () => { for (let i = 0; i < 40 && kept.length < 3000; i++)
  kept.push(new Array(131072).fill(kept.length + 0.5)); if (kept.length < 3000) setTimeout(grow, 0); }; grow();""",
}


def make_app(site: PlayerSite) -> web.Application:
    token_key = secrets.token_bytes(16)

    @web.middleware
    async def logger(request: web.Request, handler):
        entry = Request(request.host.split(":")[0], request.path_qs, request.headers.get("User-Agent", ""),
                        peer=request.remote or "")
        site.log.append(entry)
        response = await handler(request)
        entry.status = response.status
        return response

    async def page(request: web.Request) -> web.Response:
        html = PAGES.get(request.path)
        if html is None:
            raise web.HTTPNotFound()
        return web.Response(text=html, content_type="text/html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name in SCRIPTS:
            return web.Response(text=SCRIPTS[name], content_type="application/javascript")
        if name == "site.css":
            return web.Response(text="@font-face{font-family:S;src:url(/static/site.woff2)} body{font-family:S}",
                                content_type="text/css")
        if name == "site.woff2":
            return web.Response(body=b"wOF2" + bytes(100), content_type="font/woff2")
        if name in ("about-ran", "reached"):
            return web.Response(text="ok")
        raise web.HTTPNotFound()

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png")

    async def assembled(request: web.Request) -> web.Response:
        if request.match_info["id"] == "a7f3":
            return web.Response(body=site.assembled, content_type="audio/mpeg")
        raise web.HTTPNotFound()

    async def video(request: web.Request) -> web.Response:
        return web.Response(body=site.video, content_type="video/mp4")

    async def api_play(request: web.Request) -> web.Response:
        q = request.query
        song, t, sig = q.get("id", ""), q.get("t", ""), q.get("sig", "")
        if song != "s2" or not hmac.compare_digest(sig, fnv1a(f"{song}:{t}:{PAGE_SECRET}")):
            site.bad_signatures += 1
            return web.json_response({"error": "bad signature"}, status=403)
        site.api_calls.append(dict(q))
        session = secrets.token_hex(8)
        token = hmac.new(token_key, session.encode(), hashlib.sha256).hexdigest()[:24]
        site.sessions[session] = token
        response = web.json_response({"url": f"/stream/{token}"})
        response.set_cookie("play_session", session, path="/", httponly=True)
        return response

    async def stream(request: web.Request) -> web.Response:
        session = request.cookies.get("play_session", "")
        referer = request.headers.get("Referer", "")
        if (site.sessions.get(session) != request.match_info["token"]
                or not referer.startswith(f"http://{request.host}/song/2")):
            site.stream_denied += 1
            raise web.HTTPForbidden()
        return web.Response(body=site.signed, content_type="audio/mpeg")

    async def hls(request: web.Request) -> web.Response:
        data = site.stream.files.get(request.match_info["path"])
        if data is None:
            raise web.HTTPNotFound()
        path = request.match_info["path"]
        ctype = "application/vnd.apple.mpegurl" if path.endswith(".m3u8") else (
            "application/octet-stream" if path.endswith(".bin") else "audio/aac")
        return web.Response(body=data, content_type=ctype)

    app = web.Application(middlewares=[logger])
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/img/{name}", image)
    app.router.add_get("/m/{id}.mp3", assembled)
    app.router.add_get("/v/clip.mp4", video)
    app.router.add_get("/api/play", api_play)
    app.router.add_get("/stream/{token}", stream)
    app.router.add_get("/hls/s3/{path:.+}", hls)
    app.router.add_get("/{tail:.*}", page)
    return app


@asynccontextmanager
async def serve(site: PlayerSite) -> AsyncIterator[str]:
    """Serve on 127.0.0.1 and 127.0.0.2 (same port, both loopback) so a second host exists; yields the base URL."""
    runner = web.AppRunner(make_app(site), access_log=None)
    await runner.setup()
    sites: list[web.TCPSite] = []

    async def listen(host: str, port: int) -> int:
        tcp = web.TCPSite(runner, host, port)
        await tcp.start()
        sites.append(tcp)
        return int(runner.addresses[-1][1])

    async def undo() -> None:
        for tcp in sites:
            await tcp.stop()
        sites.clear()

    port = await on_one_port(("127.0.0.1", "127.0.0.2"), listen, undo)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serve_internal() -> AsyncIterator[tuple[int, list[str]]]:
    """A host the crawl does not name, on 127.0.0.1: yields its port and the list of what reached it (``METHOD
    host path`` per request, ``ws:<text>`` per WebSocket message). The browser must leave it alone."""
    hits: list[str] = []

    async def ws(request: web.Request) -> web.StreamResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            hits.append(f"ws:{msg.data}")
        return sock

    async def anything(request: web.Request) -> web.Response:
        return web.Response(text="internal")

    @web.middleware
    async def record(request: web.Request, handler):
        hits.append(f"{request.method} {request.host} {request.path}")
        return await handler(request)

    app = web.Application(middlewares=[record])
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1], hits
    finally:
        await runner.cleanup()
