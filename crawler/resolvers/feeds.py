"""RSS 2.0 / Atom feeds and XML sitemaps: audio items and links from XML documents a crawl meets.

Feeds (podcasts) are the largest open source of audio on the web: each <enclosure> (RSS) or
<link rel="enclosure"> (Atom), or an item link that names an audio file, is an item, with the episode's title,
the show as artist and album, its description, publish date and duration. Sitemaps (https://www.sitemaps.org/
protocol.html) list a site's pages, with <lastmod>; a sitemap index lists sitemaps, often gzip-compressed.
A sitemap may also be plain text, one absolute URL a line (``TEXT_SITEMAP``): read when a server answers
text/plain, or when robots.txt named it (or its name ends in .txt), up to the protocol's 50,000 URLs and
50 MB.

Feeds are read the way feedparser reads them where real ones break XML's rules: named references borrowed
from HTML (``&eacute;``, ``&nbsp;``) and bare ampersands are rewritten as the parser reads (outside CDATA),
into numeric character references and ``&amp;``; no entity is declared or expanded, and the rewriting counts
against the parse time. ``xml:base`` on any element (feed, channel, entry, link) sets the base of the URLs
inside it, each relative to the one around it and the outermost to the document's URL. An entry without an
author takes the feed's (Atom feed/author, RSS itunes:author or managingEditor), else the show's title. Dates
may be partial W3C dates (``1997``, ``1997-07``): the period's start, so a sitemap never says a page changed
later than it did.

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

import codecs
import html
import html.entities
import io
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit
from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import iterparse

from crawler.resolvers import pagemeta
from crawler.web import media
from crawler.web.urls import resolve_link

log = logging.getLogger(__name__)

RSS, ATOM, SITEMAP, SITEMAP_INDEX = "rss", "atom", "sitemap", "sitemapindex"
TEXT_SITEMAP = "textsitemap"
# The sitemaps protocol's own limits per file.
MAX_SITEMAP_URLS = 50_000
MAX_TEXT_SITEMAP_BYTES = 50 * 1024 * 1024
_MAX_SITEMAP_URL = 2048
# An xml:base longer than a URL a crawl would follow is ignored: nested ones must not build long strings.
_MAX_BASE = 2048
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
_XML_BASE = "{http://www.w3.org/XML/1998/namespace}base"
# A reference XML knows; any other '&' is one HTML allows and XML does not (see the module's docstring).
_XML_REF = rb"(?:amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);"
_NOT_XML_REF = re.compile(rb"&(?!" + _XML_REF + rb")")
# A bare '&' (one that starts no reference) is rewritten by the regex engine alone: a document of ampersands
# costs no Python call per ampersand.
_BARE_AMP = re.compile(rb"&(?![A-Za-z][A-Za-z0-9]{0,40};|#[0-9]+;|#x[0-9a-fA-F]+;)")
_NAMED_REF = re.compile(rb"&(?!(?:amp|lt|gt|quot|apos);)([A-Za-z][A-Za-z0-9]{0,40});")
# HTML's named references as numeric ones: the same bytes in any ASCII-compatible encoding, so the document's
# own encoding need not be known; XML's special characters come out as references too.
_HTML_REFS = {name[:-1].encode(): "".join(f"&#{ord(c)};" for c in value).encode()
              for name, value in html.entities.html5.items() if name.endswith(";")}
# Bytes held back at the end of a chunk so that no reference or CDATA marker is split between two rewrites.
_REPAIR_TAIL = 48
_ENCODING_DECL = re.compile(
    rb"""(?:\xef\xbb\xbf)?\s*<\?xml[^>]{0,200}?encoding\s*=\s*["']([A-Za-z0-9._:-]{1,40})["']""")
# Encodings in which an ASCII '&' may be part of another character: their documents are never rewritten.
_STATEFUL_ENCODINGS = ("iso2022", "utf_16", "utf_32", "utf_7", "hz")
_ASCII_PROBE = "&#;<![CDATA[]]>amp"
_FIRST_URL_LINE = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*https?://[^\s]+[ \t]*(?:\r?\n|\Z)", re.IGNORECASE)
_URL_LINE = re.compile(rb"[^\r\n]+")
_ABSOLUTE_HTTP = re.compile(r"https?://[^\s]+", re.IGNORECASE)
_PARTIAL_DATE = re.compile(r"([0-9]{4})(?:-([0-9]{2}))?")
_NAME_AND_EMAIL = re.compile(r"\S+@\S+\s*\((.+)\)|(.+?)\s*<[^<>@\s]+@[^<>\s]+>")
_EMAIL = re.compile(r"\S+@\S+")


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


def text_sitemap_kind(content_type: str, url: str, referrer: str | None, body: bytes) -> str | None:
    """TEXT_SITEMAP when the body is a sitemap in text form: a text/plain answer, or an untyped one that
    robots.txt named (``referrer``) or whose name ends in .txt; judged by its first line, an absolute URL."""
    if content_type != "text/plain":
        if content_type not in _UNTYPED:
            return None
        try:
            named = urlsplit(url).path.lower().endswith((".txt", ".txt.gz")) or (
                referrer is not None and urlsplit(referrer).path == "/robots.txt")
        except ValueError:      # not a URL (a malformed IPv6 host): nothing names it a sitemap
            return None
        if not named:
            return None
    return TEXT_SITEMAP if _FIRST_URL_LINE.match(body[:4096]) else None


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


def _person(value: str | None) -> str | None:
    """A name from an author field: "Name", "mail@host (Name)" (RSS) or "Name <mail@host>"; None for a bare
    address."""
    if not value:
        return None
    value = value.strip()[:512]     # a name is short; the patterns backtrack on long text
    m = _NAME_AND_EMAIL.fullmatch(value)
    if m:
        value = m.group(1) or m.group(2)
    value = pagemeta.clean_text(value)
    return value if value and not _EMAIL.fullmatch(value) else None


def _rebase(base: str, ref: str | None) -> str:
    """The base inside an element with this xml:base; the one around it when the attribute is absent or
    unusable."""
    if not ref or len(ref) > _MAX_BASE:
        return base
    url = resolve_link(base, ref)
    return url if url is not None and len(url) <= _MAX_BASE else base


def _with_bases(el: Element, base: str) -> Iterator[tuple[Element, str]]:
    """The element and its descendants in document order, each with the base its own xml:base leads to."""
    todo = [(el, base)]
    while todo:
        e, b = todo.pop()
        b = _rebase(b, e.get(_XML_BASE))
        yield e, b
        todo.extend((c, b) for c in reversed(e))


def parse_date(value: str | None) -> datetime | None:
    """RFC 822 (RSS pubDate) or ISO 8601 (Atom, sitemaps' W3C datetime) as an aware datetime.

    W3C-DTF allows a year or a year and month alone: they read as the period's first instant, so a page is
    never said to have changed later than it did (the master fetches a page again when its lastmod passes its
    last crawl)."""
    if not value:
        return None
    value = value.strip()[:64]
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        partial = _PARTIAL_DATE.fullmatch(value)
        try:
            if partial:
                dt = datetime(int(partial.group(1)), int(partial.group(2) or 1), 1, tzinfo=UTC)
            else:
                dt = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


class _Cut(Exception):
    """The document is read no further; what was read before stands."""


class _Reader:
    """The records of one document, one at a time, each dropped once its consumer is done with it.

    A record is a child of the root, or of an RSS <channel> child of the root, whose local name is in
    ``names``; it comes with the base URL of the element around it (``xml:base``). The first <title>,
    <author> and <managingEditor> children of the root and of the channel are noted as they end (``show``):
    they describe the show, not an item, and may come after the items.
    """

    def __init__(self, body: bytes, names: frozenset[str], clock: Callable[[], float], base_url: str) -> None:
        self.body, self.names, self.clock, self.base_url = body, names, clock, base_url
        self.root_show: dict[str, str] = {}
        self.channel_show: dict[str, str] = {}
        self.channel = False

    @property
    def show(self) -> dict[str, str]:
        return self.channel_show if self.channel else self.root_show

    def records(self) -> Iterator[tuple[Element, str]]:
        """Raises _Cut at a cap; the parser's own errors propagate."""
        end = _too_many_attributes(self.body)
        started = self.clock()

        def check_time() -> None:
            if self.clock() - started > MAX_PARSE_SECONDS:
                raise _Cut(f"parsing took more than {MAX_PARSE_SECONDS:.0f} s")

        repair = _NOT_XML_REF.search(self.body) is not None and _ascii_compatible(self.body)
        source = _Prefix(self.body, len(self.body) if end is None else end, check_time if repair else None)
        try:
            yield from self._records(source, check_time)
        except ParseError:
            if end is None:
                raise
        if end is not None:
            raise _Cut(f"an element with more than {MAX_XML_ATTRIBUTES} attributes")

    def _records(self, source: _Prefix, check_time: Callable[[], None]) -> Iterator[tuple[Element, str]]:
        stack: list[Element] = []
        bases: list[str] = []   # the base URL inside each open element
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
                if count % _TIME_CHECK_EVERY == 0:
                    check_time()
                stack.append(el)
                bases.append(_rebase(bases[-1] if bases else self.base_url, el.get(_XML_BASE)))
                if not record_depth and self._is_record(stack):
                    record_depth, record_start = len(stack), count
                continue
            stack.pop()
            bases.pop()
            if record_depth and len(stack) >= record_depth:
                continue        # inside a record: kept until the record ends
            if record_depth:
                record_depth = 0
                yield el, bases[-1]
            elif len(stack) == 1 and _local(el.tag) == "channel":
                self.channel = True
            elif _local(el.tag) in ("title", "author", "managingEditor"):
                show = self._show_of(stack)
                if show is not None and _local(el.tag) not in show:
                    show[_local(el.tag)] = _text(el) or ""
            elif _local(el.tag) == "name" and len(stack) > 1 and _local(stack[-1].tag) == "author":
                # An Atom person is a <name> (with an <email>, a <uri>): the name is the show's author. It
                # ends (and is dropped) before its <author> does.
                show = self._show_of(stack[:-1])
                if show is not None and "author" not in show:
                    show["author"] = _text(el) or ""
            if stack:
                stack[-1].remove(el)    # its siblings before it are gone already: this is quick
            el.clear()

    def _show_of(self, stack: list[Element]) -> dict[str, str] | None:
        """Where a child of stack[-1] is noted when it describes the show (a child of the root or channel)."""
        if len(stack) == 1:
            return self.root_show
        if len(stack) == 2 and _local(stack[1].tag) == "channel":
            return self.channel_show
        return None

    def _is_record(self, stack: list[Element]) -> bool:
        depth = len(stack)
        if depth == 2:
            return _local(stack[1].tag) in self.names
        return depth == 3 and _local(stack[1].tag) == "channel" and _local(stack[2].tag) in self.names


class _Prefix:
    """The first ``end`` bytes of a document, read as a file, without a copy of the whole.

    With ``check_time`` the references XML does not know are rewritten chunk by chunk as the parser reads (see
    the module's docstring), outside CDATA sections; the clock is looked at every _TIME_CHECK_EVERY rewrites.
    A chunk ends before the last '&' or '<' in its last _REPAIR_TAIL bytes and before a ']' or ']]' at its
    end, so no reference or CDATA marker is split between two rewrites."""

    def __init__(self, body: bytes, end: int, check_time: Callable[[], None] | None = None) -> None:
        self._view, self._pos = memoryview(body)[:end], 0
        self._check_time = check_time
        self._in_cdata = False
        self._repairs = 0

    def read(self, size: int = -1) -> bytes:
        start = self._pos
        self._pos = len(self._view) if size < 0 else min(len(self._view), start + size)
        if self._check_time is None:
            return bytes(self._view[start:self._pos])
        if self._pos < len(self._view):
            tail = bytes(self._view[max(start, self._pos - _REPAIR_TAIL):self._pos])
            held = max(tail.rfind(b"&"), tail.rfind(b"<"))
            kept = tail if held < 0 else tail[:held]
            # A "]]>" split after one or two of its ']' is held back too.
            kept = kept[:len(kept) - min(2, len(kept) - len(kept.rstrip(b"]")))]
            if len(tail) - len(kept) < self._pos - start:
                self._pos -= len(tail) - len(kept)
        return self._repair(bytes(self._view[start:self._pos]))

    def _repair(self, data: bytes) -> bytes:
        out: list[bytes] = []
        i = 0
        while i < len(data):
            if self._in_cdata:
                j = data.find(b"]]>", i)
                if j < 0:
                    out.append(data[i:])
                    break
                out.append(data[i:j + 3])
                i, self._in_cdata = j + 3, False
                continue
            j = data.find(b"<![CDATA[", i)
            text = data[i:len(data) if j < 0 else j]
            out.append(_NAMED_REF.sub(self._named, _BARE_AMP.sub(b"&amp;", text)))
            if j < 0:
                break
            out.append(b"<![CDATA[")
            i, self._in_cdata = j + 9, True
        return b"".join(out)

    def _named(self, m: re.Match[bytes]) -> bytes:
        assert self._check_time is not None
        self._repairs += 1
        if self._repairs % _TIME_CHECK_EVERY == 0:
            self._check_time()
        known = _HTML_REFS.get(m.group(1))
        # An unknown name stays as text, as a browser shows it.
        return known if known is not None else b"&amp;" + m.group(0)[1:]


def _ascii_compatible(body: bytes) -> bool:
    """Whether '&' and '<' in the document's bytes are those characters: true of UTF-8 (XML's default), the
    ISO-8859 and Windows code pages and the common CJK encodings; not of UTF-16, EBCDIC or ISO-2022."""
    if b"\x00" in body[:4] or body.startswith((b"\xfe\xff", b"\xff\xfe")):
        return False
    m = _ENCODING_DECL.match(body, 0, 300)
    if m is None:
        return True
    try:
        info = codecs.lookup(m.group(1).decode("ascii"))
        return (not info.name.startswith(_STATEFUL_ENCODINGS)
                and _ASCII_PROBE.encode(info.name) == _ASCII_PROBE.encode("ascii"))
    except (LookupError, UnicodeError):
        return False


def _too_many_attributes(body: bytes) -> int | None:
    """Where the first tag that may hold more than MAX_XML_ATTRIBUTES attributes starts, if any."""
    for m in _LONG_TAG.finditer(body):
        if body.count(b"=", m.start(), m.end()) > MAX_XML_ATTRIBUTES:
            return m.start()
    return None


def _read(reader: _Reader, result: XmlResult, take: Callable[[Element, str], bool], base_url: str) -> None:
    """Feeds ``take`` the document's records (with the base URL around each) until it returns False, the
    document ends, or a cap is met."""
    try:
        for record, base in reader.records():
            if not take(record, base):
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
    if kind == TEXT_SITEMAP:
        return _text_sitemap(body, base_url, clock)
    if kind in (SITEMAP, SITEMAP_INDEX):
        return _sitemap(kind, body, base_url, clock)
    return _feed(kind, body, base_url, clock)


def _text_sitemap(body: bytes, base_url: str, clock: Callable[[], float]) -> XmlResult:
    """One absolute http(s) URL a line (sitemaps.org); other lines are skipped, as are URLs of 2,048
    characters or more. Read up to MAX_SITEMAP_URLS URLs and MAX_TEXT_SITEMAP_BYTES bytes (a line cut there is
    dropped), in at most MAX_PARSE_SECONDS."""
    out = XmlResult(TEXT_SITEMAP)
    started = clock()
    end = min(len(body), MAX_TEXT_SITEMAP_BYTES)
    if end < len(body):
        end = body.rfind(b"\n", 0, end) + 1
        out.cut = f"more than {MAX_TEXT_SITEMAP_BYTES} bytes"
    for n, m in enumerate(_URL_LINE.finditer(body, 0, end), 1):
        if n % _TIME_CHECK_EVERY == 0 and clock() - started > MAX_PARSE_SECONDS:
            out.cut = f"parsing took more than {MAX_PARSE_SECONDS:.0f} s"
            break
        line = m.group(0).decode("utf-8", "replace").strip().lstrip("\ufeff")
        if len(line) >= _MAX_SITEMAP_URL or not _ABSOLUTE_HTTP.fullmatch(line):
            continue
        url = resolve_link(base_url, line)
        if url is None:
            continue
        if len(out.links) == MAX_SITEMAP_URLS:
            out.cut = f"more than {MAX_SITEMAP_URLS} URLs"
            break
        out.links.append(url)
    if out.cut is not None:
        log.info("%s: %s read in part (%d links kept): %s", base_url[:200], out.kind, len(out.links), out.cut)
    return out


def _sitemap(kind: str, body: bytes, base_url: str, clock: Callable[[], float]) -> XmlResult:
    out = XmlResult(kind)

    def take(entry: Element, base: str) -> bool:
        loc = _child_text(entry, "loc")
        url = resolve_link(_rebase(base, entry.get(_XML_BASE)), loc) if loc else None
        if url is None:
            return True
        out.links.append(url)
        modified = parse_date(_child_text(entry, "lastmod"))
        if modified is not None:
            out.lastmod[url] = modified.timestamp()
        return len(out.links) < MAX_SITEMAP_URLS

    _read(_Reader(body, frozenset({"url" if kind == SITEMAP else "sitemap"}), clock, base_url), out, take,
          base_url)
    return out


def _feed(kind: str, body: bytes, base_url: str, clock: Callable[[], float]) -> XmlResult:
    out = XmlResult(kind)
    reader = _Reader(body, frozenset({"item" if kind == RSS else "entry"}), clock, base_url)
    # The show's title and author may come after the items: the items' metadata is completed at the end.
    items: list[tuple[dict[str, Any], list[str], str | None]] = []

    def take(item: Element, base: str) -> bool:
        meta = pagemeta.normalise({
            "title": _child_text(item, "title"),
            "artist": (_person(_child_text(item, "author")) or _person(_child_text(item, "creator"))
                       if kind == RSS else None),
            "description": _plain(_child_text(item, "summary", "description", "encoded", "content", "subtitle")),
            "duration": _child_text(item, "duration"),
        })
        if kind == ATOM:
            author = _child(item, "author")
            name = _person(_child_text(author, "name")) if author is not None else None
            if name:
                meta.setdefault("artist", name)
        published = parse_date(_child_text(item, "pubDate", "published", "updated", "date"))
        if published is not None:
            meta["published"] = published.isoformat()
        page_link, audio = _item_links(kind, item, base)
        if page_link:
            out.links.append(page_link)
        items.append((meta, audio, page_link))
        return len(items) < MAX_FEED_ITEMS

    _read(reader, out, take, base_url)
    show = pagemeta.clean_text(reader.show.get("title") or "") or None
    artist = _person(reader.show.get("author")) or _person(reader.show.get("managingEditor")) or show
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

    def add(ref: str | None, base: str) -> None:
        url = resolve_link(base, ref.strip()) if ref else None
        if url and url not in audio:
            audio.append(url)

    for el, base in _with_bases(item, base_url):
        name = _local(el.tag)
        if name == "enclosure" and kind == RSS:
            ref = el.get("url")
            if ref and (_audio_typed(el) or media.is_audio_url(ref) or not el.get("type")):
                add(ref, base)
        elif name == "content" and el.get("url") is not None:   # media:content
            ref = el.get("url")
            if ref and (_audio_typed(el) or (el.get("medium") == "audio") or media.is_audio_url(ref)):
                add(ref, base)
        elif name == "link":
            if kind == ATOM:
                ref, rel = el.get("href"), (el.get("rel") or "alternate")
                if rel == "enclosure" and ref and (_audio_typed(el) or media.is_audio_url(ref)):
                    add(ref, base)
                elif rel == "alternate" and ref:
                    if media.is_audio_url(ref) or _audio_typed(el):
                        add(ref, base)
                    elif page is None:
                        page = resolve_link(base, ref)
            else:
                ref = _text(el)
                if ref and media.is_audio_url(ref):
                    add(ref, base)
                elif ref and page is None:
                    page = resolve_link(base, ref)
    return page, audio
