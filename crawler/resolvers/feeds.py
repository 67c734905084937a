"""RSS 2.0 / Atom feeds and XML sitemaps: audio items and links from XML documents a crawl meets.

Feeds (podcasts) are the largest open source of audio on the web: each <enclosure> (RSS) or
<link rel="enclosure"> (Atom), or an item link that names an audio file, is an item, with the episode's title,
the show as artist and album, its description, publish date and duration. Sitemaps (https://www.sitemaps.org/
protocol.html) list a site's pages, with <lastmod>; a sitemap index lists sitemaps, often gzip-compressed.

Everything here is an attacker's document: it is parsed with defusedxml, which refuses entity declarations
(no "billion laughs") and external entities and DTDs (no XXE), a gzip body is decompressed only up to a bound,
and the counts of items and links are capped.

It is read incrementally (``iterparse``), never as a whole tree: each record (a sitemap's <url> or
<sitemap>, a feed's <item> or <entry>) is taken as it ends and then dropped, and every other element is
dropped as it ends once the show's title and author are noted. So memory holds the open elements and one
record, and the document is read under caps: elements nested ``MAX_XML_DEPTH`` deep, ``MAX_XML_ELEMENTS``
elements in all, ``MAX_RECORD_ELEMENTS`` in one record, ``MAX_XML_ATTRIBUTES`` on one element,
``MAX_PARSE_SECONDS`` of parsing. A document that passes a cap (or breaks off, or turns malformed part way)
yields the records read before that point, with one log line; one that yields nothing before it is an
XmlDocumentError. The caller parses big or compressed documents in a thread (crawler/resolvers/generic.py).
"""

from __future__ import annotations

import html
import io
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import iterparse

from crawler.resolvers import pagemeta
from crawler.web import media
from crawler.web.urls import resolve_link

log = logging.getLogger(__name__)

RSS, ATOM, SITEMAP, SITEMAP_INDEX = "rss", "atom", "sitemap", "sitemapindex"
# The sitemaps protocol's own limit per file.
MAX_SITEMAP_URLS = 50_000
MAX_FEED_ITEMS = 5000
# Real feeds and sitemaps nest under 10 deep (XHTML content in Atom a little more); deep nesting is how a
# small document is made to cost a large tree.
MAX_XML_DEPTH = 64
# A full sitemap (50,000 <url> with their children) has about 300,000 elements, a long podcast feed fewer.
MAX_XML_ELEMENTS = 1_000_000
# Elements one record may hold: it is kept whole until it ends.
MAX_RECORD_ELEMENTS = 10_000
# Attributes of one element: the parser builds them all before anyone can look (16 MiB of them cost 400 MiB and
# half a minute), so the document is cut before the first stretch between two '<' that could hold more.
MAX_XML_ATTRIBUTES = 10_000
MAX_PARSE_SECONDS = 10.0
_TIME_CHECK_EVERY = 4096       # elements between looks at the clock
# An attribute takes at least 4 bytes (` a=""` less its quotes' content): a shorter stretch cannot hold more
# than MAX_XML_ATTRIBUTES. '<' cannot occur inside an attribute value, so a tag never spans two stretches.
_LONG_TAG = re.compile(rb"<[^<]{%d,}" % (4 * MAX_XML_ATTRIBUTES))
_XML_TYPES = frozenset({"application/xml", "text/xml", "application/rss+xml", "application/atom+xml",
                        "application/rdf+xml", "application/x-rss+xml"})
# Types a server sends for a document it does not know (a .xml or .xml.gz as plain bytes).
_UNTYPED = frozenset({"", "application/octet-stream", "text/plain", "binary/octet-stream"})
_GZIP_TYPES = frozenset({"application/gzip", "application/x-gzip", "application/x-gunzip", "gzip/document"})
_ROOT = re.compile(rb"<(?:[\w-]+:)?(rss|feed|urlset|sitemapindex|RDF)[\s>/]")
_TAGS = re.compile(r"<[^>]{0,2000}>")


