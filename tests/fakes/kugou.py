"""A fake Kugou on loopback, serving the real shapes (listed in crawler/resolvers/kugou.py's notes).

One aiohttp app plays every Kugou host: www (playlist, share, rank, album, singer and song pages), wwwapi
(play data), m (the JSON playlist twin and getSongInfo), songsearch (song_search_v2) and webfs (signed
downloads). Point the resolver's api_base, mobile_api_base,
www_hosts and mobile_hosts at it.

    app, kugou = make_kugou_app()
    song = kugou.add_song("Artist", "Title", album="Album")
    kugou.add_special("547134", [song.hash])
    async with serve(app) as base:          # "http://127.0.0.1:<port>", port chosen by the OS (port 0)
        ...

Time is the controller's own clock (``kugou.advance(seconds)``), so expiry is tested without sleeping.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def fake_mp3(title: str, artist: str, album: str, salt: str, frames: int = 40) -> bytes:
    """Small but real-looking MP3 bytes: an ID3v2.3 tag (UTF-16 text frames) and MPEG-1 Layer III frames."""
    def text_frame(frame_id: bytes, text: str) -> bytes:
        data = b"\x01" + text.encode("utf-16")  # encoding 1: UTF-16 with BOM, as Kugou's files use
        return frame_id + len(data).to_bytes(4, "big") + b"\x00\x00" + data

    frames_data = (text_frame(b"TIT2", title) + text_frame(b"TPE1", artist) + text_frame(b"TALB", album)
                   + text_frame(b"TXXX", f"kugou\x00{salt}"))
    size = len(frames_data)
    synchsafe = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
    tag = b"ID3\x03\x00\x00" + synchsafe + frames_data
    # 128 kbit/s, 44.1 kHz, joint stereo, no padding: 417-byte frames.
    frame = b"\xff\xfb\x90\x64" + bytes(413)
    return tag + frame * frames


@dataclass
class FakeSong:
    hash: str
    album_id: str
    song_name: str
    author_name: str
    album_name: str
    timelength_ms: int
    bitrate: int
    paid: bool
    mixsongid: str
    audio: bytes

    @property
    def audio_name(self) -> str:
        return f"{self.author_name} - {self.song_name}"

    @property
    def etag(self) -> str:
        return '"' + hashlib.md5(self.audio).hexdigest() + '"'


@dataclass
class SignedLink:
    hash: str
    user_agent: str
    issued_at: float


@dataclass
class KugouController:
    """The fake's state and knobs; tests read its logs to see what the resolver and downloader did."""

    now: float = 1_700_000_000.0
    link_lifetime: float = 600.0        # seconds a signed download address stays valid
    expired_status: int = 403           # what an expired address answers (Kugou's CDN: 403; some: 410)
    require_cookie: bool = True         # no kg_mid cookie: err_code 20010
    secret: str = "not-a-real-secret"
    songs: dict[str, FakeSong] = field(default_factory=dict)
    specials: dict[str, list[str]] = field(default_factory=dict)
    shares: dict[str, list[str]] = field(default_factory=dict)
    ranks: dict[str, list[str]] = field(default_factory=dict)
    albums: dict[str, list[str]] = field(default_factory=dict)
    singers: dict[str, list[str]] = field(default_factory=dict)
    verify_failures: dict[str, int] = field(default_factory=dict)   # hash -> 20010 answers still to give
    play_down: set[str] = field(default_factory=set)     # hashes whose play data answers HTTP 503
    dead_primary: set[str] = field(default_factory=set)  # hashes whose play_url host answers 404 (backup works)
    song_info_up: bool = True                            # False: getSongInfo refuses every song
    song_info_requests: list[str] = field(default_factory=list)
    search_requests: list[dict[str, str]] = field(default_factory=list)
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # path -> (content type, body) overrides
    play_body: str | None = None        # raw play-data body to answer instead (a shape Kugou might change to)
    links: dict[str, SignedLink] = field(default_factory=dict)
    play_requests: list[dict[str, str | None]] = field(default_factory=list)
    downloads: list[dict[str, object]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def add_song(self, artist: str, title: str, *, album: str = "", paid: bool = False, seconds: int = 200,
                 bitrate: int = 128, album_id: str | None = None) -> FakeSong:
        n = len(self.songs) + 1
        song_hash = hashlib.md5(f"{artist}/{title}/{n}".encode()).hexdigest().upper()
        song = FakeSong(hash=song_hash, album_id=album_id or str(10_000_000 + n), song_name=title,
                        author_name=artist, album_name=album, timelength_ms=seconds * 1000, bitrate=bitrate,
                        paid=paid, mixsongid=str(200_000_000 + n),
                        audio=fake_mp3(title, artist, album, salt=song_hash))
        self.songs[song_hash] = song
        return song

    def add_special(self, special_id: str, hashes: list[str]) -> str:
        self.specials[special_id] = list(hashes)
        return f"/yy/special/single/{special_id}.html"

    def add_share(self, chain: str, hashes: list[str]) -> str:
        self.shares[chain] = list(hashes)
        return f"/share/{chain}.html"

    def add_rank(self, rank: str, hashes: list[str]) -> str:
        self.ranks[rank] = list(hashes)
        return f"/yy/rank/home/{rank}.html"

    def add_album(self, album_id: str, hashes: list[str]) -> str:
        self.albums[album_id] = list(hashes)
        return f"/album/{album_id}.html"

    def add_singer(self, singer_id: str, hashes: list[str]) -> str:
        self.singers[singer_id] = list(hashes)
        return f"/singer/{singer_id}.html"

    def sign(self, song: FakeSong, user_agent: str, origin: str) -> str:
        issued = self.clock()
        stamp = time.strftime("%Y%m%d%H%M", time.gmtime(issued))
        sig = hashlib.md5(f"{self.secret}|{song.hash}|{user_agent}|{issued}|{len(self.links)}".encode()).hexdigest()
        self.links[sig] = SignedLink(song.hash, user_agent, issued)
        name = hashlib.md5(song.hash.encode()).hexdigest()[:22]
        return f"{origin}/{stamp}/{sig}/G076/M00/1A/2B/{name}.mp3"


def _page(title: str, script: str) -> bytes:
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}_酷狗音乐</title>
<script src="https://static.kgimg.com/common/js/min/jquery.js"></script></head>
<body><div id="songs"></div>
<script type="text/javascript">
    var _hmt = _hmt || []; // analytics, as on every Kugou page
