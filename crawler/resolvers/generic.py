"""The generic resolver, the source paper's "sniffer": audio referenced anywhere in a page, or a response
that is audio itself.

Where it looks: audio extensions in links, audio/source/embed/object/param and data-* attributes; URLs
in inline scripts and JSON blocks; the response's Content-Type; the first bytes of the body; playlists.
What it must not do: turn images, video, or prose that mentions ".mp3" into items. So text nodes are never
read, a script string counts only when the whole string is a URL (or an absolute URL inside markup), and
containers shared with video (MP4, ASF, Ogg) are checked for a video track.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urldefrag

from selectolax.lexbor import LexborHTMLParser, LexborNode

from crawler.items import LINK_META_FIELDS, AudioItem, LinkMeta
from crawler.resolvers import feeds, jsdata, pagemeta
from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    parse_section,
)
from crawler.resolvers.pagemeta import Meta
from crawler.web import media
from crawler.web.alternation import trie
from crawler.web.html import css
from crawler.web.links import audio_candidate_links, document_base, stream_candidate, stream_path_hint
from crawler.web.media import read_tags
from crawler.web.memo import Memo
from crawler.web.page import FetchedPage
from crawler.web.urls import NormalizeOptions, normalize_many, resolve_link

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenericConfig:
    max_items: int = 1000          # per page: a generated page must not flood the catalogue
    scan_scripts: bool = True
    sniff_bytes: bool = True
    referrer_context: bool = True  # audio found by its first bytes takes title/artist from the linking page
    max_xml_bytes: int = 16 * 1024 * 1024   # a feed or sitemap, after gzip decompression

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ResolverConfigError("generic.max_items: must be at least 1")
        if self.max_xml_bytes < 1024:
            raise ResolverConfigError("generic.max_xml_bytes: must be at least 1024")


# Attributes whose value is metadata, never a URL, even when it reads "song.mp3".
_META_DATA_ATTRS = frozenset({"data-title", "data-artist", "data-album", "data-description", "data-name"})
# data-* names that announce a URL, so a bare file name ("a.mp3") in them counts.
_URL_ATTR_WORDS = ("src", "url", "href", "file", "mp3", "audio", "sound", "song", "track", "stream", "path")
_PARAM_NAMES = frozenset({"src", "url", "filename", "file", "movie", "sound", "song", "mp3", "audio"})
_BARE_FILE = re.compile(r"^[\w\-.%~+()\[\]]+$")
_ABSOLUTE_IN_TEXT = re.compile(r"""(?:https?:)?//[^\s"'<>\\()]+""", re.IGNORECASE)
_JSON_TYPES = ("application/json", "application/ld+json")
_OG_AUDIO = frozenset({"og:audio", "og:audio:url", "og:audio:secure_url"})
_MAX_URL = 2048
# Playlist entries that are never songs: stream segments, video, pictures.
_NOT_PLAYLIST_SONGS = frozenset({"ts", "m4s", "mp4", "m4v", "webm", "mkv", "avi", "jpg", "jpeg", "png", "gif"})


def _url_like(value: str, *, bare_ok: bool) -> bool:
    """Could this whole string be a URL reference (not prose)?"""
    # value.split() != [value]: some character is whitespace (str.split and str.isspace agree on which), found
    # in C rather than by a generator a character.
    if not value or len(value) > _MAX_URL or value.split(None, 1) != [value]:
        return False
    lower = value.lower()
    if lower.startswith(("http://", "https://", "//", "/", "./", "../")):
        return True
    if ":" in value.split("/", 1)[0]:
        return False  # another scheme (data:, blob:, javascript:) or a "key:value" string
    if "/" in value:
        return True
    path = value.split("?", 1)[0].split("#", 1)[0]
    return bare_ok and bool(_BARE_FILE.match(path))


def _audio_string(value: str, bare_ok: bool = True) -> bool:
    value = value.strip()
    return _url_like(value, bare_ok=bare_ok) and (media.is_audio_url(value) or media.is_playlist_url(value))


def _defragged(url: str) -> str:
    """urldefrag(url).url, which returns a URL without "#" as it is: only one with a fragment is parsed."""
    return urldefrag(url).url if "#" in url else url


