"""The generic resolver's and the page metadata's faster paths give what the plain code gave, on varied input.

Each reference below is the earlier definition, kept as the oracle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urldefrag

from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from crawler.resolvers import generic, pagemeta
from crawler.resolvers.pagemeta import clean_text, parse_bitrate, parse_duration
from crawler.web.html import css
from crawler.web.page import FetchedPage

# ------------------------------------------------------------------------------------------- references


def ref_normalise(meta: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("title", "artist", "album", "description", "cover"):
        text = clean_text(meta.get(key))
        if text:
            out[key] = text
    duration = parse_duration(meta.get("duration"))
    if duration:
        out["duration"] = duration
    bitrate = parse_bitrate(meta.get("bitrate"))
    if bitrate:
        out["bitrate"] = bitrate
    return out


def ref_json_object_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    lower = {str(k).lower(): v for k, v in obj.items()}
    raw: dict[str, Any] = {}
    for field_name, keys in pagemeta._JSON_KEYS.items():
        for key in keys:
            if key in lower:
                value = lower[key]
                if field_name in ("artist", "album"):
                    value = pagemeta._name_of(value)
                elif field_name == "cover":
                    value = value if isinstance(value, str) else pagemeta._first_url(value)
                if ref_normalise({field_name: value}):
                    raw[field_name] = value
                    break
    return ref_normalise(raw)


_REF_DATA_ATTRIBUTE = re.compile(rb"[\s\"'/]data-([A-Za-z0-9_:.-]+)\s*=")


def ref_data_names(body: bytes) -> list[bytes]:
    return [m.group(1) for m in _REF_DATA_ATTRIBUTE.finditer(body)]


def ref_mentions_audio(text: str) -> bool:
    lower = text.lower()
    return any(ext in lower for ext in generic._DOTTED_EXTENSIONS)


# ------------------------------------------------------------------------------------------- input
_SCALAR = (st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True)
           | st.sampled_from(["", " ", "3:25", "PT3M20S", "128 kbps", "  Blue  Moon ", "1e400", "0", "-1", "12:99",
                              "P1D", "x" * 1200, "http://a.test/c.jpg", "320"])
           | st.text(max_size=30))
_KEYS = st.sampled_from([k for keys in pagemeta._JSON_KEYS.values() for k in keys]
                        + ["Title", "NAME", "url", "contentUrl", "@type", "x"])
_VALUES = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["name", "url", "contentUrl", "@type"]), inner, max_size=3),
                       max_leaves=6)


@settings(max_examples=2000, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=8))
def test_json_object_meta_is_the_reference(obj):
    assert list(pagemeta.json_object_meta(obj).items()) == list(ref_json_object_meta(obj).items())


@settings(max_examples=2000, deadline=None)
@given(st.dictionaries(st.sampled_from(list(pagemeta.FIELDS) + ["other"]), _SCALAR, max_size=8))
def test_normalise_is_the_reference(meta):
    assert list(pagemeta.normalise(meta).items()) == list(ref_normalise(meta).items())


_MARKUP = st.lists(st.sampled_from([b"data-", b"data-a", b"data-song", b" ", b"=", b"'", b'"', b"/", b"x", b"\n",
                                    b"\t", b"-", b":", b"<a ", b">", b"DATA-Title", b"\x0b", b"\xc3\xa9"]),
                   max_size=20).map(b"".join)


@settings(max_examples=3000, deadline=None)
@given(_MARKUP)
def test_data_attribute_names_are_the_references(body):
    found = [m.group(1) for m in generic._DATA_ATTRIBUTE.finditer(body)
             if m.start() and body[m.start() - 1] in generic._BEFORE_ATTRIBUTE]
    assert found == ref_data_names(body)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from([".", "mp3", "MP3", ".m3u8", "m4a", ".Flac", "x", " ", "/", "ｍｐ３", "İ", ".ogg",
                                 ".pls", "a.mp", "3"]), max_size=12).map("".join))
def test_the_audio_mention_gate_is_the_reference(text):
    assert generic._mentions_audio(text) == ref_mentions_audio(text)


def _ref_element_found(node, page=None):
    """element_found as it was: both layers read from every ancestor, attributes asked for each."""
    def own(n, with_title):
        attrs = n.attributes
        raw = {f: attrs.get(a) for a, f in pagemeta._DATA_FIELDS.items() if attrs.get(a)}
        if with_title and not raw.get("title") and attrs.get("title"):
            raw["title"] = attrs.get("title")
        return ref_normalise(raw)

    def micro(n):
        attrs = n.attributes
        if "itemscope" not in attrs or "musicrecording" not in (attrs.get("itemtype") or "").lower():
            return {}
        return ref_normalise({"title": pagemeta._itemprop(n, "name"), "artist": pagemeta._itemprop(n, "byArtist"),
                              "album": pagemeta._itemprop(n, "inAlbum"),
                              "description": pagemeta._itemprop(n, "description"),
                              "duration": pagemeta._itemprop(n, "duration")})

    found = pagemeta.Found()
    found.add(own(node, True), "data")
    found.add(micro(node), "microdata")
    current = node.parent
    while current is not None and current.tag not in ("body", "html", "head"):
        found.add(own(current, False), "data")
        found.add(micro(current), "microdata")
        current = current.parent
    if page is not None:
        found.add(page.named.local(node), "class")
    return found


_ATTRS = st.sampled_from(['', ' data-title="T"', ' data-artist="A" title="t"', ' title="Only title"',
                          ' data-duration="3:20"', ' itemscope itemtype="http://schema.org/MusicRecording"',
                          ' class="artist"', ' data-bitrate="128"', ' data-album=""'])
_INNER = st.sampled_from(['<span itemprop="name">N</span>', '<meta itemprop="byArtist" content="B">', 'text',
                          '<span class="title">S</span>', ''])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["div", "li", "p", "section"]), _ATTRS), max_size=4), _ATTRS, _INNER)
def test_element_found_is_the_reference(outer, own, inner):
    html = "".join(f"<{tag}{attrs}>" for tag, attrs in outer) + f'<a href="/m.mp3"{own}>x</a>{inner}'
    html += "".join(f"</{tag}>" for tag, _ in reversed(outer))
    tree = LexborHTMLParser(f"<html><body>{html}</body></html>")
    node = css(tree, "a")[0]
    context = pagemeta.PageContext(tree, html.encode())
    for page in (None, context):
        got, want = pagemeta.element_found(node, page), _ref_element_found(node, page)
        assert (got.meta, got.sources) == (want.meta, want.sources)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(["http://a.test", "/x", "?", "#", "f", ";p", "//", "é", " ", "%23"]),
                max_size=8).map("".join))
def test_defragging_is_urldefrag(url):
    assert generic._defragged(url) == urldefrag(url).url


_LINK_ATTRS = st.lists(st.sampled_from(['href="/a.mp3"', 'href="/stream/1"', 'href="/x.html"', 'href=""',
                                        'href="/listen?id=1"', 'href=" /b.M3U "', 'type="audio/mpeg"', 'type=""',
                                        'data-title="T"', 'data-x=""', 'download', 'rel="nofollow"',
                                        'href="/c.pls#f"', 'title="Song"', 'href="/DOWNLOAD/3"',
                                        'href="/a.MP3?x=1"', 'href=" /d.ogg"', 'href="/media/"',
                                        'property="og:audio"', 'property="OG:Title"', 'itemprop="contentUrl"',
                                        'content="/m.mp3"', 'content="/n"']), max_size=4)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "area", "audio", "source", "meta"]), _LINK_ATTRS), min_size=1,
                max_size=6))
def test_a_plain_link_settles_as_the_general_path_does(elements):
    """The shortcuts for a link without type or data-* attributes (and for one with its href alone, remembered by
    the href), and for a meta tag without data-* attributes, give what the general path gives: the same page
    resolved with every element made general (a data-x="" attribute, which the general path ignores)."""
    def page(general: bool) -> FetchedPage:
        extra = ' data-x=""' if general else ""
        body = "".join(f'<{tag} {" ".join(attrs)}{extra}>t</{tag}>' for tag, attrs in elements)
        html = f"<html><body>{body}<audio></audio></body></html>".encode()
        return FetchedPage(url="http://s.test/p", final_url="http://s.test/p", status=200,
                           content_type="text/html", headers={}, body=html)

    resolver = generic.GenericResolver({})
    fast, general = resolver.resolve_page(page(False)), resolver.resolve_page(page(True))
    assert [(i.url, i.title, i.meta_source, i.extra) for i in fast.items] == \
        [(i.url, i.title, i.meta_source, i.extra) for i in general.items]
    assert fast.links == general.links and fast.link_meta == general.link_meta


@settings(max_examples=3000, deadline=None)
@given(st.text(max_size=10) | st.lists(st.sampled_from(["a", "/", " ", "\t", "\u00a0", "\u2003", "\x1c", "\x85",
                                                        ".mp3", ":", "\u200b", "\ufeff"]), max_size=8).map("".join))
def test_whitespace_in_a_reference_is_what_isspace_says(value):
    if value:
        assert (value.split(None, 1) != [value]) == any(c.isspace() for c in value)


_TYPES = st.sampled_from(["application/ld+json", "Application/LD+JSON", "APPLICATION/LD+JSON", " application/ld+json",
                          "application/ld+json ", "application/json", "", "application/ld+jſon", "text/javascript",
                          "applİcation/ld+json", "application/ld+json; charset=utf-8"])
_META_ATTRS = st.lists(st.sampled_from(['property="og:title"', 'name="artist"', 'content="x"', 'PROPERTY="a"',
                                        'Name=""', 'itemprop="name"', 'http-equiv="refresh"', 'property']),
                       max_size=3, unique=True)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_TYPES.map(lambda t: f'<script type="{t}">1</script>'),
                          st.just("<script>2</script>"),
                          _META_ATTRS.map(lambda a: f"<meta {' '.join(a)}>")), max_size=6))
def test_the_walk_picks_the_elements_the_metadata_selectors_select(elements):
    tree = LexborHTMLParser("<html><head>" + "".join(elements) + "</head><body></body></html>")
    every = css(tree, "script, meta")

    def ids(nodes):     # lexbor lists an element matching two selectors of a list twice, one after the other
        out = [n.mem_id for n in nodes]
        return [m for i, m in enumerate(out) if i == 0 or out[i - 1] != m]

    assert ids(n for n in every if n.tag == "script" and pagemeta.is_json_ld(n.attributes)) == \
        ids(css(tree, pagemeta._JSON_LD))
    walked = [n for n in every if n.tag == "meta" and pagemeta.is_meta_tag(n.attributes)]
    assert ids(walked) == ids(css(tree, pagemeta.META_TAGS))
    assert pagemeta.meta_tags_of(walked) == pagemeta.meta_tags(tree)


_ELEMENTS = st.sampled_from([
    '<a href="/a.mp3" data-title="T" data-artist="A">Download</a>',
    '<a href="/b.mp3">Song B</a>', '<a href="/stream/3" data-title="S">x</a>', '<a href="/p.m3u">list</a>',
    """<div data-song='{"url": "/c.mp3", "title": "C"}'><a href="/c.mp3">c</a></div>""",
    '<meta property="og:audio" content="/d.mp3">', '<meta itemprop="contentUrl" content="/e.ogg" name="x">',
    '<audio src="/f.mp3" data-title="F"><source src="/g.ogg" type="audio/ogg"></audio>',
    '<object data="/h.swf"><param name="flashvars" value="file=/i.mp3&amp;t=1"></object>',
    '<embed src="/j.mp3" data-artist="J">', '<script>var s = {"file": "/k.mp3", "title": "K"};</script>',
    '<script type="application/ld+json">{"@type": "MusicRecording", "name": "L", "url": "/l.mp3"}</script>',
    '<li class="row"><span class="title">M</span><a href="/m.mp3" data-album="Al">get</a></li>'])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ELEMENTS, min_size=1, max_size=8))
def test_an_element_looked_at_twice_finds_nothing_new(elements):
    """The walk skips an element lexbor lists again (it matched another selector of the list): what the resolver
    takes from an element does not change when it is looked at a second time."""
    body = ("<html><head><title>P</title></head><body>" + "".join(elements) + "</body></html>").encode()
    page = FetchedPage(url="http://s.test/p", final_url="http://s.test/p", status=200, content_type="text/html",
                       headers={}, body=body)
    tree = page.tree()
    resolver = generic.GenericResolver({})

    def collect(times: int):
        out = generic._Collector(page.url, page.final_url, 1000, pagemeta.PageContext(tree, body))
        for node in generic._candidates(tree, body):
            for _ in range(times):
                tag = node.tag
                if tag is None or not tag[0].isalpha():
                    continue
                if tag == "script":
                    resolver._script(out, node, node.attributes)
                else:
                    generic._element(out, node, tag, node.attributes)
        result = out.result()
        return ([(i.url, i.meta_source, i.title, i.artist, i.album, i.extra) for i in result.items], result.links,
                result.link_meta)

    assert collect(1) == collect(2)


def ref_parse_duration(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if 0 < value < 7 * 86400 else None
    if not isinstance(value, str):
        return None
    text = value.strip()[:64]
    try:
        seconds = float(text)
        return seconds if 0 < seconds < 7 * 86400 else None
    except ValueError:
        pass
    if re.fullmatch(r"\d{1,3}(:\d{1,2}){1,2}", text):
        total = 0.0
        for part in text.split(":"):
            total = total * 60 + int(part)
        return total or None
    m = pagemeta._ISO_DURATION.match(text.upper())
    if m and any(m.groups()):
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        total = d * 86400 + h * 3600 + mi * 60 + s
        return total if 0 < total < 7 * 86400 else None
    return None


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(["P", "p", "T", "1", "2.5", "M", "S", "H", "D", ":", " ", "e", "inf", "nan", "-",
                                 "_", "٣", "\u2003", "PT", "x"]), max_size=8).map("".join) | st.text(max_size=10))
def test_durations_parse_as_the_reference(text):
    got, want = parse_duration(text), ref_parse_duration(text)
    assert got == want or (got != got and want != want)
    assert parse_bitrate(text) == (int(m.group(1)) if (m := re.match(r"\s*(\d{1,5})(?!\d)", text))
                                   and int(m.group(1)) > 0 else None)
