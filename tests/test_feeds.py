"""Feeds and sitemaps: items and links from RSS, Atom and sitemap XML, and hostile XML refused cheaply."""

from __future__ import annotations

import gzip
import time

import pytest

from crawler.resolvers import feeds
from crawler.resolvers.generic import GenericResolver
from crawler.web.page import FetchedPage

FEED = "http://pod.example.com/feed.xml"

RSS = b"""<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd"
     xmlns:media="http://search.yahoo.com/mrss/" xmlns:dc="http://purl.org/dc/elements/1.1/">
<channel><title>Show Name</title><itunes:author>Host Person</itunes:author>
<item><title>Ep 1</title><link>http://pod.example.com/ep/1</link>
  <description>&lt;p&gt;Hello &amp;amp; welcome&lt;/p&gt;</description>
  <pubDate>Tue, 05 Mar 2024 10:00:00 GMT</pubDate><itunes:duration>01:02:03</itunes:duration>
  <enclosure url="/media/ep1.mp3" length="1" type="audio/mpeg"/></item>
<item><title>Ep 2</title><dc:creator>Guest</dc:creator><media:content url="http://cdn.example.com/ep2.m4a" type="audio/mp4"/>
  <itunes:duration>1800</itunes:duration></item>
<item><title>Video ep</title><enclosure url="/v.mp4" type="video/mp4"/></item>
<item><title>Linked</title><link>http://pod.example.com/ep3.ogg</link></item>
</channel></rss>"""

ATOM = b"""<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">
<title>Atom Show</title>
<entry><title>A1</title><author><name>Writer</name></author><published>2024-04-02T08:30:00Z</published>
<summary>Short</summary><link href="http://pod.example.com/a1.html"/>
<link rel="enclosure" type="audio/mpeg" href="http://pod.example.com/a1.mp3"/></entry></feed>"""


def page(body: bytes, url: str = FEED, content_type: str = "application/rss+xml") -> FetchedPage:
    return FetchedPage(url=url, final_url=url, status=200, content_type=content_type,
                       headers={"content-type": content_type}, body=body)


def test_rss_enclosures_media_content_and_audio_links_are_items_with_the_episode_metadata() -> None:
    res = GenericResolver({}).resolve_page(page(RSS))
    by_url = {i.url: i for i in res.items}
    assert list(by_url) == ["http://pod.example.com/media/ep1.mp3", "http://cdn.example.com/ep2.m4a",
                            "http://pod.example.com/ep3.ogg"]
    ep1 = by_url["http://pod.example.com/media/ep1.mp3"]
    assert (ep1.title, ep1.artist, ep1.album, ep1.description) == ("Ep 1", "Host Person", "Show Name",
                                                                  "Hello & welcome")
    assert ep1.duration == 3723 and ep1.published == "2024-03-05T10:00:00+00:00" and ep1.page == FEED
    assert ep1.meta_source["title"] == "feed" and ep1.extra["episode_page"] == "http://pod.example.com/ep/1"
    ep2 = by_url["http://cdn.example.com/ep2.m4a"]
    assert (ep2.artist, ep2.duration) == ("Guest", 1800)
    assert "http://pod.example.com/ep/1" in res.links


def test_atom_enclosure_links() -> None:
    res = GenericResolver({}).resolve_page(page(ATOM, content_type="application/atom+xml"))
    [item] = res.items
    assert (item.url, item.title, item.artist, item.album, item.published, item.description) == (
        "http://pod.example.com/a1.mp3", "A1", "Writer", "Atom Show", "2024-04-02T08:30:00+00:00", "Short")
    assert res.links == ["http://pod.example.com/a1.html"]