def _found(meta: Meta | pagemeta.Found, source: str) -> pagemeta.Found:
    if isinstance(meta, pagemeta.Found):
        return meta
    return pagemeta.Found().add(meta, "data" if source.startswith("data-") else source)


class _Collector:
    """Items and playlist links for one page, one item per distinct audio URL, and what the page says about its
    links that may lead to audio without saying so (playlists, streams named like pages)."""

    def __init__(self, page_url: str, base: str, max_items: int, page: pagemeta.PageContext | None = None):
        self.page_url = page_url
        self.base = base
        self.max_items = max_items
        # url -> (local metadata, where found, the a/area element, whose text is read only if needed)
        self.items: dict[str, tuple[pagemeta.Found, str, LexborNode | None]] = {}
        self.links: list[str] = []
        # url -> (local metadata, the a/area element): links whose own fetch may find audio, at most max_items
        self.hinted: dict[str, tuple[pagemeta.Found, LexborNode | None]] = {}
        self.extra: dict[str, Any] = {}
        self.page = page

    def add(self, raw: str, meta: Meta | pagemeta.Found, found_in: str, force_audio: bool = False,
            link: LexborNode | None = None) -> None:
        url = resolve_link(self.base, raw.strip())
        if url is None:
            return
        url = _defragged(url)
        if media.is_playlist_url(url):
            if url not in self.links:
                self.links.append(url)
                self.hint(url, _found(meta, found_in), link)
            return
        if not (force_audio or media.is_audio_url(url)):
            return
        found = _found(meta, found_in)
        if url in self.items:
            known, where, known_link = self.items[url]
            self.items[url] = (known.copy().fill(found), where, known_link or link)
        elif len(self.items) < self.max_items:
            self.items[url] = (found, found_in, link)

    def hint(self, url: str, found: pagemeta.Found, link: LexborNode | None) -> None:
        """A link that may lead to audio: what the page says about it goes with it (Resolution.link_meta)."""
        if url not in self.hinted and len(self.hinted) < self.max_items:
            self.hinted[url] = (found, link)

    def result(self) -> Resolution:
        hinted = {u: v for u, v in self.hinted.items() if u not in self.items}
        # A page about one song: one audio item, or one link that leads to its audio.
        one_song = len(self.items) + len(hinted) == 1
        items = []
        for url, (found, found_in, link) in self.items.items():
            full = self._meta(found, link, one_song)
            items.append(AudioItem(url=url, page=self.page_url, resolver=GenericResolver.name,
                                   meta_source=full.sources, extra={"found_in": found_in, **self.extra},
                                   **full.meta))
        link_meta = {}
        for url, (found, link) in hinted.items():
            named = _link_meta(self._meta(found, link, one_song))
            if named is not None:
                link_meta[url] = named
        return Resolution(items=items, links=list(self.links), link_meta=link_meta)

    def _meta(self, found: pagemeta.Found, link: LexborNode | None, one_song: bool) -> pagemeta.Found:
        return found.copy() if self.page is None else self.page.item_meta(found, link, one_song=one_song)


def _link_meta(found: pagemeta.Found) -> LinkMeta | None:
    """The names a page gives a link, as they travel with it (None: it names nothing)."""
    names = {k: found.meta[k] for k in LINK_META_FIELDS if isinstance(found.meta.get(k), str)}
    if not names:
        return None
    return LinkMeta(meta_source={k: found.sources.get(k, "page") for k in names}, **names)


def _found_of(named: LinkMeta) -> pagemeta.Found:
    """A link's names, as its page gave them, with the layer each came from."""
    out = pagemeta.Found()
    for k in LINK_META_FIELDS:
        value = getattr(named, k)
        if value:
            out.meta[k] = value
            out.sources[k] = named.meta_source.get(k, "page")
    return out


