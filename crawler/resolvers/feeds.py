"""RSS 2.0 / Atom feeds and XML sitemaps: audio items and links from XML documents a crawl meets.

Feeds (podcasts) are the largest open source of audio on the web: each <enclosure> (RSS) or
<link rel="enclosure"> (Atom), or an item link that names an audio file, is an item, with the episode's title,
the show as artist and album, its description, publish date and duration. Sitemaps (https://www.sitemaps.org/
protocol.html) list a site's pages, with <lastmod>; a sitemap index lists sitemaps, often gzip-compressed.

Everything here is an attacker's document: it is parsed with defusedxml, which refuses entity declarations
(no "billion laughs") and external entities and DTDs (no XXE), a gzip body is decompressed only up to a bound,
and the counts of items and links are capped.
"""

from __future__ import annotations

import html
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from crawler.resolvers import pagemeta
from crawler.web import media
from crawler.web.urls import resolve_link

RSS, ATOM, SITEMAP, SITEMAP_INDEX = "rss", "atom", "sitemap", "sitemapindex"
# The sitemaps protocol's own limit per file.
MAX_SITEMAP_URLS = 50_000
MAX_FEED_ITEMS = 5000
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


def _parse(body: bytes) -> Element:
    try:
        return fromstring(body, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except (ParseError, DefusedXmlException, ValueError, RecursionError) as exc:
        raise XmlDocumentError(f"not readable XML: {type(exc).__name__}: {exc}"[:200]) from exc


def parse(kind: str, body: bytes, base_url: str) -> XmlResult:
    root = _parse(body)
    if kind in (SITEMAP, SITEMAP_INDEX):
        return _sitemap(kind, root, base_url)
    return _feed(kind, root, base_url)


def _sitemap(kind: str, root: Element, base_url: str) -> XmlResult:
    out = XmlResult(kind)
    wanted = "url" if kind == SITEMAP else "sitemap"
    for entry in root:
        if _local(entry.tag) != wanted:
            continue
        loc = _child_text(entry, "loc")
        url = resolve_link(base_url, loc) if loc else None
        if url is None:
            continue
        out.links.append(url)
        modified = parse_date(_child_text(entry, "lastmod"))
        if modified is not None:
            out.lastmod[url] = modified.timestamp()
        if len(out.links) >= MAX_SITEMAP_URLS:
            break
    return out


def _feed(kind: str, root: Element, base_url: str) -> XmlResult:
    out = XmlResult(kind)
    if kind == RSS:
        channel = _child(root, "channel")
        show_el = channel if channel is not None else root
        # RSS 1.0 (RDF) keeps its items beside the channel, RSS 2.0 inside it.
        items = [el for el in (channel if channel is not None else root) if _local(el.tag) == "item"]
        if channel is not None and not items:
            items = [el for el in root if _local(el.tag) == "item"]
    else:
        show_el = root
        items = [el for el in root if _local(el.tag) == "entry"]
    show = _child_text(show_el, "title")
    show_author = _child_text(show_el, "author")
    for item in items[:MAX_FEED_ITEMS]:
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
        artist = show_author if kind == RSS and show_author and "@" not in show_author else show
        if artist and "artist" not in meta:
            meta["artist"] = artist
        if show:
            meta["album"] = show
        published = parse_date(_child_text(item, "pubDate", "published", "updated", "date"))
        if published is not None:
            meta["published"] = published.isoformat()
        page_link, audio = _item_links(kind, item, base_url)
        if page_link:
            out.links.append(page_link)
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
