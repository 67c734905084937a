"""Pages measured before parsing: deep nesting and huge tag counts are refused, real markup is not."""

import time

import pytest
from selectolax.lexbor import LexborHTMLParser

from crawler.web import html

DEPTH = 512


@pytest.mark.parametrize(("name", "body"), [
    ("nested divs", b"<html><body>" + b"<div>" * 6000),
    ("nested then closed", b"<html><body>" + b"<div>" * 6000 + b"</div>" * 6000),
    ("stray end tags between", b"<html><body>" + b"<div></x>" * 6000),
    ("unknown elements", b"<html><body>" + b"<x-y>" * 6000),
    ("formatting elements", b"<html><body>" + b"<b><i>" * 3000),
])
def test_deep_nesting_is_refused(name, body):
    assert html.precheck(body, max_tags=100_000, max_depth=DEPTH) == (None, True)
    assert html.too_deep(body, DEPTH) is not None, name


@pytest.mark.parametrize(("name", "body"), [
    ("list items left open", b"<html><body><ul>" + b"<li>item" * 6000 + b"</ul>"),
    ("paragraphs left open", b"<html><body>" + b"<p>text" * 6000),
    ("links left open", b"<html><body>" + b'<a href="/x">text' * 6000),
    ("sloppy inline elements", b"<html><body>" + b"<div><span>x</div>" * 6000),
    ("svg icons", b"<html><body>" + b"<svg><path d=x/><path d=y/></svg>" * 3000),
    ("markup in scripts", b"<html><body><script>" + b"'<div>'+" * 6000 + b"</script>"),
    ("markup in comments", b"<html><body><!--" + b"<div>" * 6000 + b"-->"),
    ("table rows", b"<html><body><table>" + b"<tr><td>a<td>b" * 3000 + b"</table>"),
    ("images and breaks", b"<html><body>" + b'<img src="/i.png"><br><input name=a>' * 3000),
])
def test_real_markup_is_not_refused(name, body):
    assert html.too_deep(body, DEPTH) is None, name


def test_a_page_with_few_start_tags_is_not_scanned():
    # 3,000 nested start tags at most: lexbor parses that in tens of ms, so no scan is spent on it.
    assert html.precheck(b"<div>" * 3000, max_tags=100_000, max_depth=DEPTH) == (None, False)
    assert html.precheck(b"<div>" * (html.SCAN_START_TAGS + 1), max_tags=100_000, max_depth=DEPTH) == (None, True)
    # Start tags count, closed or not: 5,000 nested elements closed at the end cost the parser as much.
    assert html.precheck(b"<p>x</p>" * 5000, max_tags=100_000, max_depth=DEPTH) == (None, True)
    assert html.precheck(b"<p>x</p>" * 3000, max_tags=100_000, max_depth=DEPTH) == (None, False)


def test_tag_count_is_bounded_before_parsing():
    body = b"<html><body>" + b'<a href="/x">y</a>' * 60_000
    refused, _ = html.precheck(body, max_tags=100_000, max_depth=DEPTH)
    assert refused == "page too complex: more than 100000 tags"
    assert html.precheck(body, max_tags=200_000, max_depth=DEPTH)[0] is None


def test_the_scan_is_linear_and_what_it_lets_through_parses_fast():
    # The worst a page that passes can do: SCAN_START_TAGS nested elements.
    worst = b"<html><body>" + b"<div>" * html.SCAN_START_TAGS
    started = time.perf_counter()
    LexborHTMLParser(worst.decode())
    assert time.perf_counter() - started < 2.0
    big = b"<html><body>" + b"<div><span>x</span></div>" * 200_000      # 5 MB, 800,000 tags
    started = time.perf_counter()
    assert html.too_deep(big, DEPTH) is None
    assert time.perf_counter() - started < 10.0