class GenericResolver(Resolver):
    name = "generic"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings = parse_section(GenericConfig, self.name, config)
        # referrer -> what it says about each of its links: the links of one page usually come in a burst.
        self._referrers: OrderedDict[str, asyncio.Future[dict[str, pagemeta.Found]]] = OrderedDict()

    def claims(self, url: str) -> bool:
        return url.lower().startswith(("http://", "https://"))

    def audio_link(self, url: str) -> bool:
        return media.is_audio_url(url)

    async def resolve(self, url: str, page: FetchedPage | None, ctx: ResolveContext) -> Resolution:
        if page is None or page.status >= 400:
            return Resolution()
        if not page.is_html() and _xml_work_is_big(page):
            # A big (or compressed) feed or sitemap is inflated and parsed in a thread: the event loop keeps
            # serving the other tasks.
            return await asyncio.to_thread(self.resolve_page, page)
        resolution = self.resolve_page(page)
        if (self.settings.referrer_context and len(resolution.items) == 1
                and resolution.items[0].extra.get("found_in") == "response"
                and not (resolution.items[0].title and resolution.items[0].artist)):
            # Audio behind a link that did not say it was audio, and whose file does not name it: it takes what
            # the linking page said about the link (its row, its text, the page's heading), which came with the
            # link. A link reported without it (a page that did not see it as a way to audio) has that page
            # read again, once per worker for all its links.
            found: pagemeta.Found | None = None
            if page.link_meta is not None:
                found = _found_of(page.link_meta)
            elif getattr(ctx, "fetch_page", None) is not None and page.referrer:
                found = await self._referrer_meta(page.referrer, page.url, ctx)
            if found:
                item = resolution.items[0]
                tags = {k: getattr(item, k) for k in item.meta_source}
                fresh = item.replace(meta_source={}, **dict.fromkeys(tags))
                resolution.items[0] = fresh.with_meta(found.meta, found.sources).with_file_tags(tags)
        return resolution

    async def _referrer_meta(self, referrer: str, target: str, ctx: ResolveContext) -> pagemeta.Found | None:
        known = self._referrers.get(referrer)
        if known is not None:
            self._referrers.move_to_end(referrer)
            return (await asyncio.shield(known)).get(target)
        # The first task to need this page fetches it itself; the others (its other links, in the same
        # burst) wait for that one fetch. No task is started on the side.
        known = asyncio.get_running_loop().create_future()
        self._referrers[referrer] = known
        while len(self._referrers) > _REFERRER_CACHE:
            self._referrers.popitem(last=False)
        try:
            links = await self._read_referrer(referrer, ctx)
        except BaseException:   # cancelled: the waiters go without, and the next asker fetches again
            if self._referrers.get(referrer) is known:
                del self._referrers[referrer]
            known.set_result({})
            raise
        known.set_result(links)
        return links.get(target)

    async def _read_referrer(self, referrer: str, ctx: ResolveContext) -> dict[str, pagemeta.Found]:
        assert ctx.fetch_page is not None
        try:
            page = await ctx.fetch_page(referrer)
        except Exception as exc:   # the referrer is a nicety: its failure must not cost the item
            log.debug("referrer %s not fetched: %s", referrer, exc)
            return {}
        return _link_metadata(page) if page is not None and page.status < 400 else {}

    def resolve_page(self, page: FetchedPage) -> Resolution:
        """The synchronous core: no I/O is needed once the page is fetched."""
        ct = page.content_type
        if ct in media.PLAYLIST_TYPES or (not page.is_html() and (media.is_playlist_url(page.final_url)
                                                                  or media.is_playlist_url(page.url))):
            return self._playlist(page)
        if media.is_audio_type(ct):
            return Resolution(items=[self._audio_response(page, media.sniff_audio(page.body) or ct)])
        if not page.is_html():
            xml = self._xml_document(page)
            if xml is not None:
                return self._xml(page, *xml)
        if page.is_html():
            tree = page.tree()
            return self._html(page, tree) if tree is not None else Resolution()
        if self.settings.sniff_bytes:
            fmt = media.sniff_audio(page.body)
            if fmt:
                return Resolution(items=[self._audio_response(page, fmt)])
        if media.looks_like_playlist(page.text()[:256] if ct.startswith("text/") or not ct else ""):
            return self._playlist(page)
        if ct in _JSON_TYPES or ct.endswith("+json"):
            return self._json_document(page)
        return Resolution()

    def _audio_response(self, page: FetchedPage, fmt: str) -> AudioItem:
        meta = pagemeta.normalise(_tags_meta(page.body))
        extra: dict[str, Any] = {"found_in": "response", "format": fmt}
        if page.final_url != page.url:
            extra["final_url"] = page.final_url
        return AudioItem(url=page.url, page=page.referrer or page.url, resolver=self.name, extra=extra,
                         meta_source=dict.fromkeys(meta, "file"), **meta)

    def _xml_document(self, page: FetchedPage) -> tuple[str, bytes] | None:
        """(kind, body) when the page is a feed or sitemap (XML or text), gzip-compressed or not."""
        body, content_type = page.body, page.content_type
        if feeds.is_gzip(page.content_type, page.final_url, body):
            try:
                body = feeds.gunzip(body, self.settings.max_xml_bytes)
            except feeds.XmlDocumentError as exc:
                log.info("%s: %s", page.url, exc)
                return None
            content_type = ""
        kind = (feeds.kind_of(content_type, body)
                or feeds.text_sitemap_kind(content_type, page.final_url, page.referrer, body))
        return (kind, body) if kind else None

    def _xml(self, page: FetchedPage, kind: str, body: bytes) -> Resolution:
        try:
            doc = feeds.parse(kind, body, page.final_url)
        except feeds.XmlDocumentError as exc:
            log.info("%s: %s %s", page.url, kind, exc)
            return Resolution()
        items = []
        seen: set[str] = set()
        for entry in doc.entries[:self.settings.max_items]:
            if entry.url in seen:
                continue
            seen.add(entry.url)
            extra: dict[str, Any] = {"found_in": kind}
            if entry.page:
                extra["episode_page"] = entry.page
            items.append(AudioItem(url=entry.url, page=page.url, resolver=self.name, extra=extra,
                                   meta_source=dict.fromkeys(entry.meta, "feed"), **entry.meta))
        return Resolution(items=items, links=doc.links, lastmod=doc.lastmod)

    def _playlist(self, page: FetchedPage) -> Resolution:
        text = page.text()
        if media.is_hls(text):
            # One stream, not a list of songs: the playlist is the item, made one file (or, live, recorded for
            # a window) by the worker's HLS downloader, which picks the audio rendition of a master playlist.
            return Resolution(items=[AudioItem(url=page.url, page=page.referrer or page.url, resolver=self.name,
                                               extra={"found_in": "response", "format": "hls"})])
        kind = media.looks_like_playlist(text)
        if kind is None:
            kind = "pls" if media.url_extension(page.final_url) == "pls" or "scpls" in page.content_type else "m3u"
        entries = media.parse_pls(text) if kind == "pls" else media.parse_m3u(text)
        # The entries were published on the page that links the playlist, when the crawl knows it.
        out = _Collector(page.referrer or page.url, page.final_url, self.settings.max_items)
        out.extra["playlist"] = page.url
        # A playlist of one song is that song: what the linking page said about the playlist names it too.
        carried = _found_of(page.link_meta) if page.link_meta is not None and len(entries) == 1 else None
        for entry in entries:
            if any(c in entry.target for c in '<>"'):
                continue  # markup, not an entry: an error page served under a playlist's name
            meta = pagemeta.normalise({"title": entry.title, "artist": entry.artist, "duration": entry.duration})
            found = pagemeta.Found().add(meta, "playlist")
            if carried is not None:
                found.fill(carried)
            absolute = resolve_link(page.final_url, entry.target)
            if absolute is None:
                continue
            if media.is_audio_url(absolute) or media.is_playlist_url(absolute):
                out.add(absolute, found, "playlist")
            elif media.url_extension(absolute) not in _NOT_PLAYLIST_SONGS and absolute not in out.links:
                # Not named as audio (a stream, a download script): a fetch of its first bytes decides, and
                # the entry's names go with the link.
                out.links.append(absolute)
                out.hint(absolute, found, None)
        return out.result()

    def _json_document(self, page: FetchedPage) -> Resolution:
        out = _Collector(page.url, page.final_url, self.settings.max_items)
        _collect_json(out, pagemeta.load_json_block(page.text()), "json")
        return out.result()

    def _html(self, page: FetchedPage, tree: LexborHTMLParser) -> Resolution:
        lower = page.body.lower()
        holds = _page_may_hold_audio(lower)
        # Streams named like pages (/stream/12): their fetch finds the audio, with the names given here. The
        # element walk of a page that may hold audio looks at every link already; other pages look for them alone.
        streams = not holds and _may_link_streams(lower)
        if not holds and not streams:
            return Resolution()   # most pages of a site are navigation: skip the element walk entirely
        base = document_base(tree, page.final_url, page.text())
        context = pagemeta.PageContext(tree, page.body, lower)
        out = _Collector(page.url, base, self.settings.max_items, context)
        if holds:
            # The walk meets every <script> and <meta> the page's metadata reads: they are kept as it goes.
            json_ld: list[LexborNode] = []
            metas: list[LexborNode] = []
            last = -1
            for node in _candidates(tree, page.body):
                # lexbor may list an element once for each selector of the list it matches, one after the other
                # (a meta tag with content and a property); looking at it again finds nothing new.
                at = node.mem_id
                if at == last:
                    continue
                last = at
                tag = node.tag
                if tag is None or not tag[0].isalpha():
                    continue
                attrs = node.attributes
                if tag == "script":
                    if pagemeta.is_json_ld(attrs):
                        json_ld.append(node)
                    self._script(out, node, attrs)
                else:
                    if tag == "meta" and pagemeta.is_meta_tag(attrs):
                        metas.append(node)
                    _element(out, node, tag, attrs)
            context.seen(json_ld, metas)
        else:
            for url, node in audio_candidate_links(tree, base, _MAX_REFERRER_LINKS):
                _stream(out, url, node)
        return out.result()

    def _script(self, out: _Collector, node: LexborNode, attrs: Mapping[str, str | None]) -> None:
        if not self.settings.scan_scripts:
            return
        kind = (attrs.get("type") or "").strip().lower()
        text = node.text(deep=True) or ""
        if not _mentions_audio(text):
            return
        if kind in _JSON_TYPES or kind.endswith(("+json", "/json")):
            _collect_json(out, pagemeta.load_json_block(text), "json")
            return
        if kind and "javascript" not in kind and "ecmascript" not in kind and kind != "module":
            return  # templates and other data: not read as code
        for s in jsdata.strings_with_context(text, _script_candidate):
            meta = pagemeta.json_object_meta(s.keys)
            if _audio_string(s.value):
                out.add(s.value, meta, "script")
            else:
                for url in _absolute_urls_in(s.value):
                    out.add(url, {}, "script")