class XmlDocumentError(ValueError):
    """The document is not a feed or sitemap we can read: malformed, hostile, or too big."""


@dataclass
class FeedEntry:
    url: str
    meta: dict[str, Any]
    page: str | None = None     # the episode's own page, when the feed names one


@dataclass
class XmlResult:
    kind: str
    entries: list[FeedEntry] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    lastmod: dict[str, float] = field(default_factory=dict)   # link -> epoch seconds, for sitemaps
    cut: str | None = None      # why the document was read only in part (a cap, a break), else None


def gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body decompressed to at most ``limit`` bytes; XmlDocumentError past it (a bomb or just too big)."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(body, limit)
    except zlib.error as exc:
        raise XmlDocumentError(f"bad gzip data: {exc}") from exc
    if d.unconsumed_tail:
        raise XmlDocumentError(f"decompresses to more than {limit} bytes")
    return out


def is_gzip(content_type: str, url: str, body: bytes) -> bool:
    return body[:2] == b"\x1f\x8b" and (content_type in _GZIP_TYPES or content_type in _UNTYPED
                                        or url.split("?", 1)[0].lower().endswith(".gz"))


def kind_of(content_type: str, body: bytes) -> str | None:
    """rss / atom / sitemap / sitemapindex when the body is one, judged by its root element."""
    if content_type not in _XML_TYPES and content_type not in _UNTYPED:
        return None
    m = _ROOT.search(body[:4096])
    if m is None:
        return None
    return {b"rss": RSS, b"RDF": RSS, b"feed": ATOM, b"urlset": SITEMAP, b"sitemapindex": SITEMAP_INDEX}[m.group(1)]


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _child(el: Element, name: str) -> Element | None:
    for c in el:
        if _local(c.tag) == name:
            return c
    return None


def _text(el: Element | None) -> str | None:
    if el is None:
        return None
    return pagemeta.clean_text("".join(el.itertext()))


def _child_text(el: Element, *names: str) -> str | None:
    for name in names:
        value = _text(_child(el, name))
        if value:
            return value
    return None


def _plain(value: str | None) -> str | None:
    """Feed descriptions are HTML: the words, not the markup."""
    if not value:
        return None
    return pagemeta.clean_text(html.unescape(_TAGS.sub(" ", value)))


def parse_date(value: str | None) -> datetime | None:
    """RFC 822 (RSS pubDate) or ISO 8601 (Atom, sitemaps' W3C datetime) as an aware datetime."""
    if not value:
        return None
    value = value.strip()[:64]
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        try:
            dt = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


class _Cut(Exception):
    """The document is read no further; what was read before stands."""


