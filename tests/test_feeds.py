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
    from testkit.cluster import write_secret

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

    from crawler.http.getter import Stack
    from crawler.http.transport import build_transport
    from crawler.worker.fetcher import PageFetcher
    from tests.fakes.rangeserver import RangeServer

    inflated = 4 * 1024 * 1024
    body = gzip.compress(deep_sitemap(inflated // 7), 9)
    assert len(body) < 64 * 1024        # a few KiB on the wire
    caplog.set_level("INFO")
    async with RangeServer() as server:
        server.add("/sitemap.xml.gz", body, content_type="application/gzip")
        transport = build_transport(max_connections=4, dns_ttl=60)
        async with httpx.AsyncClient(transport=transport) as client:
            fetched, cut = await PageFetcher(Stack(transport, client)).fetch(server.url("/sitemap.xml.gz"),
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


# -- the real web's dialects: entity errors, xml:base, feed authors, text sitemaps, partial dates ------------

PODCAST_WITH_HTML_ENTITIES = b"""<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd">
<channel>
<title>Caf&eacute; Sessions</title>
<link>http://pod.example.com/</link>
<description>Live music &amp; talk from the caf&eacute;&nbsp;&mdash; every week</description>
<itunes:author>Am&eacute;lie Durand</itunes:author>
<item>
  <title>&Eacute;pisode&nbsp;12 &ndash; Rock & Roll</title>
  <description><![CDATA[<p>Tracks: R&B, soul &nbsp; &copy; the artists</p>]]></description>
  <pubDate>Wed, 06 Mar 2024 18:00:00 GMT</pubDate>
  <enclosure url="http://pod.example.com/media/ep12.mp3?a=1&amp;b=2" length="100" type="audio/mpeg"/>
</item>
<item>
  <title><![CDATA[AT&T &copy; special]]></title>
  <enclosure url="http://pod.example.com/media/ep11.mp3" length="100" type="audio/mpeg"/>
</item>
<item>
  <title>Ep &unknownname; 10 &hellip;</title>
  <enclosure url="http://pod.example.com/media/ep10.mp3" length="100" type="audio/mpeg"/>
</item>
</channel></rss>"""


def test_a_podcast_feed_with_html_entities_and_bare_ampersands_is_read_whole() -> None:
    res = feeds.parse(feeds.RSS, PODCAST_WITH_HTML_ENTITIES, FEED)
    assert res.cut is None
    by_url = {e.url: e.meta for e in res.entries}
    assert list(by_url) == ["http://pod.example.com/media/ep12.mp3?a=1&b=2",
                            "http://pod.example.com/media/ep11.mp3", "http://pod.example.com/media/ep10.mp3"]
    ep12 = by_url["http://pod.example.com/media/ep12.mp3?a=1&b=2"]
    assert (ep12["title"], ep12["artist"], ep12["album"]) == ("Épisode 12 – Rock & Roll", "Amélie Durand",
                                                              "Café Sessions")
    assert ep12["description"] == "Tracks: R&B, soul © the artists"
    # Inside CDATA the text is literal: nothing is rewritten there.
    assert by_url["http://pod.example.com/media/ep11.mp3"]["title"] == "AT&T &copy; special"
    # A name HTML does not know either stays as the text a browser shows.
    assert by_url["http://pod.example.com/media/ep10.mp3"]["title"] == "Ep &unknownname; 10 …"


def test_html_entities_in_a_latin1_feed_and_through_the_resolver() -> None:
    body = PODCAST_WITH_HTML_ENTITIES.replace(b'encoding="UTF-8"', b'encoding="ISO-8859-1"').replace(
        b"<title>Caf&eacute; Sessions</title>", "<title>Café Sessions</title>".encode("latin-1"))
    res = GenericResolver({}).resolve_page(page(body))
    assert [i.album for i in res.items] == ["Café Sessions"] * 3
    assert res.items[0].title == "Épisode 12 – Rock & Roll"


def test_repair_never_turns_an_entity_declaration_into_an_expansion() -> None:
    # The names are HTML's, so the rewrite knows them: the declarations are still refused.
    doc = (b'<?xml version="1.0"?><!DOCTYPE rss [<!ENTITY nbsp "&copy;&copy;&copy;"><!ENTITY eacute SYSTEM '
           b'"file:///etc/hostname">]><rss><channel><item><title>&nbsp;&eacute;</title>'
           b'<enclosure url="http://a.example/x.mp3" type="audio/mpeg"/></item></channel></rss>')
    with pytest.raises(feeds.XmlDocumentError, match="EntitiesForbidden"):
        feeds.parse(feeds.RSS, doc, FEED)


@pytest.mark.parametrize("declared, repaired", [
    (None, True), ("UTF-8", True), ("iso-8859-1", True), ("windows-1252", True), ("GBK", True),
    ("Shift_JIS", True), ("UTF-16", False), ("ISO-2022-JP", False), ("cp037", False), ("no-such", False),
])
def test_only_documents_whose_ampersands_are_ascii_are_rewritten(declared: str | None,
                                                                 repaired: bool) -> None:
    decl = b'<?xml version="1.0"?>' if declared is None else b'<?xml version="1.0" encoding="%s"?>' % (
        declared.encode())
    assert feeds._ascii_compatible(decl + b"<rss/>") is repaired
    assert feeds._ascii_compatible("<rss>&nbsp;</rss>".encode("utf-16")) is False


def test_a_reference_split_across_the_parser_reads_is_rewritten_whole() -> None:
    body = b"<t>R&B &eacute;&nbsp;<![CDATA[&nbsp;]]&gt;]]>&amp;&NotEqualTilde;x]]y&</t>" * 40
    whole = feeds._Prefix(body, len(body), lambda: None).read()
    assert b"&eacute;" not in whole and whole.count(b"<![CDATA[&nbsp;]]&gt;]]>") == 40
    for size in range(49, 140):
        source = feeds._Prefix(body, len(body), lambda: None)
        chunks = iter(lambda: source.read(size), b"")
        assert b"".join(chunks) == whole, size


def test_rewriting_counts_against_the_parse_time_and_keeps_the_items_before(caplog) -> None:
    caplog.set_level("INFO")
    items = b"".join(b'<item><title>E%d</title><enclosure url="/e%d.mp3" type="audio/mpeg"/></item>' % (i, i)
                     for i in range(3))
    body = (b"<rss><channel><title>S</title>" + items + b"<item><title>" + b"&nbsp;" * 20_000
            + b'</title><enclosure url="/late.mp3" type="audio/mpeg"/></item></channel></rss>')
    ticks = iter(range(0, 10**9, 60))     # a minute passes each time the clock is read
    res = feeds.parse(feeds.RSS, body, FEED, clock=lambda: float(next(ticks)))
    assert [e.url for e in res.entries] == [f"http://pod.example.com/e{i}.mp3" for i in range(3)]
    assert res.cut is not None and "more than 10 s" in res.cut
    # Without a clock that jumps, the same document is read to its end.
    assert len(feeds.parse(feeds.RSS, body, FEED).entries) == 4


def test_a_document_of_ampersands_is_rewritten_quickly() -> None:
    body = (b"<rss><channel><title>" + b"&" * (4 * 1024 * 1024)
            + b'</title><item><title>x</title><enclosure url="/a.mp3" type="audio/mpeg"/></item>'
            + b"</channel></rss>")
    started = time.process_time()
    res = feeds.parse(feeds.RSS, body, FEED)
    assert [e.url for e in res.entries] == ["http://pod.example.com/a.mp3"]
    assert time.process_time() - started < 3


ATOM_WITH_BASES = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xml:base="http://cdn.example.net/podcast/">
  <title>Base Show</title>
  <author><name>Nadia Feed</name><email>nadia@example.net</email><uri>http://example.net/</uri></author>
  <entry xml:base="2024/03/">
    <title>Relative to the feed's base</title>
    <link rel="alternate" type="text/html" xml:base="/episodes/" href="ep1.html"/>
    <link rel="enclosure" type="audio/mpeg" length="1000" href="ep1.mp3"/>
  </entry>
  <entry>
    <title>Its own author</title><author><name>Guest Host</name></author>
    <link rel="enclosure" type="audio/mpeg" href="../ep2.mp3" xml:base="https://media.example.org/a/b/"/>
  </entry>
  <entry xml:base="season2/">
    <title>Nested twice</title><author><email>only@example.net</email></author>
    <content type="xhtml" xml:base="extras/"><div xmlns="http://www.w3.org/1999/xhtml">notes</div></content>
    <link rel="enclosure" type="audio/mpeg" href="ep3.mp3"/>
  </entry>
</feed>"""


def test_atom_xml_base_on_feed_entry_and_link_resolves_relative_to_each_other() -> None:
    res = feeds.parse(feeds.ATOM, ATOM_WITH_BASES, "http://pod.example.com/feeds/atom.xml")
    assert [e.url for e in res.entries] == ["http://cdn.example.net/podcast/2024/03/ep1.mp3",
                                            "https://media.example.org/a/ep2.mp3",
                                            "http://cdn.example.net/podcast/season2/ep3.mp3"]
    assert res.links == ["http://cdn.example.net/episodes/ep1.html"]
    assert res.entries[0].page == "http://cdn.example.net/episodes/ep1.html"


def test_a_relative_xml_base_is_relative_to_the_document_url_and_rss_honours_it_too() -> None:
    body = (b'<rss version="2.0" xml:base="shows/"><channel xml:base="weekly/"><title>S</title>'
            b'<item xml:base="2024/"><title>E</title><link>ep.html</link>'
            b'<enclosure url="ep.mp3" type="audio/mpeg"/></item>'
            b'<item><title>F</title><enclosure url="/root.mp3" type="audio/mpeg"/></item></channel></rss>')
    res = feeds.parse(feeds.RSS, body, "http://pod.example.com/feeds/main.xml")
    assert [e.url for e in res.entries] == ["http://pod.example.com/feeds/shows/weekly/2024/ep.mp3",
                                            "http://pod.example.com/root.mp3"]
    assert res.links == ["http://pod.example.com/feeds/shows/weekly/2024/ep.html"]


def test_nested_long_xml_bases_do_not_build_long_strings() -> None:
    step = b"d" * 1000 + b"/"
    body = (b'<feed xmlns="http://www.w3.org/2005/Atom"><entry>' + b'<g xml:base="%s">' % step * 50
            + b'<link rel="enclosure" type="audio/mpeg" href="a.mp3"/>' + b"</g>" * 50 + b"</entry></feed>")
    [entry] = feeds.parse(feeds.ATOM, body, "http://pod.example.com/f.xml").entries
    # The bases stop growing at the length of a URL worth following; the last one that fits is used.
    assert entry.url == "http://pod.example.com/" + ("d" * 1000 + "/") * 2 + "a.mp3"


def test_entries_without_an_author_take_the_feeds() -> None:
    res = feeds.parse(feeds.ATOM, ATOM_WITH_BASES, "http://pod.example.com/feeds/atom.xml")
    assert [e.meta["artist"] for e in res.entries] == ["Nadia Feed", "Guest Host", "Nadia Feed"]
    assert {e.meta["album"] for e in res.entries} == {"Base Show"}


@pytest.mark.parametrize("channel, artist", [
    (b"<managingEditor>editor@pod.example.com (Jo Rivera)</managingEditor>", "Jo Rivera"),
    (b"<managingEditor>Jo Rivera &lt;editor@pod.example.com&gt;</managingEditor>", "Jo Rivera"),
    (b"<itunes:author>The Host</itunes:author><managingEditor>e@pod.example.com (Jo)</managingEditor>",
     "The Host"),
    (b"<managingEditor>editor@pod.example.com</managingEditor>", "Show"),     # an address is no name
    (b"", "Show"),
])
def test_rss_items_take_the_channels_itunes_author_or_managing_editor(channel: bytes, artist: str) -> None:
    body = (b'<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd"><channel>'
            b"<title>Show</title>" + channel
            + b'<item><title>A</title><enclosure url="/a.mp3" type="audio/mpeg"/></item>'
              b'<item><title>B</title><author>guest@pod.example.com (Guest Star)</author>'
              b'<enclosure url="/b.mp3" type="audio/mpeg"/></item></channel></rss>')
    res = feeds.parse(feeds.RSS, body, FEED)
    assert [e.meta["artist"] for e in res.entries] == [artist, "Guest Star"]


TEXT_SITEMAP = (b"\xef\xbb\xbfhttp://site.example/\r\n"
                b"http://site.example/music/caf%C3%A9.html\r\n"
                b"\r\n"
                b"# not a URL\n"
                b"/relative/page.html\n"
                b"mailto:someone@site.example\n"
                b"ftp://site.example/file\n"
                b"  https://site.example/albums?id=7&lang=en  \n"
                b"https://site.example/" + b"x" * 2100 + b"\n"
                b"HTTPS://Site.Example/Upper")


@pytest.mark.parametrize("url, content_type, referrer", [
    ("http://site.example/sitemap.txt", "text/plain", None),
    ("http://site.example/urls", "text/plain", None),
    ("http://site.example/sitemap.txt", "application/octet-stream", None),
    ("http://site.example/sitemap-pages", "application/octet-stream", "http://site.example/robots.txt"),
    ("http://site.example/sitemap-pages", "", "http://site.example/robots.txt"),
])
def test_a_text_sitemap_gives_its_absolute_urls(url: str, content_type: str, referrer: str | None) -> None:
    p = page(TEXT_SITEMAP, url, content_type)
    p.referrer = referrer
    res = GenericResolver({}).resolve_page(p)
    assert res.items == [] and res.links == [
        "http://site.example/", "http://site.example/music/caf%C3%A9.html",
        "https://site.example/albums?id=7&lang=en", "https://site.example/Upper"]


@pytest.mark.parametrize("url, content_type, body", [
    ("http://site.example/sitemap-pages", "application/octet-stream", TEXT_SITEMAP),   # not named, not .txt
    ("http://site.example/notes.txt", "text/plain", b"Read http://site.example/ for more\n"),
    ("http://site.example/sitemap.txt", "text/csv", TEXT_SITEMAP),
])
def test_text_that_is_not_a_sitemap_gives_no_links(url: str, content_type: str, body: bytes) -> None:
    assert GenericResolver({}).resolve_page(page(body, url, content_type)).links == []


def test_a_gzip_text_sitemap_is_read() -> None:
    body = gzip.compress(b"".join(b"https://site.example/p%d\n" % i for i in range(3)))
    url = "http://site.example/sitemap.txt.gz"
    res = GenericResolver({}).resolve_page(page(body, url, "application/gzip"))
    assert res.links == [f"https://site.example/p{i}" for i in range(3)]


def test_a_text_sitemap_is_read_up_to_the_protocols_limits(monkeypatch) -> None:
    lines = b"".join(b"http://site.example/p%d\n" % i for i in range(feeds.MAX_SITEMAP_URLS + 5))
    res = feeds.parse(feeds.TEXT_SITEMAP, lines, "http://site.example/s.txt")
    assert len(res.links) == feeds.MAX_SITEMAP_URLS and res.links[-1] == "http://site.example/p49999"
    assert res.cut == "more than 50000 URLs"
    monkeypatch.setattr(feeds, "MAX_TEXT_SITEMAP_BYTES", 100)
    res = feeds.parse(feeds.TEXT_SITEMAP, lines, "http://site.example/s.txt")
    # The line the byte limit cuts is dropped, not read as a shorter URL.
    assert res.links == [f"http://site.example/p{i}" for i in range(4)] and res.cut == "more than 100 bytes"
    # Lines that are not URLs cost parse time too: the same clock as XML's.
    monkeypatch.undo()
    ticks = iter(range(0, 10**9, 60))
    res = feeds.parse(feeds.TEXT_SITEMAP, b"http://site.example/a\n" + b"junk\n" * 10_000,
                      "http://site.example/s.txt", clock=lambda: float(next(ticks)))
    assert res.links == ["http://site.example/a"] and res.cut == "parsing took more than 10 s"


@pytest.mark.parametrize("lastmod, expected", [
    ("1997", "1997-01-01T00:00:00+00:00"),
    ("1997-07", "1997-07-01T00:00:00+00:00"),
    ("1997-07-16", "1997-07-16T00:00:00+00:00"),
    ("1997-07-16T19:20+01:00", "1997-07-16T18:20:00+00:00"),
    ("1997-07-16T19:20:30+01:00", "1997-07-16T18:20:30+00:00"),
    ("1997-07-16T19:20:30.45+01:00", "1997-07-16T18:20:30.450000+00:00"),
    ("1997-07-16T19:20:30Z", "1997-07-16T19:20:30+00:00"),
    ("1997-07-16T19:20:30", "1997-07-16T19:20:30+00:00"),
])
def test_partial_w3c_dates_in_a_sitemap_are_kept(lastmod: str, expected: str) -> None:
    from datetime import UTC, datetime

    body = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url>'
            b"<loc>http://site.example/a</loc><lastmod>%s</lastmod></url></urlset>" % lastmod.encode())
    res = feeds.parse(feeds.SITEMAP, body, "http://site.example/sitemap.xml")
    assert datetime.fromtimestamp(res.lastmod["http://site.example/a"], UTC).isoformat() == expected


@pytest.mark.parametrize("bad", ["1997-13", "97", "1997-7", "199", "July 1997", ""])
def test_dates_that_are_no_w3c_date_are_still_dropped(bad: str) -> None:
    assert feeds.parse_date(bad) is None


async def test_feeds_and_a_robots_named_text_sitemap_through_a_real_server_and_fetcher() -> None:
    import httpx

    from crawler.http.getter import Stack
    from crawler.http.transport import build_transport
    from crawler.worker.fetcher import PageFetcher
    from tests.fakes.rangeserver import RangeServer

    async with RangeServer() as server:
        server.add("/feeds/podcast.xml", PODCAST_WITH_HTML_ENTITIES, content_type="application/rss+xml")
        # Without the feed's own base its entries' bases are relative to the document's URL.
        atom_here = ATOM_WITH_BASES.replace(b' xml:base="http://cdn.example.net/podcast/"', b"")
        server.add("/feeds/atom.xml", atom_here, content_type="application/atom+xml")
        server.add("/sitemap-pages", server.url("/a.html").encode() + b"\n" + server.url("/b.html").encode()
                   + b"\nnot a url\n", content_type="application/octet-stream")
        transport = build_transport(max_connections=4, dns_ttl=60)
        resolver = GenericResolver({})
        async with httpx.AsyncClient(transport=transport) as client:
            fetcher = PageFetcher(Stack(transport, client))
            fetched, _ = await fetcher.fetch(server.url("/feeds/podcast.xml"), max_bytes=1 << 20)
            podcast = await resolver.resolve(fetched.url, fetched, None)  # type: ignore[arg-type]
            fetched, _ = await fetcher.fetch(server.url("/feeds/atom.xml"), max_bytes=1 << 20)
            atom = await resolver.resolve(fetched.url, fetched, None)  # type: ignore[arg-type]
            fetched, _ = await fetcher.fetch(server.url("/sitemap-pages"), max_bytes=1 << 20,
                                             referrer=server.url("/robots.txt"))
            sitemap = await resolver.resolve(fetched.url, fetched, None)  # type: ignore[arg-type]
    assert len(podcast.items) == 3
    first = podcast.items[0]
    assert (first.title, first.artist) == ("Épisode 12 – Rock & Roll", "Amélie Durand")
    assert [(i.url, i.artist) for i in atom.items] == [
        (server.url("/feeds/2024/03/ep1.mp3"), "Nadia Feed"),
        ("https://media.example.org/a/ep2.mp3", "Guest Host"),
        (server.url("/feeds/season2/ep3.mp3"), "Nadia Feed")]
    assert sitemap.links == [server.url("/a.html"), server.url("/b.html")]


@pytest.mark.timeout(120)
async def test_a_crawl_reads_the_text_sitemap_robots_txt_names_and_the_feeds_it_lists(tmp_path) -> None:
    """Real master and worker processes: robots.txt names a text sitemap served untyped; it lists a page, an
    RSS feed with HTML entities and an Atom feed with xml:base and a feed author."""
    import yaml

    from testkit import cluster
    from tests.fakes.rangeserver import RangeServer

    rss = PODCAST_WITH_HTML_ENTITIES.replace(b"http://pod.example.com/media/", b"/media/")
    atom = ATOM_WITH_BASES.replace(b' xml:base="http://cdn.example.net/podcast/"', b"").replace(
        b"https://media.example.org/a/b/", b"cdn/a/b/")
    html = b"<!doctype html><html><head><title>P</title></head><body><p>page</p></body></html>"
    async with RangeServer(second_host=False) as server:
        server.add("/robots.txt", b"User-agent: *\nAllow: /\nSitemap: %s\n" % server.url("/list").encode(),
                   content_type="text/plain")
        server.add("/list", b"\n".join(server.url(p).encode() for p in ("/a.html", "/feeds/podcast.xml",
                                                                         "/feeds/atom.xml")) + b"\n",
                   content_type="application/octet-stream")
        for path in ("/", "/a.html"):
            server.add(path, html, content_type="text/html")
        server.add("/feeds/podcast.xml", rss, content_type="application/rss+xml")
        server.add("/feeds/atom.xml", atom, content_type="application/atom+xml")
        config = cluster.master_config(tmp_path, [server.url("/")], ["w1"], politeness={"obey_robots": True})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"download_audio": False}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
        try:
            assert await master.wait(90) == 0, master.log()[-3000:]
            assert await worker.wait(30) == 0, worker.log()[-3000:]
        finally:
            await master.stop()
            await worker.stop()
        fetched = {r.path for r in server.log}
    assert {"/robots.txt", "/list", "/a.html", "/feeds/podcast.xml", "/feeds/atom.xml"} <= fetched, fetched
    rows = {r["url"].removeprefix(server.url("")): r for r in cluster.catalogue(tmp_path)}
    assert (rows["/media/ep12.mp3?a=1&b=2"]["title"], rows["/media/ep12.mp3?a=1&b=2"]["artist"]) == (
        "Épisode 12 – Rock & Roll", "Amélie Durand")
    assert {u: rows[u]["artist"] for u in ("/feeds/2024/03/ep1.mp3", "/feeds/cdn/a/ep2.mp3",
                                           "/feeds/season2/ep3.mp3")} == {
        "/feeds/2024/03/ep1.mp3": "Nadia Feed", "/feeds/cdn/a/ep2.mp3": "Guest Host",
        "/feeds/season2/ep3.mp3": "Nadia Feed"}