_NAMED_EXTENSIONS = media.AUDIO_EXTENSIONS | media.PLAYLIST_EXTENSIONS
_DOTTED_EXTENSIONS = tuple(f".{ext}" for ext in sorted(_NAMED_EXTENSIONS))


# The elements _element and _script read, and the <meta> tags of the page's metadata (pagemeta.META_TAGS: one
# without content names no audio, so _element finds nothing in it); plus, per page, every element with a data-*
# attribute it uses.
_CANDIDATES = ("script, a[href], area[href], audio, source, embed, object, param, link[href], meta[content], "
               + pagemeta.META_TAGS)
# A data-* attribute's name, found from the literal "data-" (a regex that begins with it skips ahead to each
# one, three times as fast as one that begins with the character before it, which is checked after).
_DATA_ATTRIBUTE = re.compile(rb"data-([A-Za-z0-9_:.-]+)\s*=")
_BEFORE_ATTRIBUTE = frozenset(b" \t\n\r\f\v\"'/")
_CSS_NAME = re.compile(r"[a-z0-9_-]+")
_META_DATA_NAMES = frozenset(a[5:] for a in _META_DATA_ATTRS)     # their names after "data-"


def _candidates(tree: LexborHTMLParser, body: bytes) -> list[LexborNode]:
    """The elements that can name audio, in document order, found by lexbor rather than a walk in Python."""
    names = {m.group(1).decode("ascii").lower() for m in _DATA_ATTRIBUTE.finditer(body)
             if m.start() and body[m.start() - 1] in _BEFORE_ATTRIBUTE}
    names -= _META_DATA_NAMES
    if not all(_CSS_NAME.fullmatch(n) for n in names):
        # A name a selector cannot spell: walk every element.
        return [n for n in tree.root.traverse()] if tree.root is not None else []
    selector = _CANDIDATES + "".join(f", [data-{n}]" for n in sorted(names))
    return css(tree, selector)