class _Reader:
    """The records of one document, one at a time, each dropped once its consumer is done with it.

    A record is a child of the root, or of an RSS <channel> child of the root, whose local name is in
    ``names``. The first <title> and <author> children of the root and of the channel are noted as they end
    (``show``): they describe the show, not an item, and may come after the items.
    """

    def __init__(self, body: bytes, names: frozenset[str], clock: Callable[[], float]) -> None:
        self.body, self.names, self.clock = body, names, clock
        self.root_show: dict[str, str] = {}
        self.channel_show: dict[str, str] = {}
        self.channel = False

    @property
    def show(self) -> dict[str, str]:
        return self.channel_show if self.channel else self.root_show

    def records(self) -> Iterator[Element]:
        """Raises _Cut at a cap; the parser's own errors propagate."""
        end = _too_many_attributes(self.body)
        try:
            yield from self._records(_Prefix(self.body, len(self.body) if end is None else end))
        except ParseError:
            if end is None:
                raise
        if end is not None:
            raise _Cut(f"an element with more than {MAX_XML_ATTRIBUTES} attributes")

    def _records(self, source: _Prefix) -> Iterator[Element]:
        started = self.clock()
        stack: list[Element] = []
        count = 0
        record_depth = 0        # the stack depth of the record being read, 0 outside one
        record_start = 0
        for event, el in iterparse(source, events=("start", "end"), forbid_dtd=False,
                                   forbid_entities=True, forbid_external=True):
            if event == "start":
                count += 1
                if len(stack) >= MAX_XML_DEPTH:
                    raise _Cut(f"elements nested deeper than {MAX_XML_DEPTH}")
                if count > MAX_XML_ELEMENTS:
                    raise _Cut(f"more than {MAX_XML_ELEMENTS} elements")
                if record_depth and count - record_start > MAX_RECORD_ELEMENTS:
                    raise _Cut(f"a record of more than {MAX_RECORD_ELEMENTS} elements")
                if count % _TIME_CHECK_EVERY == 0 and self.clock() - started > MAX_PARSE_SECONDS:
                    raise _Cut(f"parsing took more than {MAX_PARSE_SECONDS:.0f} s")
                stack.append(el)
                if not record_depth and self._is_record(stack):
                    record_depth, record_start = len(stack), count
                continue
            stack.pop()
            if record_depth and len(stack) >= record_depth:
                continue        # inside a record: kept until the record ends
            if record_depth:
                record_depth = 0
                yield el
            elif len(stack) == 1 and _local(el.tag) == "channel":
                self.channel = True
            elif len(stack) in (1, 2) and _local(el.tag) in ("title", "author"):
                in_channel = len(stack) == 2 and _local(stack[1].tag) == "channel"
                if len(stack) == 1 or in_channel:
                    show = self.channel_show if in_channel else self.root_show
                    if _local(el.tag) not in show:
                        show[_local(el.tag)] = _text(el) or ""
            if stack:
                stack[-1].remove(el)    # its siblings before it are gone already: this is quick
            el.clear()

    def _is_record(self, stack: list[Element]) -> bool:
        depth = len(stack)
        if depth == 2:
            return _local(stack[1].tag) in self.names
        return depth == 3 and _local(stack[1].tag) == "channel" and _local(stack[2].tag) in self.names


class _Prefix:
    """The first ``end`` bytes of a document, read as a file, without a copy."""

    def __init__(self, body: bytes, end: int) -> None:
        self._view, self._pos = memoryview(body)[:end], 0

    def read(self, size: int = -1) -> bytes:
        start = self._pos
        self._pos = len(self._view) if size < 0 else min(len(self._view), start + size)
        return bytes(self._view[start:self._pos])


def _too_many_attributes(body: bytes) -> int | None:
    """Where the first tag that may hold more than MAX_XML_ATTRIBUTES attributes starts, if any."""
    for m in _LONG_TAG.finditer(body):
        if body.count(b"=", m.start(), m.end()) > MAX_XML_ATTRIBUTES:
            return m.start()
    return None


def _read(reader: _Reader, result: XmlResult, take: Callable[[Element], bool], base_url: str) -> None:
    """Feeds ``take`` the document's records until it returns False, the document ends, or a cap is met."""
    try:
        for record in reader.records():
            if not take(record):
                break
    except _Cut as exc:
        result.cut = str(exc)
    except (ParseError, DefusedXmlException, ValueError, RecursionError) as exc:
        reason = f"not readable XML: {type(exc).__name__}: {exc}"[:200]
        if not (result.links or result.entries):
            raise XmlDocumentError(reason) from exc
        result.cut = reason
    if result.cut is not None:
        log.info("%s: %s read in part (%d links, %d items kept): %s", base_url[:200], result.kind,
                 len(result.links), len(result.entries), result.cut)


def parse(kind: str, body: bytes, base_url: str, *, clock: Callable[[], float] = time.monotonic) -> XmlResult:
    """The document's items and links, read incrementally under the caps above (see the module's docstring)."""
    if kind in (SITEMAP, SITEMAP_INDEX):
        return _sitemap(kind, body, base_url, clock)
    return _feed(kind, body, base_url, clock)


