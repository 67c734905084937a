"""Kugou (kugou.com): song lists from playlist, share and rank pages, real addresses from the play-data API.

The pages never contain an audio address. They list songs (hash + album id) in inline scripts; the
play-data API turns one song into a signed, expiring address that works only for the User-Agent and
kg_mid cookie that asked for it, so every item carries that identity for its download. Kugou changes its
shapes now and then: anything unexpected becomes a failed item with a reason, never a crash and never an item
built from garbage.

The shapes, as public open-source clients (listen1, Meting, musicdl, lx-music, KuGouMusicApi) read them:

- playlist pages ``/yy/special/single/<id>.html``: ``global.data = [{hash, album_id ...}, ...];`` in a script;
  share pages ``/share/<chain>.html``: ``var dataFromSmarty = [{author_name, song_name, hash, album_id,
  mixsongid}, ...],``; rank pages ``/yy/rank/home/<n>-<id>.html``: ``global.features = [{Hash, FileName
  ("Artist - Title"), timeLen, size, album_id, encrypt_id}, ...];``. A song page is
  ``/song/#hash=<HASH>&album_id=<ALBUM>``: the song is named in the fragment, which no server sees. The JSON
  twin of a playlist is ``<mobile>/plist/list/<specialid>?json=true`` -> ``list.list.info[].{hash, album_id}``.
- play data: ``<api_base>/yy/index.php?r=play/getdata&hash=&album_id=`` (with ``mid``, ``platid=4``, ``_``,
  optionally ``callback`` for JSONP), sent with a desktop User-Agent, ``Referer: https://www.kugou.com/`` and a
  ``kg_mid`` cookie. Success is ``{"status": 1, "err_code": 0, "data": {hash, timelength (ms), filesize,
  audio_name, song_name, author_name, authors, album_name, album_id, img, lyrics, bitrate (kbps), privilege,
  play_url, play_backup_url}}``; ``err_code`` 20010 means a missing cookie or a verification; a paid or
  region-blocked song has an empty ``play_url`` (found but unavailable). ``play_url`` carries a time and a
  signature: it expires, so a resumed download may need a fresh address first.
- the mobile variant, ``<mobile>/app/i/getSongInfo.php?cmd=playInfo&hash=``: a flat camelCase body (``url``,
  ``fileName``, ``songName``, ``singerName``, ``fileSize``, ``bitRate``, ``timeLength`` (s), ``extName``,
  ``imgUrl``, ``errcode``, ``status``, ``error``).
- search: ``songsearch.kugou.com/song_search_v2?keyword=&page=&pagesize=30`` -> ``{"error_code": 0, "data":
  {"total", "lists": [{SongName, SingerName, AlbumID, AlbumName, FileHash, Duration, FileSize ...}]}}``.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import math
import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx

from crawler.items import FAILED, OK, UNAVAILABLE, AudioItem, RequestIdentity
from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    parse_section,
)
from crawler.resolvers.jsdata import LiteralError, find_literal, parse_literal
from crawler.web.page import FetchedPage

log = logging.getLogger(__name__)

# The web API answers browsers; this is what the public clients send.
DESKTOP_USER_AGENT = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
                      "Chrome/120.0.0.0 Safari/537.36")
ERR_VERIFY = 20010  # missing kg_mid cookie, or the API wants a verification
SEARCH_HOST = "songsearch.kugou.com"
SEARCH_API_BASE = f"https://{SEARCH_HOST}"
SEARCH_PAGE_SIZE = 30


def song_fragment_rule(www_hosts: tuple[str, ...]) -> tuple[str, ...]:
    """The ``keep_fragment`` rule of Kugou's song pages on these hosts: their fragment names the song
    (``/song/#hash=<hash>&album_id=<id>``), so the URL normaliser must keep it. Searched in the normalised URL
    without its fragment (crawler.web.urls)."""
    hosts = "|".join(re.escape(h) for h in www_hosts)
    return (rf"^https?://(?:{hosts})/song/",) if hosts else ()


@dataclass(frozen=True)
class KugouConfig:
    api_base: str = "https://wwwapi.kugou.com"        # play data: <api_base>/yy/index.php?r=play/getdata
    mobile_api_base: str = "http://m.kugou.com"       # JSON twin of playlists: <base>/plist/list/<id>?json=true
    www_hosts: tuple[str, ...] = ("www.kugou.com", "kugou.com")
    mobile_hosts: tuple[str, ...] = ("m.kugou.com",)
    referer: str = "https://www.kugou.com/"
    user_agent: str | None = DESKTOP_USER_AGENT       # null: the worker's own User-Agent
    mid: str | None = None                             # kg_mid cookie; null: a random one per process
    dfid: str | None = None
    jsonp: bool = True                                 # ask for JSONP as the web player does
    verify_retries: int = 2                            # extra attempts after err_code 20010
    retry_delay: float = 1.0                           # seconds, doubled on each retry
    timeout: float = 15.0
    concurrency: int = 4                               # play-data requests in flight per page
    max_songs: int = 500                               # per page
    cover_size: int = 480                              # Kugou cover URLs carry a {size} placeholder
    # Keyword search: song_search_v2 URLs on these hosts (as seeds expand them) are asked at search_api_base.
    search_api_base: str = SEARCH_API_BASE
    search_hosts: tuple[str, ...] = (SEARCH_HOST,)
    search_pages: int = 3                              # result pages followed per keyword
    song_info: bool = True                             # the mobile getSongInfo API when play data fails
    max_lyrics: int = 65536                            # characters of lyrics kept per song

    def __post_init__(self) -> None:
        for key in ("api_base", "mobile_api_base", "referer", "search_api_base"):
            value = getattr(self, key)
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ResolverConfigError(f"kugou.{key}: must be an http(s) URL, got {value!r}")
        for key in ("www_hosts", "mobile_hosts", "search_hosts"):
            for host in getattr(self, key):
                if not host or "/" in host or host != host.strip().lower():
                    raise ResolverConfigError(f"kugou.{key}: {host!r} must be a lower-case host[:port]")
        if self.mid is not None and not re.fullmatch(r"[0-9a-zA-Z]{8,64}", self.mid):
            raise ResolverConfigError("kugou.mid: must be 8 to 64 letters or digits")
        for key in ("verify_retries", "concurrency", "max_songs", "cover_size", "search_pages", "max_lyrics"):
            minimum = 0 if key in ("verify_retries", "max_lyrics") else 1
            if getattr(self, key) < minimum:
                raise ResolverConfigError(f"kugou.{key}: must be at least {minimum}")
        for key in ("retry_delay", "timeout"):
            if getattr(self, key) < 0 or (key == "timeout" and self.timeout == 0):
                raise ResolverConfigError(f"kugou.{key}: must be positive")


@dataclass(frozen=True)
class ListedSong:
    """A song as a page lists it: enough to ask the API, plus what to record if the API will not say."""

    hash: str
    album_id: str = ""
    title: str | None = None
    artist: str | None = None
    duration: float | None = None
    mixsongid: str | None = None
    album: str | None = None


_HASH = re.compile(r"[0-9A-Fa-f]{32}")
_SPECIAL = re.compile(r"^/yy/special/single/(\d+)\.html$")
_SHARE = re.compile(r"^/share/[\w-]+\.html$")
_RANK = re.compile(r"^/yy/rank/home/\d+-\d+\.html$")
_SONG = re.compile(r"^/song/?$")
_PLIST = re.compile(r"^/plist/list/(\d+)/?$")
# Album and singer pages, at their current and their older (/yy/...) addresses.
_ALBUM = re.compile(r"^/(?:album|yy/album/single)/(\d+)\.html$")
_SINGER = re.compile(r"^/(?:singer|yy/singer/home)/(\d+)\.html$")
_SEARCH = re.compile(r"^/song_search_v2/?$")
# Song links as older list pages write them: <a title="Artist - Title" data="HASH|ALBUM_ID">.
_DATA_ANCHOR = re.compile(r"""<a\b[^>]{0,2000}?\bdata="([0-9A-Fa-f]{32})\|(\d*)"[^>]{0,2000}>""", re.IGNORECASE)
_TITLE_ATTR = re.compile(r'\btitle="([^"]{1,500})"')
_JSONP = re.compile(r"^\s*(?:/\*\*/\s*)?[\w$.]+\s*\((.*)\)\s*;?\s*$", re.DOTALL)
# Where each page kind keeps its song list.
_LIST_VARIABLES = {"special": "global.data", "share": "dataFromSmarty", "rank": "global.features",
                   "album": "data", "singer": "data"}


def unwrap_jsonp(text: str) -> Any:
    """The JSON value of a JSONP (``cb({...});``) or plain JSON body; ValueError if it is neither."""
    m = _JSONP.match(text)
    try:
        return json.loads(m.group(1) if m else text)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def _text(value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    value = " ".join(value.split())
    return value[:500] or None


def _split_name(name: str | None) -> tuple[str | None, str | None]:
    """Kugou's "Artist - Title" file names: (artist, title)."""
    if not name:
        return None, None
    artist, sep, title = name.partition(" - ")
    if sep and artist.strip() and title.strip():
        return artist.strip(), title.strip()
    return None, name.strip()


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None  # JSON from the wild may say Infinity or NaN
    return float(value)


def _seconds(value: Any, unit_ms: bool | None) -> float | None:
    n = _number(value)
    if n is None:
        return None
    if unit_ms is None:
        # Page lists mix seconds and milliseconds under similar names; no song lasts ten hours.
        unit_ms = n > 36_000
    return n / 1000 if unit_ms else n


def _listed_song(raw: Any) -> ListedSong | None:
    if not isinstance(raw, Mapping):
        return None
    d = {str(k).lower(): v for k, v in raw.items()}
    song_hash = _text(d.get("hash") or d.get("filehash"))
    if not song_hash or not _HASH.fullmatch(song_hash):
        return None
    artist_from_name, title_from_name = _split_name(_text(d.get("filename") or d.get("audio_name")))
    album_id = _text(d.get("album_id") or d.get("albumid")) or ""
    return ListedSong(
        hash=song_hash.upper(),
        album_id=album_id if album_id.isdigit() else "",
        title=_text(d.get("song_name") or d.get("songname")) or title_from_name,
        artist=_text(d.get("author_name") or d.get("singername")) or artist_from_name,
        duration=_seconds(d.get("timelength") or d.get("timelen") or d.get("duration"), None),
        mixsongid=_text(d.get("mixsongid") or d.get("encrypt_id") or d.get("album_audio_id")),
        album=_text(d.get("album_name") or d.get("albumname")),
    )


def songs_from_list(raw: Any) -> list[ListedSong]:
    if not isinstance(raw, list):
        raise LiteralError(f"expected a list of songs, got {type(raw).__name__}")
    seen: set[str] = set()
    songs = []
    for entry in raw:
        song = _listed_song(entry)
        if song is None:
            log.debug("kugou: skipping a list entry without a valid hash")
        elif song.hash not in seen:
            seen.add(song.hash)
            songs.append(song)
    return songs


def songs_from_page(kind: str, text: str) -> list[ListedSong]:
    """The songs a playlist, share or rank page lists; LiteralError if its list is missing or unreadable."""
    variable = _LIST_VARIABLES[kind]
    literal = find_literal(text, variable)
    if literal is None:
        if kind in ("album", "singer"):
            anchored = songs_from_anchors(text)
            if anchored:
                return anchored
        raise LiteralError(f"no {variable} list in the page")
    return songs_from_list(parse_literal(literal))


def songs_from_anchors(text: str) -> list[ListedSong]:
    """Songs listed as <a title="Artist - Title" data="HASH|ALBUM_ID"> links, as older list pages do."""
    seen: set[str] = set()
    songs = []
    for m in _DATA_ANCHOR.finditer(text):
        song_hash = m.group(1).upper()
        if song_hash in seen:
            continue
        seen.add(song_hash)
        title_attr = _TITLE_ATTR.search(m.group(0))
        artist, title = _split_name(_text(html.unescape(title_attr.group(1))) if title_attr else None)
        songs.append(ListedSong(hash=song_hash, album_id=m.group(2), title=title, artist=artist))
    return songs


def search_url(words: str, page: int = 1, base: str = SEARCH_API_BASE) -> str:
    """The song_search_v2 address of one page of results for ``words`` (a seed, or the next page)."""
    query = urlencode({"keyword": " ".join(words.split()), "page": page, "pagesize": SEARCH_PAGE_SIZE})
    return f"{base.rstrip('/')}/song_search_v2?{query}"


def songs_from_search(payload: Any) -> tuple[list[ListedSong], int]:
    """data.lists[] of song_search_v2, and data.total; LiteralError if the shape is not that."""
    if not isinstance(payload, Mapping) or payload.get("error_code") not in (0, "0", None):
        code = payload.get("error_code") if isinstance(payload, Mapping) else None
        raise LiteralError(f"search refused: error_code {code!r}")
    data = payload.get("data")
    lists = data.get("lists") if isinstance(data, Mapping) else None
    if not isinstance(lists, list):
        raise LiteralError("no data.lists in the search answer")
    songs = []
    for raw in lists:
        if not isinstance(raw, Mapping):
            continue
        song_hash = _text(raw.get("FileHash"))
        if not song_hash or not _HASH.fullmatch(song_hash):
            continue
        album_id = _text(raw.get("AlbumID")) or ""
        songs.append(ListedSong(hash=song_hash.upper(), album_id=album_id if album_id.isdigit() else "",
                                title=_text(raw.get("SongName")), artist=_text(raw.get("SingerName")),
                                duration=_seconds(raw.get("Duration"), False), album=_text(raw.get("AlbumName")),
                                mixsongid=_text(raw.get("EMixSongID"))))
    total = data.get("total") if isinstance(data, Mapping) else None
    return songs, total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else len(songs)


def songs_from_plist(payload: Any) -> list[ListedSong]:
    """list.list.info[] of the JSON playlist twin."""
    try:
        info = payload["list"]["list"]["info"]
    except (KeyError, TypeError, IndexError) as exc:
        raise LiteralError("no list.list.info in the playlist JSON") from exc
    return songs_from_list(info)


def song_from_fragment(url: str) -> ListedSong | None:
    """A song URL names its song in the fragment: /song/#hash=<HASH>&album_id=<ALBUM>."""
    try:
        fragment = urlsplit(url).fragment
    except ValueError:
        return None
    params = parse_qs(fragment)
    song_hash = (params.get("hash") or [""])[0]
    if not _HASH.fullmatch(song_hash):
        return None
    album_id = (params.get("album_id") or [""])[0]
    return ListedSong(hash=song_hash.upper(), album_id=album_id if album_id.isdigit() else "")


class KugouResolver(Resolver):
    name = "kugou"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings = parse_section(KugouConfig, self.name, config)
        self.mid = self.settings.mid or uuid.uuid4().hex
        self.keep_fragment = song_fragment_rule(self.settings.www_hosts)

    @classmethod
    def seed_url(cls, kind: str, words: str) -> str:
        return search_url(words)       # kugou-search: the first page of the keyword search

    @classmethod
    def default_keep_fragment(cls) -> tuple[str, ...]:
        return song_fragment_rule(KugouConfig.www_hosts)

    @classmethod
    def scope_hosts(cls, seed_hosts: Sequence[str]) -> tuple[str, ...]:
        # A keyword search leads to Kugou's song pages.
        return (KugouConfig.www_hosts[0],) if SEARCH_HOST in seed_hosts else ()

    # Which URLs are ours.
    def _kind(self, url: str) -> str | None:
        try:
            parts = urlsplit(url)
        except ValueError:
            return None
        if parts.scheme not in ("http", "https"):
            return None
        host = parts.netloc.lower()
        if host in self.settings.www_hosts:
            if _SPECIAL.match(parts.path):
                return "special"
            if _SHARE.match(parts.path):
                return "share"
            if _RANK.match(parts.path):
                return "rank"
            if _SONG.match(parts.path) and "hash=" in parts.fragment:
                return "song"
            if _ALBUM.match(parts.path):
                return "album"
            if _SINGER.match(parts.path):
                return "singer"
        if host in self.settings.mobile_hosts and _PLIST.match(parts.path):
            return "plist"
        if host in self.settings.search_hosts and _SEARCH.match(parts.path) and "keyword=" in parts.query:
            return "search"
        return None

    def claims(self, url: str) -> bool:
        return self._kind(url) is not None

    def needs_page(self, url: str) -> bool:
        # A song is named by the fragment, which the server never sees; the plist twin and the search are
        # asked as JSON APIs.
        return self._kind(url) not in ("song", "plist", "search")

    # Identity the API and the download must share.
    def _user_agent(self, ctx: ResolveContext) -> str:
        return self.settings.user_agent or ctx.user_agent

    def identity(self, ctx: ResolveContext) -> RequestIdentity:
        cookies = [("kg_mid", self.mid)]
        if self.settings.dfid:
            cookies.append(("kg_dfid", self.settings.dfid))
        return RequestIdentity(user_agent=self._user_agent(ctx), headers=(("Referer", self.settings.referer),),
                               cookies=tuple(cookies))

    async def resolve(self, url: str, page: FetchedPage | None, ctx: ResolveContext) -> Resolution:
        kind = self._kind(url)
        if kind is None:
            return Resolution()
        if kind == "song":
            song = song_from_fragment(url)
            if song is None:
                return Resolution(items=[self._page_failure(url, "song URL has no valid hash in its fragment")])
            return Resolution(items=[await self.resolve_song(song, url, ctx)])
        if kind == "search":
            return await self._search(url, ctx)
        try:
            songs = await self._list_songs(kind, url, page, ctx)
        except LiteralError as exc:
            log.warning("kugou: %s: %s", url, exc)
            return Resolution(items=[self._page_failure(url, f"song list not understood: {exc}")])
        if len(songs) > self.settings.max_songs:
            log.info("kugou: %s lists %d songs, keeping the first %d", url, len(songs), self.settings.max_songs)
            songs = songs[:self.settings.max_songs]
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def one(song: ListedSong) -> AudioItem:
            async with gate:
                return await self.resolve_song(song, url, ctx)

        return Resolution(items=list(await asyncio.gather(*(one(s) for s in songs))))

    async def _search(self, url: str, ctx: ResolveContext) -> Resolution:
        """One page of keyword results: each song becomes its song URL to crawl, and the next page a link."""
        query = parse_qs(urlsplit(url).query)
        words = (query.get("keyword") or [""])[0]
        try:
            page_no = max(1, int((query.get("page") or ["1"])[0]))
        except ValueError:
            page_no = 1
        endpoint = f"{self.settings.search_api_base.rstrip('/')}/song_search_v2"
        params = {"keyword": words, "page": str(page_no), "pagesize": str(SEARCH_PAGE_SIZE)}
        try:
            songs, total = songs_from_search(await self._get_json(endpoint, params, ctx))
        except LiteralError as exc:
            log.warning("kugou: search %r: %s", words, exc)
            return Resolution(items=[self._page_failure(url, f"search not understood: {exc}")])
        links = [self.song_url(s) for s in songs[:self.settings.max_songs]]
        if page_no < self.settings.search_pages and page_no * SEARCH_PAGE_SIZE < total:
            links.append(search_url(words, page_no + 1, f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"))
        return Resolution(links=links)

    def song_url(self, song: ListedSong) -> str:
        """The web player's address of one song: what a search result or a list entry points at."""
        host = self.settings.www_hosts[0] if self.settings.www_hosts else KugouConfig.www_hosts[0]
        scheme = urlsplit(self.settings.referer).scheme or "https"
        album = f"&album_id={song.album_id}" if song.album_id else ""
        return f"{scheme}://{host}/song/#hash={song.hash}{album}"

    async def _list_songs(self, kind: str, url: str, page: FetchedPage | None,
                          ctx: ResolveContext) -> list[ListedSong]:
        if kind == "plist":
            list_id = _PLIST.match(urlsplit(url).path).group(1)  # type: ignore[union-attr]
            origin = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
            return songs_from_plist(await self._get_json(f"{origin}/plist/list/{list_id}", {"json": "true"}, ctx))
        if page is None or page.status >= 400:
            raise LiteralError(f"page not fetched (status {page.status if page else 'none'})")
        try:
            return songs_from_page(kind, page.text())
        except LiteralError:
            special = _SPECIAL.match(urlsplit(url).path)
            if kind != "special" or special is None:
                raise
        # The page changed shape: its JSON twin on the mobile site lists the same songs.
        twin = f"{self.settings.mobile_api_base.rstrip('/')}/plist/list/{special.group(1)}"
        return songs_from_plist(await self._get_json(twin, {"json": "true"}, ctx))

    async def _get_json(self, url: str, params: Mapping[str, str], ctx: ResolveContext) -> Any:
        try:
            resp = await ctx.http.client.get(url, params=params, headers=self.identity(ctx).request_headers(),
                                             timeout=self.settings.timeout)
        except httpx.HTTPError as exc:
            raise LiteralError(f"{url}: request failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise LiteralError(f"{url}: HTTP {resp.status_code}")
        try:
            return unwrap_jsonp(resp.text)
        except ValueError as exc:
            raise LiteralError(f"{url}: body is not JSON") from exc

    def _page_failure(self, url: str, reason: str) -> AudioItem:
        return AudioItem(url="", page=url, status=FAILED, reason=reason, resolver=self.name)

    # One song: the play-data API.
    def _play_params(self, song: ListedSong, ctx: ResolveContext) -> dict[str, str]:
        now_ms = int(ctx.clock() * 1000)
        params = {"r": "play/getdata", "hash": song.hash, "album_id": song.album_id, "mid": self.mid,
                  "dfid": self.settings.dfid or "-", "platid": "4", "_": str(now_ms)}
        if song.mixsongid:
            params["album_audio_id"] = song.mixsongid
        if self.settings.jsonp:
            params["callback"] = f"jQuery1910{random.randrange(10**15, 10**16)}_{now_ms}"
        return params

    async def resolve_song(self, song: ListedSong, page_url: str, ctx: ResolveContext) -> AudioItem:
        """One item for one song: OK with a signed address, UNAVAILABLE, or FAILED with the reason.

        The web play-data API first; when it fails (not when it says the song is paid), the mobile
        getSongInfo API, which answers for many songs the web API will not."""
        listed = AudioItem(url="", page=page_url, title=song.title, artist=song.artist, duration=song.duration,
                           album=song.album, resolver=self.name, source_id=song.hash,
                           extra={"hash": song.hash, "album_id": song.album_id})
        listed = listed.replace(meta_source=dict.fromkeys(
            (k for k in ("title", "artist", "album", "duration") if getattr(listed, k) is not None), "kugou"))
        identity = self.identity(ctx)
        item = await self._play_data(song, listed, identity, ctx)
        if item.status != FAILED or not self.settings.song_info:
            return item
        fallback = await self._song_info(song, listed, identity, ctx)
        if fallback.status == FAILED:
            return item.replace(reason=f"{item.reason}; getSongInfo: {fallback.reason}")
        return fallback

    async def _song_info(self, song: ListedSong, listed: AudioItem, identity: RequestIdentity,
                         ctx: ResolveContext) -> AudioItem:
        """The mobile API's flat camelCase answer (getSongInfo.php: the module's notes list its keys)."""
        endpoint = f"{self.settings.mobile_api_base.rstrip('/')}/app/i/getSongInfo.php"
        try:
            data = await self._get_json(endpoint, {"cmd": "playInfo", "hash": song.hash}, ctx)
        except LiteralError as exc:
            return listed.replace(status=FAILED, reason=str(exc))
        if not isinstance(data, Mapping):
            return listed.replace(status=FAILED, reason="answer is not an object")
        if data.get("errcode") not in (0, "0", None) or data.get("status") not in (1, "1", None):
            return listed.replace(status=FAILED,
                                  reason=f"refused: status {data.get('status')!r}, errcode {data.get('errcode')!r}")
        artist_from_name, title_from_name = _split_name(_text(data.get("fileName")))
        cover = _text(data.get("imgUrl"))
        if cover:
            cover = cover.replace("{size}", str(self.settings.cover_size))
        bitrate = _number(data.get("bitRate"))
        found = {"title": _text(data.get("songName")) or title_from_name,
                 "artist": _text(data.get("singerName")) or artist_from_name,
                 "duration": _seconds(data.get("timeLength"), False),
                 "bitrate": int(bitrate) if bitrate else None,
                 "cover": cover if cover and cover.startswith(("http://", "https://")) else None}
        item = listed.with_meta({k: v for k, v in found.items() if v is not None}, dict.fromkeys(found, "kugou"))
        extra = {**listed.extra, "via": "getSongInfo"}
        filesize = _number(data.get("fileSize"))
        if filesize:
            extra["filesize"] = int(filesize)
        url = data.get("url")
        if url in ("", None):
            return item.replace(status=UNAVAILABLE, extra=extra, reason="no url from getSongInfo: paid or blocked")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return item.replace(status=FAILED, reason="getSongInfo url is not an http(s) URL")
        return item.replace(url=url, status=OK, reason=None, identity=identity,
                            extra={**extra, "issued_at": ctx.clock()})

    async def _play_data(self, song: ListedSong, listed: AudioItem, identity: RequestIdentity,
                         ctx: ResolveContext) -> AudioItem:
        endpoint = f"{self.settings.api_base.rstrip('/')}/yy/index.php"
        attempts = 1 + self.settings.verify_retries
        for attempt in range(attempts):
            try:
                resp = await ctx.http.client.get(endpoint, params=self._play_params(song, ctx),
                                                 headers=identity.request_headers(), timeout=self.settings.timeout)
            except httpx.HTTPError as exc:
                return listed.replace(status=FAILED, reason=f"play-data request failed: {type(exc).__name__}")
            if resp.status_code != 200:
                return listed.replace(status=FAILED, reason=f"play-data HTTP {resp.status_code}")
            try:
                payload = unwrap_jsonp(resp.text)
            except ValueError:
                return listed.replace(status=FAILED, reason="play-data body is neither JSON nor JSONP")
            if not isinstance(payload, Mapping):
                return listed.replace(status=FAILED, reason="play-data body is not an object")
            err = payload.get("err_code")
            if err == ERR_VERIFY:
                if attempt + 1 < attempts:
                    await asyncio.sleep(self.settings.retry_delay * (2 ** attempt))
                    continue
                return listed.replace(status=FAILED,
                                      reason=f"err_code {ERR_VERIFY} (verification) after {attempts} attempts")
            if err not in (0, None, "0") or payload.get("status") not in (1, "1"):
                return listed.replace(status=FAILED,
                                      reason=f"play-data refused: status {payload.get('status')!r}, err_code {err!r}")
            data = payload.get("data")
            if not isinstance(data, Mapping):
                return listed.replace(status=FAILED, reason="play-data has no data object")
            return self._item_from_data(listed, data, identity, ctx)
        raise AssertionError("unreachable: the loop returns on its last attempt")

    def _item_from_data(self, listed: AudioItem, data: Mapping[str, Any], identity: RequestIdentity,
                        ctx: ResolveContext) -> AudioItem:
        artist_from_name, title_from_name = _split_name(_text(data.get("audio_name")))
        authors = data.get("authors")
        author_names = [_text(a.get("author_name")) for a in authors if isinstance(a, Mapping)] \
            if isinstance(authors, list) else []
        cover = _text(data.get("img"))
        if cover:
            cover = cover.replace("{size}", str(self.settings.cover_size))
        bitrate = _number(data.get("bitrate"))
        extra = dict(listed.extra)
        album_id = _text(data.get("album_id"))
        if album_id and album_id.isdigit():
            extra["album_id"] = album_id
        filesize = _number(data.get("filesize"))
        if filesize:
            extra["filesize"] = int(filesize)
        backup = _text(data.get("play_backup_url"))
        if backup and backup.startswith(("http://", "https://")):
            extra["backup_url"] = backup
        privilege = data.get("privilege")
        if isinstance(privilege, int):
            extra["privilege"] = privilege
        lyrics = data.get("lyrics")
        found = {
            "title": _text(data.get("song_name")) or title_from_name,
            "artist": _text(data.get("author_name")) or ", ".join(n for n in author_names if n) or artist_from_name,
            "album": _text(data.get("album_name")),
            "duration": _seconds(data.get("timelength"), True),
            "bitrate": int(bitrate) if bitrate else None,
            "cover": cover if cover and cover.startswith(("http://", "https://")) else None,
            # The song's own introduction, where the answer carries one.
            "description": _text(data.get("intro") or data.get("song_intro")),
            "lyrics": lyrics.strip()[:self.settings.max_lyrics] or None
            if isinstance(lyrics, str) and self.settings.max_lyrics else None,
        }
        sources = dict(listed.meta_source)
        sources.update((k, "kugou") for k, v in found.items() if v is not None)
        item = listed.replace(extra=extra, meta_source=sources,
                              **{k: v if v is not None else getattr(listed, k) for k, v in found.items()})
        play_url = data.get("play_url")
        if play_url in ("", None) and extra.get("backup_url"):
            # No primary address but a backup one: the backup is the address.
            play_url = extra.pop("backup_url")
            item = item.replace(extra=extra)
        if play_url in ("", None):
            # Listed but not served: paid, or blocked where this worker runs. Not worth retrying.
            return item.replace(status=UNAVAILABLE,
                                reason=f"no play_url: paid or region-blocked (privilege {privilege!r})")
        if not isinstance(play_url, str) or not play_url.startswith(("http://", "https://")):
            return item.replace(status=FAILED, reason="play_url is not an http(s) URL")
        # When the signed address was issued: the downloader can tell a stale link before trying it.
        return item.replace(url=play_url, status=OK, reason=None, identity=identity,
                            extra={**extra, "issued_at": ctx.clock()})

    async def reresolve(self, item: AudioItem, ctx: ResolveContext) -> AudioItem | None:
        """A fresh signed address for an item whose link expired; None if the API will not give one now."""
        if item.resolver != self.name or not item.source_id or not _HASH.fullmatch(item.source_id):
            return None
        album_id = item.extra.get("album_id")
        song = ListedSong(hash=item.source_id, album_id=str(album_id) if album_id else "",
                          title=item.title, artist=item.artist)
        fresh = await self.resolve_song(song, item.page, ctx)
        if fresh.status != OK:
            log.info("kugou: re-resolving %s failed: %s", item.source_id, fresh.reason)
            return None
        return item.replace(url=fresh.url, identity=fresh.identity, status=OK, reason=None,
                            extra={**item.extra, **fresh.extra})