# Every way an element can name audio without an audio or playlist extension in the page says one of these.
_FORCING_MARKERS = (b"<audio", b"audio/", b"og:audio")
_AUDIO_WORD = b"audio"      # in every forcing marker: one scan rules them all out on most pages
assert all(_AUDIO_WORD in m for m in _FORCING_MARKERS)
# Any ".<extension>" of audio or a playlist, as a substring: one scan for the dots, not one scan an extension (the
# extensions as a trie: crawler/web/alternation.py).
_EXTENSION_WORDS: list[str] = sorted(e[1:] for e in _DOTTED_EXTENSIONS)
_DOTTED_EXTENSION_B = re.compile(rb"\." + trie(_EXTENSION_WORDS).encode())


def _page_may_hold_audio(lower: bytes) -> bool:
    """A cheap gate before the element walk: False only when no element of the page can yield an item.
    lower: the page's body in lower case. (Each scan of the body costs about half a microsecond a KB: the
    extension first, which a page with audio names early on, and the forcing markers only where "audio" occurs.)"""
    return _DOTTED_EXTENSION_B.search(lower) is not None or (
        _AUDIO_WORD in lower and any(m in lower for m in _FORCING_MARKERS))


# What links.stream_candidate looks for (a word of a stream's path, a song's attribute), as bytes: a page without
# any links no stream. One substring scan each (far cheaper than one regex of them all), the song's attributes
# only where "data-" occurs.
_STREAM_MARKERS = (b"stream", b"listen", b"download", b"audio", b"/play", b"/mp3", b"/media/")
_DATA_MARKERS = (b"data-title", b"data-artist", b"data-album", b"data-duration")