def _sitemap(kind: str, body: bytes, base_url: str, clock: Callable[[], float]) -> XmlResult:
    out = XmlResult(kind)

    def take(entry: Element) -> bool:
        loc = _child_text(entry, "loc")
        url = resolve_link(base_url, loc) if loc else None
        if url is None:
            return True
        out.links.append(url)
        modified = parse_date(_child_text(entry, "lastmod"))
        if modified is not None:
            out.lastmod[url] = modified.timestamp()
        return len(out.links) < MAX_SITEMAP_URLS

    _read(_Reader(body, frozenset({"url" if kind == SITEMAP else "sitemap"}), clock), out, take, base_url)
    return out


def _feed(kind: str, body: bytes, base_url: str, clock: Callable[[], float]) -> XmlResult:
    out = XmlResult(kind)
    reader = _Reader(body, frozenset({"item" if kind == RSS else "entry"}), clock)
    # The show's title and author may come after the items: the items' metadata is completed at the end.
    items: list[tuple[dict[str, Any], list[str], str | None]] = []

    def take(item: Element) -> bool:
        meta = pagemeta.normalise({
            "title": _child_text(item, "title"),
            "artist": _child_text(item, "author", "creator") if kind == RSS else None,
            "description": _plain(_child_text(item, "summary", "description", "encoded", "content", "subtitle")),
            "duration": _child_text(item, "duration"),
        })
        if kind == ATOM:
            author = _child(item, "author")
            name = _child_text(author, "name") if author is not None else None
            if name:
                meta.setdefault("artist", name)
        published = parse_date(_child_text(item, "pubDate", "published", "updated", "date"))
        if published is not None:
            meta["published"] = published.isoformat()
        page_link, audio = _item_links(kind, item, base_url)
        if page_link:
            out.links.append(page_link)
        items.append((meta, audio, page_link))
        return len(items) < MAX_FEED_ITEMS

    _read(reader, out, take, base_url)
    show = pagemeta.clean_text(reader.show.get("title") or "") or None
    show_author = pagemeta.clean_text(reader.show.get("author") or "") or None
    artist = show_author if kind == RSS and show_author and "@" not in show_author else show
    for meta, audio, page_link in items:
        if artist and "artist" not in meta:
            meta["artist"] = artist
        if show:
            meta["album"] = show
        for url in audio:
            out.entries.append(FeedEntry(url, dict(meta), page_link))
    return out


def _audio_typed(el: Element) -> bool:
    kind = media.media_type(el.get("type"))
    return media.is_audio_type(kind) if kind else False


def _item_links(kind: str, item: Element, base_url: str) -> tuple[str | None, list[str]]:
    """The item's own page, and its audio: enclosures, media:content, or links that name audio."""
    page: str | None = None
    audio: list[str] = []

    def add(ref: str | None) -> None:
        url = resolve_link(base_url, ref.strip()) if ref else None
        if url and url not in audio:
            audio.append(url)

    for el in item.iter():
        name = _local(el.tag)
        if name == "enclosure" and kind == RSS:
            ref = el.get("url")
            if ref and (_audio_typed(el) or media.is_audio_url(ref) or not el.get("type")):
                add(ref)
        elif name == "content" and el.get("url") is not None:   # media:content
            ref = el.get("url")
            if ref and (_audio_typed(el) or (el.get("medium") == "audio") or media.is_audio_url(ref)):
                add(ref)
        elif name == "link":
            if kind == ATOM:
                ref, rel = el.get("href"), (el.get("rel") or "alternate")
                if rel == "enclosure" and ref and (_audio_typed(el) or media.is_audio_url(ref)):
                    add(ref)
                elif rel == "alternate" and ref:
                    if media.is_audio_url(ref) or _audio_typed(el):
                        add(ref)
                    elif page is None:
                        page = resolve_link(base_url, ref)
            else:
                ref = _text(el)
                if ref and media.is_audio_url(ref):
                    add(ref)
                elif ref and page is None:
                    page = resolve_link(base_url, ref)
    return page, audio