</script>
<script type="text/javascript">
{script}
</script>
</body></html>""".encode()


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def make_kugou_app(controller: KugouController | None = None) -> tuple[web.Application, KugouController]:
    kugou = controller or KugouController()
    app = web.Application()

    def songs_of(hashes: list[str]) -> list[FakeSong]:
        return [kugou.songs[h] for h in hashes if h in kugou.songs]

    def override(request: web.Request) -> web.Response | None:
        if request.path in kugou.pages:
            content_type, body = kugou.pages[request.path]
            return web.Response(body=body, content_type=content_type)
        return None

    async def special(request: web.Request) -> web.Response:
        if (r := override(request)) is not None:
            return r
        special_id = request.match_info["id"]
        if special_id not in kugou.specials:
            raise web.HTTPNotFound()
        data = [{"hash": s.hash, "timelen": s.timelength_ms, "filename": s.audio_name, "album_id": s.album_id,
                 "album_audio_id": s.mixsongid, "privilege": 10 if s.paid else 0}
                for s in songs_of(kugou.specials[special_id])]
        script = (f"var global = global || {{}};\n    global.data = {_json(data)};\n"
                  f"    global.specialid = {special_id};")
        return web.Response(body=_page(f"精选集 {special_id}", script), content_type="text/html")

    async def share(request: web.Request) -> web.Response:
        if (r := override(request)) is not None:
            return r
        chain = request.match_info["chain"]
        if chain not in kugou.shares:
            raise web.HTTPNotFound()
        data = [{"author_name": s.author_name, "song_name": s.song_name, "hash": s.hash, "album_id": s.album_id,
                 "mixsongid": s.mixsongid, "timelength": str(s.timelength_ms)}
                for s in songs_of(kugou.shares[chain])]
        script = (f"var dataFromSmarty = {_json(data)},//当前页面歌曲信息\n"
                  f"        playData = {{\"index\": 0}};")
        return web.Response(body=_page("分享", script), content_type="text/html")

    async def rank(request: web.Request) -> web.Response:
        if (r := override(request)) is not None:
            return r
        rank_id = request.match_info["rank"]
        if rank_id not in kugou.ranks:
            raise web.HTTPNotFound()
        data = [{"Hash": s.hash, "FileName": s.audio_name, "timeLen": s.timelength_ms // 1000,
                 "size": len(s.audio), "album_id": s.album_id, "encrypt_id": s.mixsongid}
                for s in songs_of(kugou.ranks[rank_id])]
        script = f"var global = global || {{}};\n    global.features = {_json(data)};"
        return web.Response(body=_page("酷狗TOP500", script), content_type="text/html")

    async def album(request: web.Request) -> web.Response:
        # The album page keeps its songs in `var data=[...]` (the shape public downloaders read).
        if (r := override(request)) is not None:
            return r
        album_id = request.match_info["id"]
        if album_id not in kugou.albums:
            raise web.HTTPNotFound()
        data = [{"hash": s.hash, "timelen": s.timelength_ms, "filename": s.audio_name, "album_id": s.album_id,
                 "album_audio_id": s.mixsongid} for s in songs_of(kugou.albums[album_id])]
        script = f"var data={_json(data)};"
        return web.Response(body=_page(f"专辑 {album_id}", script), content_type="text/html")

    async def singer(request: web.Request) -> web.Response:
        # The singer page lists songs as links: <a title="Artist - Title" data="HASH|ALBUM_ID">.
        if (r := override(request)) is not None:
            return r
        singer_id = request.match_info["id"]
        if singer_id not in kugou.singers:
            raise web.HTTPNotFound()
        rows = "".join(f'<li><a hidefocus="true" title="{html.escape(s.audio_name)}" '
                       f'data="{s.hash}|{s.album_id}" href="javascript:;">{html.escape(s.song_name)}</a></li>\n'
                       for s in songs_of(kugou.singers[singer_id]))
        body = _page(f"歌手 {singer_id}", "var singerPage = true;").replace(
            b'<div id="songs"></div>', f'<ul id="song_container">\n{rows}</ul>'.encode())
        return web.Response(body=body, content_type="text/html")

    async def search(request: web.Request) -> web.Response:
        if (r := override(request)) is not None:
            return r
        q = request.query
        kugou.search_requests.append(dict(q))
        words = q.get("keyword", "").lower().split()
        page, size = int(q.get("page", "1")), int(q.get("pagesize", "30"))
        hits = [s for s in kugou.songs.values()
                if words and all(w in f"{s.author_name} {s.song_name}".lower() for w in words)]
        lists = [{"SongName": s.song_name, "SingerName": s.author_name, "AlbumID": s.album_id,
                  "AlbumName": s.album_name, "FileHash": s.hash, "HQFileHash": "", "SQFileHash": "",
                  "Duration": s.timelength_ms // 1000, "FileSize": len(s.audio), "EMixSongID": s.mixsongid}
                 for s in hits[(page - 1) * size:page * size]]
        return web.json_response({"status": 1, "error_code": 0, "error_msg": "",
                                  "data": {"page": page, "pagesize": size, "total": len(hits), "lists": lists}})

    async def song_info(request: web.Request) -> web.Response:
        q = request.query
        song_hash = (q.get("hash") or "").upper()
        kugou.song_info_requests.append(song_hash)
        song = kugou.songs.get(song_hash)
        if q.get("cmd") != "playInfo" or song is None or not kugou.song_info_up:
            return web.json_response({"status": 0, "errcode": 1, "error": "hash error"})
        origin = f"{request.scheme}://{request.host}"
        url = "" if song.paid else kugou.sign(song, request.headers.get("User-Agent", ""), origin)
        return web.json_response({
            "status": 1, "errcode": 0, "error": "", "url": url, "fileName": song.audio_name,
            "songName": song.song_name, "singerName": song.author_name, "fileSize": len(song.audio),
            "bitRate": song.bitrate, "timeLength": song.timelength_ms // 1000, "extName": "mp3",
            "imgUrl": f"{origin}/stdmusic/{{size}}/20200909/{song.hash[:8]}.jpg",
            "extra": {"128hash": song.hash, "128filesize": len(song.audio), "320hash": "", "sqhash": ""}})

    async def song_page(request: web.Request) -> web.Response:
        # The song page is a script shell: the song is named in the fragment the server never sees.
        return web.Response(body=_page("酷狗音乐", "var songPage = true;"), content_type="text/html")

    async def plist(request: web.Request) -> web.Response:
        if (r := override(request)) is not None:
            return r
        special_id = request.match_info["id"]
        if special_id not in kugou.specials:
            raise web.HTTPNotFound()
        songs = songs_of(kugou.specials[special_id])
        if request.query.get("json") != "true":
            return web.Response(body=_page("歌单", ""), content_type="text/html")
        info = [{"hash": s.hash, "filename": s.audio_name, "duration": s.timelength_ms // 1000,
                 "album_id": s.album_id, "filesize": len(s.audio), "mixsongid": s.mixsongid} for s in songs]
        body = {"JS_CSS_DATE": 20210101, "kg_domain": "https://m.kugou.com", "src": "http://downmobile.kugou.com",
                "info": {"list": {"specialid": int(special_id), "specialname": f"list {special_id}"}},
                "list": {"list": {"total": len(info), "info": info}, "page": 1, "pagesize": 30}}
        return web.json_response(body)

    async def play_data(request: web.Request) -> web.Response:
        q = request.query
        song_hash = (q.get("hash") or "").upper()
        user_agent = request.headers.get("User-Agent", "")
        kugou.play_requests.append({"hash": song_hash, "user_agent": user_agent,
                                    "kg_mid": request.cookies.get("kg_mid"), "mid": q.get("mid"),
                                    "referer": request.headers.get("Referer")})
        if q.get("r") != "play/getdata":
            raise web.HTTPNotFound()
        if song_hash in kugou.play_down:
            return web.Response(status=503, text="service unavailable")
        if kugou.play_body is not None:
            return web.Response(text=kugou.play_body, content_type="text/html")
        song = kugou.songs.get(song_hash)
        if kugou.require_cookie and not request.cookies.get("kg_mid"):
            payload: dict[str, object] = {"status": 0, "err_code": 20010, "data": []}
        elif kugou.verify_failures.get(song_hash, 0) > 0:
            kugou.verify_failures[song_hash] -= 1
            payload = {"status": 0, "err_code": 20010, "data": []}
        elif song is None:
            payload = {"status": 0, "err_code": 30020, "data": []}
        else:
            origin = f"{request.scheme}://{request.host}"
            url = "" if song.paid else kugou.sign(song, user_agent, origin)
            backup = "" if song.paid else url.replace("/G076/", "/G077/")
            payload = {"status": 1, "err_code": 0, "data": {
                "hash": song.hash, "timelength": song.timelength_ms, "filesize": len(song.audio),
                "audio_name": song.audio_name, "have_album": 1, "album_name": song.album_name,
                "album_id": song.album_id, "img": f"{origin}/stdmusic/{{size}}/20200909/{song.hash[:8]}.jpg",
                "have_mv": 0, "video_id": 0, "author_name": song.author_name, "song_name": song.song_name,
                "lyrics": "[00:00.78]" + song.song_name, "author_id": "3520",
                "authors": [{"author_id": "3520", "author_name": song.author_name, "is_publish": "1"}],
                "privilege": 10 if song.paid else 0, "bitrate": song.bitrate, "is_free_part": 0,
                "play_url": url, "play_backup_url": backup}}
        body = json.dumps(payload, ensure_ascii=False)
        callback = q.get("callback")
        if callback:
            return web.Response(text=f"{callback}({body});", content_type="text/html")
        return web.Response(text=body, content_type="application/json")

    async def download(request: web.Request) -> web.StreamResponse:
        link = kugou.links.get(request.match_info["sig"])
        user_agent = request.headers.get("User-Agent", "")
        record: dict[str, object] = {"path": request.path, "user_agent": user_agent,
                                     "range": request.headers.get("Range")}
        kugou.downloads.append(record)
        if link is None:
            record["status"] = 404
            raise web.HTTPNotFound()
        if link.hash in kugou.dead_primary and "/G076/" in request.path:
            record["status"] = 404
            raise web.HTTPNotFound()
        if user_agent != link.user_agent:
            record["status"] = 403
            return web.Response(status=403, text="forbidden: this address was issued to another client")
        if kugou.clock() - link.issued_at > kugou.link_lifetime:
            record["status"] = kugou.expired_status
            return web.Response(status=kugou.expired_status, text="expired")
        song = kugou.songs[link.hash]
        body, total = song.audio, len(song.audio)
        headers = {"ETag": song.etag, "Accept-Ranges": "bytes", "Content-Type": "audio/mpeg"}
        range_header = request.headers.get("Range")
        if_range = request.headers.get("If-Range")
        if range_header and (if_range is None or if_range == song.etag):
            m = _RANGE.match(range_header.strip())
            start = end = None
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    start = int(m.group(1))
                    end = int(m.group(2)) if m.group(2) else total - 1
                else:  # suffix range: the last N bytes
                    start, end = max(0, total - int(m.group(2))), total - 1
            if start is None or end is None or start >= total or end < start:
                record["status"] = 416
                return web.Response(status=416, headers={"Content-Range": f"bytes */{total}"})
            end = min(end, total - 1)
            record["status"] = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
            return web.Response(status=206, body=body[start:end + 1], headers=headers)
        record["status"] = 200
        return web.Response(body=body, headers=headers)

    async def cover(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xd8\xff\xe0" + bytes(64), content_type="image/jpeg")

    app.router.add_get(r"/yy/special/single/{id:\d+}.html", special)
    app.router.add_get(r"/share/{chain:[\w-]+}.html", share)
    app.router.add_get(r"/yy/rank/home/{rank:\d+-\d+}.html", rank)
    app.router.add_get(r"/album/{id:\d+}.html", album)
    app.router.add_get(r"/singer/{id:\d+}.html", singer)
    app.router.add_get("/song_search_v2", search)
    app.router.add_get("/app/i/getSongInfo.php", song_info)
    app.router.add_get("/song/", song_page)
    app.router.add_get(r"/plist/list/{id:\d+}", plist)
    app.router.add_get("/yy/index.php", play_data)
    app.router.add_get(r"/{stamp:\d{12}}/{sig:[0-9a-f]{32}}/{rest:.*}", download)
    app.router.add_get(r"/stdmusic/{rest:.*}", cover)
    return app, kugou


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run ``app`` on 127.0.0.1 with an OS-chosen port; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