def _may_link_streams(lower: bytes) -> bool:
    return any(m in lower for m in _STREAM_MARKERS) or (
        b"data-" in lower and any(m in lower for m in _DATA_MARKERS))


_DOTTED_EXTENSION_S = re.compile(r"\." + trie(_EXTENSION_WORDS))


def _mentions_audio(text: str) -> bool:
    """A cheap gate before any parsing: does any audio or playlist extension occur at all? (One regex scan
    for the dots, not one substring scan an extension.)"""
    return _DOTTED_EXTENSION_S.search(text.lower()) is not None


def _absolute_urls_in(text: str) -> list[str]:
    """Absolute and protocol-relative audio URLs inside a longer string (markup built in a script)."""
    return [u for u in _ABSOLUTE_IN_TEXT.findall(text) if _audio_string(u)]


def _script_candidate(value: str) -> bool:
    return _audio_string(value) or (len(value) < 100_000 and bool(_absolute_urls_in(value)))


def _collect_json(out: _Collector, value: Any, found_in: str) -> None:
    """Audio URLs anywhere in a JSON value, with the metadata of the objects that hold them.

    A URL takes its fields from the object holding it, then from objects holding that one directly
    (an AudioObject inside its MusicRecording), but not across a list: the list's owner describes the
    list, not each song in it.
    """
    stack: list[tuple[Any, Meta, int]] = [(value, {}, 0)]
    while stack:
        current, inherited, depth = stack.pop()
        if depth > 64:
            continue
        if isinstance(current, Mapping):
            meta = pagemeta.fill(pagemeta.json_object_meta(current), inherited)
            children = list(current.values())
            for child in reversed(children):
                if isinstance(child, str):
                    if _audio_string(child):
                        out.add(child, meta, found_in)
                    else:
                        for url in _absolute_urls_in(child):
                            out.add(url, {}, found_in)
                else:
                    stack.append((child, meta if isinstance(child, Mapping) else {}, depth + 1))
        elif isinstance(current, list):
            for child in reversed(current):
                if isinstance(child, str) and _audio_string(child):
                    out.add(child, inherited, found_in)
                elif not isinstance(child, str):
                    stack.append((child, {}, depth + 1))