SITEMAP = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>http://site.example/a.html</loc><lastmod>2024-01-02</lastmod></url>
<url><loc>http://site.example/b.html</loc></url></urlset>"""
INDEX = b"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<sitemap><loc>http://site.example/s1.xml.gz</loc><lastmod>2024-02-03T04:05:06+00:00</lastmod></sitemap>
</sitemapindex>"""


@pytest.mark.parametrize("content_type", ["application/xml", "text/xml", "application/octet-stream", ""])
def test_sitemaps_give_links_with_lastmod(content_type: str) -> None:
    res = GenericResolver({}).resolve_page(page(SITEMAP, "http://site.example/sitemap.xml", content_type))
    assert res.items == [] and res.links == ["http://site.example/a.html", "http://site.example/b.html"]
    assert res.lastmod == {"http://site.example/a.html": 1704153600.0}


@pytest.mark.parametrize("content_type", ["application/gzip", "application/x-gzip", "application/octet-stream"])
def test_a_gzip_sitemap_index_lists_sitemaps(content_type: str) -> None:
    res = GenericResolver({}).resolve_page(page(gzip.compress(INDEX), "http://site.example/index.xml.gz",
                                                content_type))
    assert res.links == ["http://site.example/s1.xml.gz"]
    assert res.lastmod["http://site.example/s1.xml.gz"] == 1706933106.0


def test_gzip_bomb_is_cut_at_the_bound_without_inflating_it() -> None:
    bomb = gzip.compress(b"<urlset>" + b" " * (64 * 1024 * 1024))
    started = time.process_time()
    res = GenericResolver({"max_xml_bytes": 1024 * 1024}).resolve_page(
        page(bomb, "http://site.example/s.xml.gz", "application/gzip"))
    assert res.links == [] and res.items == []
    assert time.process_time() - started < 2
    with pytest.raises(feeds.XmlDocumentError, match="more than"):
        feeds.gunzip(bomb, 1024 * 1024)


@pytest.mark.parametrize("doc", [
    # billion laughs
    (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;">'
    b'<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]><rss><channel><title>&lol3;</title>'
    b'<item><title>&lol3;</title><enclosure url="/a.mp3"/></item></channel></rss>'),
    # XXE: an external entity naming a local file
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><rss><channel>'
    b'<item><title>&x;</title><enclosure url="/a.mp3"/></item></channel></rss>'),
    # malformed
    b"<rss><channel><item><title>never closed",
])
def test_hostile_or_broken_xml_yields_nothing(doc: bytes) -> None:
    res = GenericResolver({}).resolve_page(page(doc))
    assert res.items == [] and res.links == []


def test_html_that_mentions_a_feed_is_still_html() -> None:
    html = b"<!doctype html><html><body><p>&lt;rss&gt; <a href='/x.mp3'>x</a></p></body></html>"
    res = GenericResolver({}).resolve_page(page(html, content_type="text/html"))
    assert [i.url for i in res.items] == ["http://pod.example.com/x.mp3"]


async def test_a_big_feed_is_parsed_off_the_event_loop() -> None:
    items = b"".join(b'<item><title>E%d</title><enclosure url="/e%d.mp3" type="audio/mpeg"/></item>' % (i, i)
                     for i in range(4000))
    body = b"<rss><channel><title>Big</title>" + items + b"</channel></rss>"
    assert len(body) > 256 * 1024
    res = await GenericResolver({}).resolve(FEED, page(body), None)  # type: ignore[arg-type]
    assert len(res.items) == 1000   # max_items per page


def test_links_follow_feeds_announced_by_link_alternate() -> None:
    from selectolax.lexbor import LexborHTMLParser

    from crawler.web.links import extract_links
    tree = LexborHTMLParser('<head><link rel="alternate" type="application/rss+xml" href="/feed.xml">'
                            '<link rel="alternate" hreflang="de" href="/de/"><link rel="stylesheet" href="/s.css">'
                            "</head>")
    assert extract_links(tree, "http://site.example/") == ["http://site.example/feed.xml"]


async def test_a_gzip_sitemap_is_inflated_off_the_event_loop() -> None:
    import asyncio
    import threading

    urls = b"".join(b"<url><loc>http://site.example/p%d.html</loc></url>" % i for i in range(20000))
    body = gzip.compress(b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + urls + b"</urlset>")
    seen: list[str] = []
    resolver = GenericResolver({})
    original = resolver._xml

    def spy(*args):
        seen.append(threading.current_thread().name)
        return original(*args)

    resolver._xml = spy  # type: ignore[method-assign]
    res = await resolver.resolve("http://site.example/s.xml.gz", page(body, "http://site.example/s.xml.gz",
                                                                      "application/gzip"), None)  # type: ignore[arg-type]
    assert len(res.links) == 20000 and seen and seen[0] != threading.main_thread().name
    assert asyncio.get_running_loop() is not None


def test_an_rss_091_doctype_naming_an_external_dtd_is_read_without_fetching_it() -> None:
    body = (b'<?xml version="1.0"?><!DOCTYPE rss PUBLIC "-//Netscape Communications//DTD RSS 0.91//EN" '
            b'"http://my.netscape.com/publish/formats/rss-0.91.dtd"><rss version="0.91"><channel><title>S</title>'
            b'<item><title>E &amp; F</title><enclosure url="http://a.example/x.mp3" type="audio/mpeg"/></item>'
            b"</channel></rss>")
    [item] = GenericResolver({}).resolve_page(page(body, content_type="text/xml")).items
    assert (item.url, item.title, item.album) == ("http://a.example/x.mp3", "E & F", "S")


def test_a_sitemap_read_again_reports_every_date_though_its_links_were_reported_before(tmp_path) -> None:
    from crawler.worker.config import WorkerConfig
    from crawler.worker.server import Worker
    from scripts.cluster import write_secret

    cfg = WorkerConfig.build(None, {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path),
                                    "secret_file": str(write_secret(tmp_path / "s"))})
    worker = Worker(cfg)
    res = GenericResolver({}).resolve_page(page(SITEMAP, "http://site.example/sitemap.xml", "application/xml"))
    assert worker._links_to_report(res.links, [], 1) == res.links
    assert worker._links_to_report(res.links, [], 1) == []          # the second time the link cache holds them
    assert worker._lastmod_of(res.lastmod) == (("http://site.example/a.html", 1704153600.0),)


# -- hostile XML: read incrementally, under caps ---------------------------------------------------------


def deep_sitemap(depth: int, urls: int = 3) -> bytes:
    """A sitemap whose first records are real, then elements nested ``depth`` deep: a few KiB gzipped."""
    head = b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
    head += b"".join(b"<url><loc>http://site.example/p%d.html</loc></url>" % i for i in range(urls))
    return head + b"<url>" + b"<x>" * depth + b"</x>" * depth + b"</url></urlset>"


async def test_a_deep_gzip_sitemap_from_a_server_costs_little_memory_and_keeps_what_came_before(caplog) -> None:
    import tracemalloc

    import httpx

    from crawler.worker.fetcher import PageFetcher, build_transport
    from tests.fakes.rangeserver import RangeServer

    inflated = 4 * 1024 * 1024
    body = gzip.compress(deep_sitemap(inflated // 7), 9)
    assert len(body) < 64 * 1024        # a few KiB on the wire
    caplog.set_level("INFO")
    async with RangeServer() as server:
        server.add("/sitemap.xml.gz", body, content_type="application/gzip")
        transport = build_transport(max_connections=4, dns_ttl=60)
        async with httpx.AsyncClient(transport=transport) as client:
            fetched, cut = await PageFetcher(transport, client).fetch(server.url("/sitemap.xml.gz"),
                                                                      max_bytes=5 * 1024 * 1024)
            assert not cut and fetched.body == body
            tracemalloc.start()
            try:
                started = time.monotonic()
                res = await GenericResolver({"max_xml_bytes": 2 * inflated}).resolve(
                    fetched.url, fetched, None)  # type: ignore[arg-type]
                elapsed = time.monotonic() - started
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    # The inflated document itself (4 MiB) and little besides: no tree of half a million elements.
    assert peak < inflated + 8 * 1024 * 1024, peak
    assert elapsed < 5
    assert res.links == [f"http://site.example/p{i}.html" for i in range(3)]
    lines = [r.getMessage() for r in caplog.records if "read in part" in r.getMessage()]
    assert len(lines) == 1 and f"nested deeper than {feeds.MAX_XML_DEPTH}" in lines[0], lines


def test_each_cap_cuts_the_document_after_the_records_read_before_it(caplog, monkeypatch) -> None:
    caplog.set_level("INFO")
    url = "http://site.example/s.xml"
    monkeypatch.setattr(feeds, "MAX_XML_ELEMENTS", 100_000)     # the default's million takes seconds to reach
    # Elements in all: a million empty siblings after the first records.
    wide = deep_sitemap(0, urls=2)[:-len(b"<url></url></urlset>")] + b"<x/>" * (feeds.MAX_XML_ELEMENTS + 10) \
        + b"</urlset>"
    res = feeds.parse(feeds.SITEMAP, wide, url)
    assert len(res.links) == 2 and res.cut == f"more than {feeds.MAX_XML_ELEMENTS} elements"
    # One record too big to hold.
    big = deep_sitemap(0, urls=2)[:-len(b"</url></urlset>")] + b"<x/>" * (feeds.MAX_RECORD_ELEMENTS + 1) \
        + b"</url></urlset>"
    res = feeds.parse(feeds.SITEMAP, big, url)
    assert len(res.links) == 2 and res.cut is not None and "record" in res.cut
    # Parse time, through a clock that jumps a minute each time it is read.
    ticks = iter(range(0, 10**9, 60))
    many = deep_sitemap(0, urls=20_000)
    res = feeds.parse(feeds.SITEMAP, many, url, clock=lambda: float(next(ticks)))
    assert 0 < len(res.links) < 20_000 and res.cut is not None and "more than 10 s" in res.cut
    # A document cut off in the middle (a page cut at its size cap) keeps its whole records.
    res = feeds.parse(feeds.SITEMAP, many[:len(many) // 2], url)
    assert 5_000 < len(res.links) < 20_000 and res.cut is not None and "not readable XML" in res.cut
    # One element with more attributes than the cap ('>' in their values does not end the tag).
    attrs = b"".join(b'a%d=">" ' % i for i in range(feeds.MAX_XML_ATTRIBUTES + 1))
    res = feeds.parse(feeds.SITEMAP, deep_sitemap(0, urls=2)[:-len(b"<url></url></urlset>")] + b"<url " + attrs
                      + b"/></urlset>", url)
    assert len(res.links) == 2 and res.cut == f"an element with more than {feeds.MAX_XML_ATTRIBUTES} attributes"
    assert len([r for r in caplog.records if "read in part" in r.getMessage()]) == 5


def test_the_show_named_after_the_items_still_names_them() -> None:
    body = (b'<rss><channel><item><title>E1</title><enclosure url="/e1.mp3" type="audio/mpeg"/></item>'
            b"<title>Late Show</title><image><title>not the show</title></image></channel></rss>")
    [entry] = feeds.parse(feeds.RSS, body, FEED).entries
    assert (entry.meta["title"], entry.meta["artist"], entry.meta["album"]) == ("E1", "Late Show", "Late Show")


@pytest.mark.parametrize("doc, refused", [
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
     b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>'
     b"<urlset><url><loc>http://x.example/&d;</loc></url></urlset>", "EntitiesForbidden"),
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/hostname">]>'
     b"<urlset><url><loc>http://x.example/&x;</loc></url></urlset>", "EntitiesForbidden"),
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY % p SYSTEM "http://127.0.0.1:9/evil.dtd"> %p;]>'
     b"<urlset><url><loc>http://x.example/a</loc></url></urlset>", "EntitiesForbidden"),
])
def test_entity_expansion_and_external_entities_are_refused_by_the_incremental_parser(doc: bytes,
                                                                                     refused: str) -> None:
    with pytest.raises(feeds.XmlDocumentError, match=refused):
        feeds.parse(feeds.SITEMAP, doc, "http://x.example/s.xml")
