"""Link extraction: which references a page offers to crawl, absolute, ordered, once each."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from crawler.web.links import audio_candidates, document_base, extract_links
from crawler.web.urls import resolve_link
from crawler.worker.linkcache import LinkCache

PAGE = "http://site.example.com/dir/page.html?q=1"


def links(html: str, base: str = PAGE) -> list[str]:
    return extract_links(LexborHTMLParser(html), base)


def test_every_followed_element_in_document_order() -> None:
    html = """<html><head><link rel="next" href="/p2"><link rel="stylesheet" href="/s.css">
    <link rel="Prev alternate" href="p0"><link rel="icon" href="/favicon.ico"></head><body>
    <a href="a.html">a</a><map><area href="/area" shape="rect"></map>
    <iframe src="//frames.example.com/f"></iframe>
    <a href="https://other.example.org/x#frag">x</a></body></html>"""
    assert links(html) == [
        "http://site.example.com/p2", "http://site.example.com/dir/p0", "http://site.example.com/dir/a.html",
        "http://site.example.com/area", "http://frames.example.com/f", "https://other.example.org/x#frag"]


def test_frames() -> None:
    html = '<html><frameset><frame src="top.html"><frame src="/main.html"></frameset></html>'
    assert links(html) == ["http://site.example.com/dir/top.html", "http://site.example.com/main.html"]


def test_base_href_is_honoured_and_itself_relative() -> None:
    html = '<head><base href="/other/"><base href="/ignored/"></head><a href="x">x</a><a href="/abs">y</a>'
    assert links(html) == ["http://site.example.com/other/x", "http://site.example.com/abs"]
    tree = LexborHTMLParser('<base href="javascript:void(0)"><a href="x">x</a>')
    assert document_base(tree, PAGE) == PAGE


@pytest.mark.parametrize("href", [
    "javascript:void(0)", " JavaScript:go()", "mailto:me@example.com", "tel:+100", "data:text/html,hi",
    "#top", "#", "", "   ", "ftp://files.example.com/a", "http://[::1",
])
def test_skipped_references(href: str) -> None:
    assert links(f'<a href="{href}">x</a><a href="/kept">k</a>') == ["http://site.example.com/kept"]


def test_nofollow_links_are_skipped() -> None:
    html = ('<a href="/1" rel="nofollow">1</a><a href="/2" rel="external NoFollow">2</a>'
            '<area href="/3" rel="nofollow"><a href="/4" rel="noopener">4</a>')
    assert links(html) == ["http://site.example.com/4"]


def test_duplicates_removed_order_kept() -> None:
    html = '<a href="/b">b</a><a href="/a">a</a><a href="http://site.example.com/b">b again</a><a href="a">rel</a>'
    assert links(html) == ["http://site.example.com/b", "http://site.example.com/a",
                           "http://site.example.com/dir/a"]


@pytest.mark.parametrize("content, expected", [
    ("5; url=/next", "http://site.example.com/next"),
    ("0;URL='http://elsewhere.example.com/'", "http://elsewhere.example.com/"),
    ("3, url=&quot;rel.html&quot;", "http://site.example.com/dir/rel.html"),
    ("0; /bare", "http://site.example.com/bare"),
])
def test_meta_refresh(content: str, expected: str) -> None:
    assert links(f'<meta http-equiv="Refresh" content="{content}">') == [expected]


@pytest.mark.parametrize("html", [
    '<meta http-equiv="refresh" content="30">',
    '<meta http-equiv="content-type" content="0; url=/no">',
    '<meta name="refresh" content="0; url=/no">',
])
def test_meta_that_is_not_a_redirect(html: str) -> None:
    assert links(html) == []


def test_hostile_meta_refresh_is_ignored_quickly() -> None:
    started = time.perf_counter()
    content = "0; x" + " " * 200_000 + "y"
    assert links(f'<meta http-equiv="refresh" content="{content}"><a href="/ok">ok</a>') == [
        "http://site.example.com/ok"]
    assert time.perf_counter() - started < 2


def test_whitespace_inside_and_around_references() -> None:
    assert links('<a href="  /a\n/b\t ">x</a>') == ["http://site.example.com/a/b"]


def test_resolve_link_keeps_fragments_and_query() -> None:
    assert resolve_link(PAGE, "../song/#hash=AB&album_id=1") == "http://site.example.com/song/#hash=AB&album_id=1"
    assert resolve_link(PAGE, "?page=2") == "http://site.example.com/dir/page.html?page=2"
    assert resolve_link(PAGE, "HTTPS://Upper.example.com/") is not None   # case is the normaliser's business


@pytest.mark.parametrize("ref, expected", [
    ("http:g", "http://site.example.com/dir/g"),          # the base's own scheme: relative, as browsers read it
    ("https:g", "https://g/"),                             # another special scheme: its host follows (WHATWG)
    ("//cdn.example.com", "http://cdn.example.com/"),
    ("http://[::1]:8080/x", "http://[::1]:8080/x"),
    ("http:///x", "http://x/"),                            # any run of slashes leads to the host
    ("http://[::1/x", None), ("http://u@/x", None), ("https:", None), ("http://a b/", None),
])
def test_resolve_link_follows_only_http_urls_with_a_host(ref: str, expected: str | None) -> None:
    assert resolve_link(PAGE, ref) == expected


def test_page_without_links() -> None:
    assert links("<p>No links. Visit example.com/page or http://example.com/text</p>") == []


def test_link_elements_looked_at_are_bounded() -> None:
    page = "<html><body>" + "".join(f'<a href="/p/{i}">x</a>' for i in range(1000)) + "</body></html>"
    tree = LexborHTMLParser(page)
    assert len(extract_links(tree, "http://h/")) == 1000
    assert extract_links(tree, "http://h/", max_elements=10) == [f"http://h/p/{i}" for i in range(10)]


def test_the_link_cache_holds_back_a_link_seen_again_only_at_the_same_depth_or_deeper():
    cache = LinkCache(100)
    assert cache.fresh(["http://a/1", "http://a/2", "http://a/1"], 3) == ["http://a/1", "http://a/2"]
    assert cache.fresh(["http://a/1", "http://a/2"], 4) == []
    assert cache.fresh(["http://a/1"], 3) == []
    # A shorter path to it: reported again, so the master lowers its depth; then held back at that depth.
    assert cache.fresh(["http://a/2", "http://a/1"], 2) == ["http://a/2", "http://a/1"]
    assert cache.fresh(["http://a/2"], 2) == [] and len(cache) == 2


def test_audio_candidates_are_links_that_look_like_streams_not_pages():
    tree = LexborHTMLParser(
        '<a href="/stream/12" data-title="Song">Listen</a> <a href="/song/3.html" data-title="x">page</a>'
        '<a href="/listen/9">x</a> <a href="/about">about</a> <a href="/dl?id=4" download>file</a>'
        '<a href="/img/cover.png" data-title="c">c</a> <a href="mailto:x@y" data-title="m">m</a>')
    assert audio_candidates(tree, "http://a/song/1.html") == [
        "http://a/stream/12", "http://a/listen/9", "http://a/dl?id=4"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(['<base href="/b/">', '<BASE HREF="/c/">', '<Base href="x/">', "<base>",
                                 '<baſe href="/s/">', '<!-- <base href="/d/"> -->', '<basefont href="/e/">',
                                 '<a href="y">y</a>', "<p>base</p>", '<script>"<base href=/f/>"</script>',
                                 '<svg><base href="/g/"></svg>']), max_size=5).map("".join))
def test_the_base_found_with_the_source_is_the_base_found_without(html):
    tree = LexborHTMLParser(html)
    assert document_base(tree, PAGE, html) == document_base(tree, PAGE)
    assert extract_links(tree, PAGE, source=html) == extract_links(tree, PAGE)