def _type_is_audio(attrs: Mapping[str, str | None]) -> bool:
    given = attrs.get("type")
    if not given:
        return False      # most elements have no type
    kind = media.media_type(given)
    return bool(kind) and media.is_audio_type(kind)


def _inside(node: LexborNode, tag: str) -> bool:
    parent = node.parent
    return parent is not None and parent.tag == tag


def _element(out: _Collector, node: LexborNode, tag: str, attrs: Mapping[str, str | None]) -> None:
    if (tag == "a" or tag == "area") and len(attrs) == 1:
        # A link with its href alone, the site's navigation on every page: settled by the href, remembered.
        href = attrs.get("href")
        if href is not None:
            inert = _INERT_HREFS.get(href)
            if inert is None:
                inert = _INERT_HREFS.keep(href, _inert_href(href))
            if inert:
                return
    if tag == "meta" and not _has_data(attrs):
        # A page's metadata tags (og:title, charset ...): only an audio property names audio.
        prop = (attrs.get("property") or attrs.get("itemprop") or "").lower()
        if prop not in _OG_AUDIO and prop != "contenturl":
            return
    if (tag == "a" or tag == "area") and "type" not in attrs and not _has_data(attrs):
        # A plain link, most of a page's elements: what the general path below does with one, in fewer steps.
        # It names audio or a playlist by its extension, or it may be a stream named like a page.
        href = attrs.get("href")
        if not href:
            return
        if media.url_extension(href.strip()) not in _NAMED_EXTENSIONS:
            if (url := stream_candidate(out.base, node, attrs)) is not None:
                _stream(out, url, node)
            return
    if tag == "video" or (tag == "source" and _inside(node, "video") and not _type_is_audio(attrs)):
        return
    # (reference, the element itself says it is audio, where it was found)
    refs: list[tuple[str, bool, str]] = []
    if tag in ("a", "area"):
        if href := attrs.get("href"):
            refs.append((href, _type_is_audio(attrs), tag))
    elif tag in ("audio", "source"):
        if src := attrs.get("src"):
            refs.append((src, tag == "audio" or _inside(node, "audio") or _type_is_audio(attrs), tag))
    elif tag == "embed":
        if src := attrs.get("src"):
            refs.append((src, _type_is_audio(attrs), tag))
        refs.extend((v, False, "flashvars") for v in _flashvars(attrs.get("flashvars")))
    elif tag == "object":
        if data := attrs.get("data"):
            refs.append((data, _type_is_audio(attrs), tag))
    elif tag == "param":
        name = (attrs.get("name") or "").lower()
        value = attrs.get("value") or ""
        if name == "flashvars":
            refs.extend((v, False, "flashvars") for v in _flashvars(value))
        elif name in _PARAM_NAMES and value:
            refs.append((value, False, tag))
    elif tag == "link":
        if (href := attrs.get("href")) and (_type_is_audio(attrs) or _audio_string(href)):
            refs.append((href, _type_is_audio(attrs), tag))
    elif tag == "meta":
        prop = (attrs.get("property") or attrs.get("itemprop") or "").lower()
        content = attrs.get("content") or ""
        if prop in _OG_AUDIO and content:
            refs.append((content, True, prop))
        elif prop == "contenturl" and content:
            refs.append((content, False, prop))
    for name, attr in attrs.items():
        if name.startswith("data-") and attr and name not in _META_DATA_ATTRS:
            refs.extend(_data_attribute_refs(name, attr, node, out))
    # Most elements are plain links: settle them on the raw string before any joining or metadata work.
    refs = [r for r in refs if r[1] or media.url_extension(r[0].strip()) in _NAMED_EXTENSIONS]
    if not refs:
        if tag in ("a", "area") and (url := stream_candidate(out.base, node, attrs)) is not None:
            _stream(out, url, node)
        return
    meta = pagemeta.element_found(node, out.page)
    if tag == "param" and node.parent is not None:
        meta.fill(pagemeta.element_found(node.parent, out.page))
    link = node if tag in ("a", "area") else None
    for ref, forced, where in refs:
        if forced or _url_like(ref.strip(), bare_ok=True) or tag in ("a", "area", "audio", "source", "embed"):
            out.add(ref, meta, where, force_audio=forced, link=link)


