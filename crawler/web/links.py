"""The links a page offers to follow, as absolute URLs in document order."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from selectolax.lexbor import LexborHTMLParser, LexborNode

from crawler.web.html import css, css_first
from crawler.web.memo import Memo
from crawler.web.urls import link_joiner, resolve_link

# "5; url=/next", "0;URL='/next'", "3, /next": the delay, a separator, an optional "url=", the target.
_REFRESH_URL = re.compile(r"""^\s*[\d.]*\s*[;,]\s*(?:url\s*=\s*)?(['"]?)(.*?)\1\s*$""", re.IGNORECASE | re.DOTALL)
_MAX_REFRESH = 4096
_LINK_SELECTOR = "a[href], area[href], iframe[src], frame[src], link[href], meta[http-equiv]"
# The links a page at the depth limit would have offered, counted for the discard figures without extracting them.
_COUNTED_SELECTOR = "a[href], area[href], iframe[src], frame[src]"
_FOLLOWED_RELS = frozenset({"next", "prev", "previous"})
# <link rel="alternate"> of these types announces the site's feeds: podcasts are a source of audio.
_FEED_TYPES = frozenset({"application/rss+xml", "application/atom+xml", "application/rdf+xml"})


# What every <base> element's start tag holds: lexbor lowers ASCII letters of a tag name and nothing else.
_BASE_TAG = re.compile(r"<base", re.IGNORECASE)


def document_base(tree: LexborHTMLParser, page_url: str, source: str | None = None) -> str:
    """The URL relative references resolve against: the first <base href>, else the page's own URL. source: the
    text the tree was parsed from, when the caller has it: without "<base" in it (most pages) the tree holds no
    <base> element, which a regex scan says for a third of a selector's cost."""
    if source is not None and _BASE_TAG.search(source) is None:
        return page_url
    base = css_first(tree, "base[href]")
    if base is not None:
        href = base.attributes.get("href") or ""
        joined = resolve_link(page_url, href)
        if joined:
            return joined
    return page_url


def _rel_tokens(attrs: dict[str, str | None]) -> set[str]:
    rel = attrs.get("rel")
    return set(rel.lower().split()) if rel else set()


def _refresh_target(content: str) -> str | None:
    if len(content) > _MAX_REFRESH:
        return None  # the lazy match below would go quadratic on a hostile attribute
    m = _REFRESH_URL.match(content)
    return m.group(2).strip() if m else None


def extract_links(tree: LexborHTMLParser, base_url: str, max_elements: int | None = None, *,
                  source: str | None = None) -> list[str]:
    """a, area, iframe, frame, link rel=next/prev, feeds' link rel=alternate and meta refresh targets;
    nofollow links skipped.

    max_elements bounds the link elements looked at (in document order): each costs Python work, and a
    hostile page can hold hundreds of thousands. source: the text the tree was parsed from (document_base).
    """
    join = link_joiner(document_base(tree, base_url, source))
    seen: set[str] = set()
    out: list[str] = []
    nodes = css(tree, _LINK_SELECTOR)
    if max_elements is not None and len(nodes) > max_elements:
        del nodes[max_elements:]
    for node in nodes:
        tag = node.tag
        attrs = node.attributes
        ref: str | None
        if tag in ("a", "area"):
            if "rel" in attrs and "nofollow" in _rel_tokens(attrs):
                continue
            ref = attrs.get("href")
        elif tag in ("iframe", "frame"):
            ref = attrs.get("src")
        elif tag == "link":
            rels = _rel_tokens(attrs)
            followed = rels & _FOLLOWED_RELS or (
                "alternate" in rels and (attrs.get("type") or "").strip().lower() in _FEED_TYPES)
            ref = attrs.get("href") if followed else None
        else:  # meta
            if (attrs.get("http-equiv") or "").strip().lower() != "refresh":
                continue
            ref = _refresh_target(attrs.get("content") or "")
        if not ref:
            continue
        url = join(ref)
        if url is not None and url not in seen:
            seen.add(url)
            out.append(url)
    return out


# A link with no page's extension whose element carries song metadata or whose path says so is likely a stream
# (an address that answers with audio bytes although nothing in its name says audio).
_PAGE_EXTENSIONS = frozenset({"html", "htm", "xhtml", "shtml", "php", "asp", "aspx", "jsp", "cgi", "xml", "txt",
                              "css", "js", "json", "png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "pdf"})
# Matched against the lower-cased text: a case-sensitive search of a lowered string costs half an IGNORECASE one,
# and this runs for every link of a page that may hold audio.
_STREAM_PATH = re.compile(r"stream|listen|download|audio|/play|/mp3|/media/")
_SONG_ATTRS = frozenset({"data-title", "data-artist", "data-album", "data-duration", "download"})


def audio_candidates(tree: LexborHTMLParser, base_url: str, max_elements: int | None = None) -> list[str]:
    """The a/area links of a page that may be its audio (streams named like pages), as absolute URLs: what a
    page at the crawl's depth limit still follows, since resolving its audio is part of the page."""
    return [url for url, _ in audio_candidate_links(tree, base_url, max_elements)]


def audio_candidate_links(tree: LexborHTMLParser, base_url: str,
                          max_elements: int | None = None) -> list[tuple[str, LexborNode]]:
    """audio_candidates with the element of each (the first that links it), for what the page says about it."""
    base = document_base(tree, base_url)
    out: dict[str, LexborNode] = {}
    nodes = css(tree, "a[href], area[href]")
    if max_elements is not None and len(nodes) > max_elements:
        del nodes[max_elements:]
    for node in nodes:
        attrs = node.attributes
        if len(attrs) == 1 and not stream_path_hint(attrs.get("href") or ""):
            continue     # its href alone, which says no stream (the site's navigation): stream_candidate's None
        url = stream_candidate(base, node, attrs)
        if url is not None and url not in out:
            out[url] = node
    return list(out.items())


def stream_candidate(base: str, node: LexborNode, attrs: Mapping[str, str | None] | None = None) -> str | None:
    """The absolute URL of an a/area element that may be a stream named like a page (no page's extension, and a
    song's attributes or a path that says so), else None. base: the document's base (document_base); attrs: the
    element's attributes, when the caller has them already."""
    if attrs is None:
        attrs = node.attributes
    href = attrs.get("href")
    # Most links are the site's navigation: settled on the raw attribute, before any joining.
    song = not _SONG_ATTRS.isdisjoint(attrs)
    if not href or not (song or stream_path_hint(href)):
        return None
    url = resolve_link(base, href)
    if url is None:
        return None
    path = urlsplit(url).path
    name = path.rsplit("/", 1)[-1]
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if ext in _PAGE_EXTENSIONS or not name or not (song or _STREAM_PATH.search(path.lower())):
        return None
    return url


def stream_path_hint(href: str) -> bool:
    """Whether a reference's text says stream (a word of a stream's path): what lets an a/area element without a
    song's attributes be a stream named like a page (stream_candidate). Asked for every link of many pages, and
    a site's navigation repeats on each: the answers are remembered."""
    known = _HINTS.get(href)
    if known is None:
        known = _HINTS.keep(href, _STREAM_PATH.search(href.lower()) is not None)
    return known


_HINTS: Memo[str, bool] = Memo(10_000)


def count_links(tree: LexborHTMLParser) -> int:
    """How many link elements the page has: one C-side query, without resolving or filtering any of them."""
    return len(css(tree, _COUNTED_SELECTOR))