def _inert_href(href: str) -> bool:
    """Whether an a/area element whose one attribute is this href yields nothing here: it names no audio or
    playlist by its extension, and nothing in it says stream (stream_candidate's first test, with no song's
    attributes)."""
    return not href or (media.url_extension(href.strip()) not in _NAMED_EXTENSIONS and not stream_path_hint(href))


_INERT_HREFS: Memo[str, bool] = Memo(10_000)


def _has_data(attrs: Mapping[str, str | None]) -> bool:
    for name in attrs:
        if name.startswith("data-"):
            return True
    return False


def _stream(out: _Collector, url: str, node: LexborNode) -> None:
    """A link that may be a stream named like a page: what the page says about it goes with it."""
    url = _defragged(url)
    if not media.is_audio_url(url) and url not in out.hinted:
        out.hint(url, pagemeta.element_found(node, out.page), node)


def _data_attribute_refs(name: str, value: str, node: LexborNode,
                         out: _Collector) -> list[tuple[str, bool, str]]:
    value = value.strip()
    if value[:1] in ("{", "[") and _mentions_audio(value):
        # data-song='{"url": "a.mp3", "title": "..."}': the object's keys describe the URL.
        meta = pagemeta.element_found(node, out.page)
        before = dict(out.items)
        _collect_json(out, pagemeta.load_json_block(value), name)
        for url in out.items.keys() - before.keys():
            found_meta, where, link = out.items[url]
            out.items[url] = (found_meta.copy().fill(meta), where, link)
        return []
    bare_ok = any(word in name for word in _URL_ATTR_WORDS)
    if _audio_string(value, bare_ok=bare_ok):
        return [(value, False, name)]
    return []


def _flashvars(value: str | None) -> list[str]:
    if not value:
        return []
    try:
        pairs = parse_qsl(value, keep_blank_values=False)
    except ValueError:
        return []
    return [v for _, v in pairs if _audio_string(v)]


def _xml_work_is_big(page: FetchedPage) -> bool:
    """A cheap look (nothing inflated, nothing parsed): is this a compressed document, or a big feed or
    sitemap? A small gzip body may inflate to max_xml_bytes."""
    if feeds.is_gzip(page.content_type, page.final_url, page.body):
        return True
    return len(page.body) > _XML_INLINE_BYTES and (
        feeds.kind_of(page.content_type, page.body) is not None
        or feeds.text_sitemap_kind(page.content_type, page.final_url, page.referrer, page.body) is not None)


# Feeds and sitemaps larger than this are parsed off the event loop.
_XML_INLINE_BYTES = 256 * 1024
# Referring pages remembered per worker, with what they say about their links.
_REFERRER_CACHE = 64
_MAX_REFERRER_LINKS = 5000


def _link_metadata(page: FetchedPage) -> dict[str, pagemeta.Found]:
    """For each a/area link of a page, keyed by its normalised URL: every layer of metadata the page offers."""
    tree = page.tree()
    if tree is None:
        return {}
    base = document_base(tree, page.final_url)
    nodes = css(tree, "a[href], area[href]")[:_MAX_REFERRER_LINKS]
    joined = [resolve_link(base, n.attributes.get("href") or "") for n in nodes]
    keys = normalize_many([u for u in joined if u is not None], NormalizeOptions())
    context = pagemeta.PageContext(tree, page.body)
    out: dict[str, pagemeta.Found] = {}
    it = iter(keys)
    for node, url in zip(nodes, joined):
        if url is None:
            continue
        key = next(it)
        if key and key not in out:
            out[key] = context.item_meta(pagemeta.element_found(node, context), node)
    return out


def _tags_meta(body: bytes) -> Meta:
    return dict(read_tags(body))
