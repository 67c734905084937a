"""The generic sniffer on hand-written pages and responses, plus the resolver framework around it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawler.http.getter import ClientGetter
from crawler.items import AudioItem, LinkMeta, RequestIdentity
from crawler.resolvers import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    load_resolvers,
    parse_section,
    pick,
    registry,
)
from crawler.resolvers.generic import GenericResolver
from crawler.resolvers.jsdata import LiteralError, parse_literal, strings_with_context
from crawler.web.media import read_tags, sniff_audio, url_extension
from crawler.web.page import FetchedPage

PAGE = "http://music.example.com/artists/page.html"


def html_page(body: str, url: str = PAGE, head: str = "") -> FetchedPage:
    doc = f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>"
    return FetchedPage(url=url, final_url=url, status=200, content_type="text/html",
                       headers={"content-type": "text/html; charset=utf-8"}, body=doc.encode())


def response(body: bytes, content_type: str = "", url: str = "http://cdn.example.com/get/123",
             referrer: str | None = PAGE) -> FetchedPage:
    return FetchedPage(url=url, final_url=url, status=200, content_type=content_type,
                       headers={"content-type": content_type} if content_type else {}, body=body,
                       referrer=referrer)


def resolve(page: FetchedPage, **config: Any) -> Resolution:
    return GenericResolver(config).resolve_page(page)


def urls(page: FetchedPage) -> list[str]:
    return [item.url for item in resolve(page).items]


def only(page: FetchedPage) -> AudioItem:
    items = resolve(page).items
    assert len(items) == 1, items
    return items[0]


# --- where audio is referenced -----------------------------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    ('<a href="/music/Track.MP3?token=abc&amp;t=1">x</a>', "http://music.example.com/music/Track.MP3?token=abc&t=1"),
    ('<a href="song.wma">x</a>', "http://music.example.com/artists/song.wma"),
    ('<area href="../a.wav" shape="rect">', "http://music.example.com/a.wav"),
    ('<audio src="//cdn.example.net/b.ogg" controls></audio>', "http://cdn.example.net/b.ogg"),
    ('<audio controls><source src="/stream?id=7" type="audio/mpeg"></audio>', "http://music.example.com/stream?id=7"),
    ('<audio><source src="/s/8"></audio>', "http://music.example.com/s/8"),
    ('<a href="/get?id=9" type="audio/flac">x</a>', "http://music.example.com/get?id=9"),
    ('<embed src="c.m4a" width="300">', "http://music.example.com/artists/c.m4a"),
    ('<embed src="/player.swf" flashvars="file=/d.flac&amp;autostart=0">', "http://music.example.com/d.flac"),
    ('<object data="e.aac" type="audio/aac"></object>', "http://music.example.com/artists/e.aac"),
    ('<object data="/p.swf"><param name="movie" value="f.ape"></object>', "http://music.example.com/artists/f.ape"),
    ('<object data="/p.swf"><param name="FlashVars" value="mp3=https://x.org/g.mp3"></object>',
     "https://x.org/g.mp3"),
    ('<li data-src="h.opus">x</li>', "http://music.example.com/artists/h.opus"),
    ('<button data-url="https://x.org/i.mp3?sig=1#t=3">play</button>', "https://x.org/i.mp3?sig=1"),
    ('<div data-player-file="/media/j.m4a"></div>', "http://music.example.com/media/j.m4a"),
    ('<div data-song=\'{"file": "k.mp3", "title": "K"}\'></div>', "http://music.example.com/artists/k.mp3"),
])
def test_finds_audio_in_elements_and_attributes(body: str, expected: str) -> None:
    assert urls(html_page(body)) == [expected]


@pytest.mark.parametrize("script, expected", [
    ('var a = "https://cdn.example.net/x/one.mp3";', "https://cdn.example.net/x/one.mp3"),
    ("player.load('//cdn.example.net/two.m4a?e=1')", "http://cdn.example.net/two.m4a?e=1"),
    ('var list = [{"src": "\\/media\\/three.flac"}];', "http://music.example.com/media/three.flac"),
    ("const t = `../four.ogg`;", "http://music.example.com/four.ogg"),
    ('play("five.wav")', "http://music.example.com/artists/five.wav"),
    ("el.innerHTML = '<audio src=\"https://x.org/six.mp3\"></audio>';", "https://x.org/six.mp3"),
    ('var u = "https:\\u002F\\u002Fx.org\\u002Fseven.aac";', "https://x.org/seven.aac"),
])
def test_finds_audio_urls_inside_inline_scripts(script: str, expected: str) -> None:
    assert urls(html_page(f"<script>{script}</script>")) == [expected]


def test_finds_audio_in_json_blocks() -> None:
    body = ('<script type="application/json" id="data">{"page": {"tracks": ['
            '{"name": "One", "singer": "S1", "src": "/a/1.mp3"}, {"title": "Two", "url": "//c.example/2.ogg"}]}}'
            "</script>")
    items = resolve(html_page(body)).items
    assert [(i.url, i.title, i.artist) for i in items] == [
        ("http://music.example.com/a/1.mp3", "One", "S1"), ("http://c.example/2.ogg", "Two", None)]
    assert {i.extra["found_in"] for i in items} == {"json"}


def test_json_ld_audio_object_takes_its_recording_metadata() -> None:
    block = ('{"@context": "https://schema.org", "@type": "MusicAlbum", "name": "The Album", "track": ['
             '{"@type": "MusicRecording", "name": "T1", "byArtist": {"@type": "MusicGroup", "name": "Band"},'
             ' "audio": {"@type": "AudioObject", "contentUrl": "/t1.mp3"}},'
             '{"@type": "MusicRecording", "name": "T2", "audio": {"contentUrl": "/t2.mp3"}}]}')
    items = resolve(html_page(f'<script type="application/ld+json">{block}</script>')).items
    assert [(i.url.rsplit("/", 1)[1], i.title) for i in items] == [("t1.mp3", "T1"), ("t2.mp3", "T2")]
    assert items[0].artist == "Band"


def test_og_audio_meta_and_audio_link_elements() -> None:
    head = ('<meta property="og:audio" content="https://x.org/og.mp3">'
            '<link rel="enclosure" type="audio/mpeg" href="/podcast/ep1">')
    assert urls(html_page("", head=head)) == ["https://x.org/og.mp3", "http://music.example.com/podcast/ep1"]


def test_base_href_is_honoured() -> None:
    page = html_page('<a href="a.mp3">a</a><script>var u = "b.mp3";</script>',
                     head='<base href="https://static.example.org/media/">')
    assert urls(page) == ["https://static.example.org/media/a.mp3", "https://static.example.org/media/b.mp3"]


def test_one_item_per_distinct_url_with_merged_metadata() -> None:
    body = ('<a href="/a.mp3">a</a><a href="/a.mp3#again" data-artist="Later">b</a>'
            '<audio src="http://music.example.com/a.mp3" data-title="T"></audio>')
    item = only(html_page(body))
    assert (item.url, item.artist, item.title) == ("http://music.example.com/a.mp3", "Later", "T")


def test_items_carry_page_and_resolver_name() -> None:
    item = only(html_page('<a href="/a.mp3">a</a>'))
    assert item.page == PAGE and item.resolver == "generic" and item.status == "ok"


def test_playlist_references_become_links_to_crawl() -> None:
    body = ('<a href="/lists/top.m3u">top</a><audio src="/radio.pls"></audio>'
            '<script>var p = "//cdn.example.net/all.m3u8";</script>')
    result = resolve(html_page(body))
    assert result.items == []
    assert result.links == ["http://music.example.com/lists/top.m3u", "http://music.example.com/radio.pls",
                            "http://cdn.example.net/all.m3u8"]


def test_max_items_caps_a_page() -> None:
    body = "".join(f'<a href="/{i}.mp3">x</a>' for i in range(50))
    assert len(resolve(html_page(body), max_items=10).items) == 10


def test_scripts_can_be_left_alone() -> None:
    assert urls(html_page('<script>var u = "/a.mp3";</script>', ), ) == ["http://music.example.com/a.mp3"]
    assert resolve(html_page('<script>var u = "/a.mp3";</script>'), scan_scripts=False).items == []


# --- pages without audio ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    '<img src="/cover.jpg"><img src="/song.mp3.png" alt="song.mp3"><a href="/pic.gif">pic</a>',
    '<video src="/clip.mp4"></video><a href="/film.mp4">film</a><a href="/movie.webm">m</a>',
    '<video controls><source src="/clip.ogg"><source src="/clip.mp4" type="video/mp4"></video>',
    "<p>Convert your files to .mp3 or .FLAC! Our song.mp3 tool handles it.</p>",
    "<p>Download <b>track.mp3</b></p><pre>https://example.com/not-linked.mp3</pre>",
    ('<script>alert("Saved as .mp3"); var fmt = ".mp3"; var msg = "converting a.mp3 to b.ogg failed";'
     ' var glob = "*.mp3"; var tip = "Download from /music/a.mp3"; // see https://example.com/x.mp3 </script>'),
    '<div data-title="summer.mp3" data-description="the .mp3 release"></div>',
    '<a href="/download.php?file=song.mp3">get</a><a href="mailto:me@example.com?subject=a.mp3">m</a>',
    '<a href="javascript:play(\'a.mp3\')">p</a><a href="data:audio/mpeg;base64,AAAA">d</a>',
    '<script type="text/template"><audio src="/tpl.mp3"></audio></script>',
    '<script type="application/json">{"note": "we accept .mp3", "ok": true}</script>',
])
def test_nothing_on_pages_without_audio(body: str) -> None:
    result = resolve(html_page(body, head="<title>Music news</title>"))
    assert result.items == []


# --- metadata convention ---------------------------------------------------------------------------

def test_element_own_data_attributes_come_first() -> None:
    body = ('<div data-title="Outer" data-artist="OuterArtist" data-album="OuterAlbum">'
            '<a href="/a.mp3" data-title="Own" data-artist="OwnArtist" title="ignored">a</a></div>')
    item = only(html_page(body, head="<title>Page</title>"))
    assert (item.title, item.artist, item.album) == ("Own", "OwnArtist", "OuterAlbum")


def test_title_attribute_and_nearest_ancestor() -> None:
    body = ('<section data-artist="Far" data-album="Album"><ul data-artist="Near"><li>'
            '<a href="/a.mp3" title="From title attr">a</a></li></ul></section>')
    item = only(html_page(body))
    assert (item.title, item.artist, item.album) == ("From title attr", "Near", "Album")


def test_microdata_music_recording() -> None:
    body = ('<div itemscope itemtype="https://schema.org/MusicRecording">'
            '<span itemprop="name">Micro Song</span>'
            '<span itemprop="byArtist" itemscope itemtype="https://schema.org/MusicGroup">'
            '<span itemprop="name">Micro Band</span></span>'
            '<meta itemprop="duration" content="PT3M20S">'
            '<audio src="/m.mp3"></audio></div>')
    item = only(html_page(body, head="<title>Page</title>"))
    assert (item.title, item.artist, item.duration) == ("Micro Song", "Micro Band", 200.0)


def test_page_level_json_ld_then_meta_then_title() -> None:
    ld = ('<script type="application/ld+json">{"@type": "MusicRecording", "name": "LD Song",'
          ' "byArtist": "LD Artist", "inAlbum": {"name": "LD Album"}}</script>')
    head = (ld + '<meta property="og:title" content="OG Title"><meta name="artist" content="Meta Artist">'
            "<title>Page Title</title>")
    item = only(html_page('<a href="/a.mp3">a</a>', head=head))
    assert (item.title, item.artist, item.album) == ("LD Song", "LD Artist", "LD Album")

    head = ('<meta property="og:title" content="OG Title"><meta property="music:musician" content="Musician">'
            '<meta name="artist" content="Meta Artist"><title>Page Title</title>')
    item = only(html_page('<a href="/a.mp3">a</a>', head=head))
    assert (item.title, item.artist, item.album) == ("OG Title", "Musician", None)

    head = '<meta name="artist" content="Meta Artist"><title> Page\n  Title </title>'
    item = only(html_page('<a href="/a.mp3">a</a>', head=head))
    assert (item.title, item.artist) == ("Page Title", "Meta Artist")


def test_script_object_sibling_keys_then_page_level() -> None:
    script = ("var songs = [{song_name: 'Song A', author_name: 'Singer A', url: '/a.mp3'},"
              " {file: '/b.mp3'}, {'title': 'C', 'album': 'Album C', 'nested': {'src': '/c.mp3'}}];")
    items = resolve(html_page(f"<script>{script}</script>", head="<title>The Page</title>")).items
    assert [(i.url.rsplit("/", 1)[1], i.title, i.artist, i.album) for i in items] == [
        ("a.mp3", "Song A", "Singer A", None), ("b.mp3", "The Page", None, None),
        ("c.mp3", "The Page", None, None)]


def test_data_attribute_json_takes_its_own_keys() -> None:
    item = only(html_page('<div data-artist="Outer"><i data-track=\'{"src": "/k.mp3", "name": "K"}\'></i></div>'))
    assert (item.title, item.artist) == ("K", "Outer")


# --- responses that are audio -----------------------------------------------------------------------

def id3v2(version: int, frames: list[tuple[str, int, bytes]]) -> bytes:
    out = b""
    for frame_id, encoding, text in frames:
        data = bytes([encoding]) + text
        size = len(data)
        if version == 4:
            size_bytes = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
        else:
            size_bytes = size.to_bytes(4, "big")
        out += frame_id.encode() + size_bytes + b"\x00\x00" + data
    out += bytes(32)  # padding
    n = len(out)
    header = b"ID3" + bytes([version, 0, 0]) + bytes([(n >> 21) & 0x7F, (n >> 14) & 0x7F, (n >> 7) & 0x7F, n & 0x7F])
    return header + out + MPEG_FRAME


MPEG_FRAME = b"\xff\xfb\x90\x64" + bytes(413)
FLAC = (b"fLaC" + b"\x00\x00\x00\x22" + bytes(10) + (44100 << 4 | 1).to_bytes(3, "big")
        + (0x10 << 32 | 44100 * 30).to_bytes(5, "big") + bytes(16)
        + b"\x84" + (4 + 6 + 4 + 4 + 13 + 4 + 12).to_bytes(3, "big") + (6).to_bytes(4, "little") + b"vendor"
        + (2).to_bytes(4, "little") + (13).to_bytes(4, "little") + b"TITLE=Flac TT"
        + (12).to_bytes(4, "little") + b"ARTIST=Flaco")
WAV = b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little") + bytes(20)
OGG_VORBIS = b"OggS\x00\x02" + bytes(20) + b"\x01\x1e\x01vorbis" + bytes(30)
OGG_THEORA = b"OggS\x00\x02" + bytes(20) + b"\x01\x2a\x80theora" + bytes(30)
ASF = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
ASF_AUDIO = ASF + bytes(40) + bytes.fromhex("409e69f84d5bcf11a8fd00805f5c442b") + bytes(20)
ASF_VIDEO = ASF + bytes(40) + bytes.fromhex("c0ef19bc4d5bcf11a8fd00805f5c442b") + bytes(20)
M4A = (0x20).to_bytes(4, "big") + b"ftypM4A " + bytes(4) + b"M4A mp42isom" + bytes(4) + bytes(40)
MP4_ISOM_AUDIO = ((0x18).to_bytes(4, "big") + b"ftypisom" + bytes(4) + b"isommp42"
                  + (41).to_bytes(4, "big") + b"moov" + b"hdlr" + bytes(8) + b"soun" + bytes(20))
MP4_VIDEO = ((0x18).to_bytes(4, "big") + b"ftypisom" + bytes(4) + b"isommp42" + b"moov"
             + b"hdlr" + bytes(8) + b"vide" + b"hdlr" + bytes(8) + b"soun")
ADTS = b"\xff\xf1\x50\x80\x02\x1f\xfc" + bytes(40)


@pytest.mark.parametrize("body, fmt", [
    (id3v2(3, [("TIT2", 0, b"x")]), "mp3"), (MPEG_FRAME * 2, "mp3"), (FLAC, "flac"), (WAV, "wav"),
    (OGG_VORBIS, "ogg"), (ASF_AUDIO, "wma"), (M4A, "m4a"), (MP4_ISOM_AUDIO, "m4a"), (ADTS, "aac"),
])
def test_extensionless_responses_are_sniffed_by_their_first_bytes(body: bytes, fmt: str) -> None:
    item = only(response(body, "application/octet-stream"))
    assert item.url == "http://cdn.example.com/get/123" and item.page == PAGE
    assert item.extra["format"] == fmt
    assert sniff_audio(body) == fmt


@pytest.mark.parametrize("body", [
    OGG_THEORA, ASF_VIDEO, MP4_VIDEO, (0x18).to_bytes(4, "big") + b"ftypisom" + bytes(40),
    b"\x89PNG\r\n\x1a\n" + bytes(40), b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(40), b"GIF89a" + bytes(40),
    b"%PDF-1.7\n" + bytes(40), b"PK\x03\x04" + bytes(40), b"ID3", b"",
    b"\xff\xfb\xf0\x64" + bytes(40),   # frame sync with the reserved bitrate index 15
    b"\xff\xef\x90\x64" + bytes(40),   # MPEG version "reserved"
    b"Just some text about .mp3 files\n",
])
def test_non_audio_bytes_are_not_items(body: bytes) -> None:
    assert resolve(response(body, "application/octet-stream")).items == []
    assert resolve(response(body, "")).items == []


@pytest.mark.parametrize("content_type, url", [
    ("audio/mpeg", "http://cdn.example.com/get/1"),
    ("audio/mp4", "http://cdn.example.com/v/clip.mp4"),
    ("audio/x-ms-wma", "http://cdn.example.com/a.wma"),
    ("application/ogg", "http://cdn.example.com/stream"),
])
def test_audio_content_type_makes_an_item_whatever_the_bytes(content_type: str, url: str) -> None:
    item = only(response(b"\x00" * 100, content_type, url=url))
    assert item.url == url


def test_video_content_type_is_not_audio() -> None:
    assert resolve(response(bytes(100), "video/mp4", url="http://cdn.example.com/v/clip.mp4")).items == []
    assert resolve(response(MP4_VIDEO, "video/mp4", url="http://cdn.example.com/v/clip.mp4")).items == []


def test_sniffed_response_without_referrer_is_its_own_page() -> None:
    item = only(response(MPEG_FRAME, "", referrer=None))
    assert item.page == item.url


@pytest.mark.parametrize("version, encoding, encode", [
    (3, 0, lambda s: s.encode("latin-1")),
    (3, 1, lambda s: s.encode("utf-16")),
    (4, 1, lambda s: s.encode("utf-16")),
    (4, 2, lambda s: s.encode("utf-16-be")),
    (4, 3, lambda s: s.encode("utf-8") + b"\x00"),
])
def test_id3v2_text_frames_give_the_metadata(version: int, encoding: int, encode: Any) -> None:
    title = "Café" if encoding == 0 else "晴天 Café"
    body = id3v2(version, [("TIT2", encoding, encode(title)), ("TPE1", encoding, encode("Artist")),
                           ("TALB", encoding, encode("Album")), ("TLEN", 0, b"215000")])
    item = only(response(body, "audio/mpeg"))
    assert (item.title, item.artist, item.album, item.duration) == (title, "Artist", "Album", 215.0)


def test_flac_vorbis_comments_and_duration() -> None:
    assert read_tags(FLAC) == {"title": "Flac TT", "artist": "Flaco", "duration": 30.0}


@pytest.mark.parametrize("body", [
    b"ID3\x03\x00\x00\x7f\x7f\x7f\x7f" + b"TIT2\xff\xff\xff\xff\x00\x00\x01",
    b"ID3\x04\x00\x40\x00\x00\x00\x20" + b"\xff" * 40,
    b"fLaC\x84\xff\xff\xff" + bytes(10),
])
def test_truncated_or_garbage_tags_do_not_raise(body: bytes) -> None:
    assert isinstance(read_tags(body), dict)


def test_absurd_tag_and_attribute_values_are_dropped() -> None:
    body = id3v2(3, [("TIT2", 0, b"ok"), ("TLEN", 0, b"9" * 5000)])
    assert only(response(body, "audio/mpeg")).duration is None
    item = only(html_page('<a href="/a.mp3" data-duration="1e999" data-bitrate="%s">a</a>' % ("9" * 5000)))
    assert (item.duration, item.bitrate) == (None, None)
    item = only(html_page('<a href="/a.mp3" data-duration="3:25" data-bitrate="320kbps">a</a>'))
    assert (item.duration, item.bitrate) == (205.0, 320)


def test_playlist_url_answered_with_an_html_page() -> None:
    page = html_page('<p>Not found</p><a href="/real.mp3">r</a>', url="http://pl.example.com/gone.m3u")
    assert urls(page) == ["http://pl.example.com/real.mp3"]


# --- playlists --------------------------------------------------------------------------------------

def test_m3u_with_extinf() -> None:
    text = ("#EXTM3U\n#EXTINF:215,Some Artist - Some Title\nhttp://cdn.example.com/1.mp3\n"
            "#EXTINF:-1,Just A Title\n../music/2.ogg\n\n# comment\nnested.m3u\n")
    result = resolve(response(text.encode(), "audio/x-mpegurl", url="http://pl.example.com/lists/a.m3u"))
    assert [(i.url, i.artist, i.title, i.duration) for i in result.items] == [
        ("http://cdn.example.com/1.mp3", "Some Artist", "Some Title", 215.0),
        ("http://pl.example.com/music/2.ogg", None, "Just A Title", None)]
    assert result.links == ["http://pl.example.com/lists/nested.m3u"]
    # Entries count as published on the page that links the playlist; the playlist itself is noted.
    assert all(i.page == PAGE and i.extra["playlist"] == "http://pl.example.com/lists/a.m3u" for i in result.items)
    alone = resolve(response(text.encode(), "audio/x-mpegurl", url="http://pl.example.com/lists/a.m3u",
                             referrer=None))
    assert all(i.page == "http://pl.example.com/lists/a.m3u" for i in alone.items)


def test_m3u8_with_plain_media_entries_served_as_text() -> None:
    text = "\ufeff#EXTM3U\n#EXTINF:100,Ärtist - Tïtle\n/media/x.flac\n"
    item = only(response(text.encode(), "text/plain", url="http://pl.example.com/a.m3u8"))
    assert (item.url, item.artist, item.title) == ("http://pl.example.com/media/x.flac", "Ärtist", "Tïtle")


def test_m3u_without_header_by_extension() -> None:
    item = only(response(b"song.mp3\n", "application/octet-stream", url="http://pl.example.com/d/a.m3u"))
    assert item.url == "http://pl.example.com/d/song.mp3"


@pytest.mark.parametrize("text", [
    "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nseg1.ts\n#EXTINF:10,\nseg2.aac\n",
    '#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS="mp4a.40.2"\naudio.m3u8\n',
])
def test_an_hls_playlist_is_one_stream_not_a_song_list(text: str) -> None:
    result = resolve(response(text.encode(), "application/vnd.apple.mpegurl", url="http://pl.example.com/live.m3u8"))
    assert [(i.url, i.extra["format"]) for i in result.items] == [("http://pl.example.com/live.m3u8", "hls")]
    assert result.links == []


def test_pls() -> None:
    text = ("[playlist]\nNumberOfEntries=2\nFile1=http://cdn.example.com/1.mp3\nTitle1=First Song\n"
            "Length1=180\nFile2=2.aac\nTitle2=Second\nLength2=-1\nFile3=http://radio.example.com:8000/live\n"
            "Version=2\n")
    result = resolve(response(text.encode(), "audio/x-scpls", url="http://pl.example.com/r.pls"))
    assert [(i.url, i.title, i.duration) for i in result.items] == [
        ("http://cdn.example.com/1.mp3", "First Song", 180.0), ("http://pl.example.com/2.aac", "Second", None)]
    assert result.links == ["http://radio.example.com:8000/live"]   # extensionless: fetched and sniffed


# --- hostile input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    '<script type="application/json">{"tracks": [{"src": "/a.mp3", broken</script>',
    '<script type="application/ld+json">' + "[" * 100_000 + "</script>",
    "<script>var x = '" + "a.mp3 " * 200_000 + "';</script>",
    "<script>/*" + "/* .mp3 " * 100_000 + "</script>",
    "<script>" + "{" * 100_000 + "'/a.mp3'" + "}" * 10 + "</script>",
    "<script>" + '"unterminated .mp3 ' * 50_000 + "</script>",
    "<script>var " + "a" * 2_000_000 + " = '.mp3'</script>",
    "<script>" + "x " * 1_000_000 + ": '/a.mp3'</script>",
    '<div data-x=\'{"src": "/a.mp3"\'></div>' * 100,
    "<a href='http://[::1'>.mp3</a><a href='http://exa mple.com/a.mp3'>x</a>",
])
def test_hostile_pages_do_not_crash_and_finish_quickly(body: str) -> None:
    started = time.perf_counter()
    result = resolve(html_page(body))
    assert time.perf_counter() - started < 5
    assert all(i.url.startswith("http") for i in result.items)


def test_broken_json_block_still_yields_nothing_false() -> None:
    page = html_page('<script type="application/json">{"src": "/a.mp3", </script><a href="/b.mp3">b</a>')
    assert urls(page) == ["http://music.example.com/b.mp3"]


async def test_error_status_and_missing_page_give_nothing() -> None:
    page = html_page('<a href="/a.mp3">a</a>')
    page.status = 404
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t")
        assert (await GenericResolver({}).resolve(page.url, page, ctx)).items == []
        assert (await GenericResolver({}).resolve(page.url, None, ctx)).items == []
        page.status = 200
        assert len((await GenericResolver({}).resolve(page.url, page, ctx)).items) == 1


# --- small pieces ----------------------------------------------------------------------------------

def test_audio_link_and_claims() -> None:
    g = GenericResolver({})
    assert g.audio_link("http://x.org/a/B.FLAC?x=1") and g.audio_link("http://x.org/a%20b.mp3")
    assert not g.audio_link("http://x.org/a.mp3/page") and not g.audio_link("http://x.org/.mp3")
    assert not g.audio_link("http://x.org/list.m3u") and not g.audio_link("http://x.org/clip.mp4")
    assert g.claims("https://anything.example/") and not g.claims("ftp://x.org/a.mp3")
    assert url_extension("http://x.org/a.tar.MP3#f") == "mp3"


def _reference_extension(url: str) -> str:
    """What url_extension must answer, the slow obvious way."""
    import posixpath
    from urllib.parse import unquote, urlsplit
    name = posixpath.basename(unquote(urlsplit(url).path))
    stem, dot, ext = name.rpartition(".")
    return ext.lower() if dot and stem else ""


_URL_PARTS = st.sampled_from(["http:", "https:", "HTTP:", "x-y+z:", "1a:", "", "//", "/", "a", ".", "..",
                              "mp3", ".MP3", "%2F", "%2e", "%", "?", "#", "q=1.mp3", "host.org", ":80",
                              "@", "b.m3u8", "/c.d/", "é", " ", "\t", "\n"])


@given(st.lists(_URL_PARTS, max_size=12).map("".join))
def test_url_extension_agrees_with_urlsplit(url: str) -> None:
    assert url_extension(url) == _reference_extension(url)


@pytest.mark.parametrize("url, ext", [
    ("http://x.org/a.mp3?b=c.flac#d.ogg", "mp3"), ("//cdn.x/a/b.OGG", "ogg"), ("http://song.mp3", ""),
    ("a/b//c.wav", "wav"), ("/go?to=http://x/a.mp3", ""), ("http://x/a%2Fb.mp3", "mp3"), ("http://x/.mp3", ""),
    ("http:foo.mp3", "mp3"), ("page.html#x?y.mp3", "html"), ("http://x/a.mp3/", ""),
])
def test_url_extension_examples(url: str, ext: str) -> None:
    assert url_extension(url) == ext


def test_page_text_charset_from_header_then_meta_then_utf8() -> None:
    body = "<html><head><meta charset='gbk'></head><body>晴天</body></html>".encode("gbk")
    page = FetchedPage(url=PAGE, final_url=PAGE, status=200, content_type="text/html", headers={}, body=body)
    assert "晴天" in page.text()
    page = FetchedPage(url=PAGE, final_url=PAGE, status=200, content_type="text/html",
                       headers={"content-type": "text/html; charset=big5"}, body="晴天".encode("big5"))
    assert page.text() == "晴天"
    page = FetchedPage(url=PAGE, final_url=PAGE, status=200, content_type="text/html",
                       headers={"content-type": "text/html; charset=no-such"}, body=b"ok \xff")
    assert page.text() == "ok \ufffd"
    for odd in ("base64", "rot13", "idna", "utf-7"):
        page = FetchedPage(url=PAGE, final_url=PAGE, status=200, content_type="text/html",
                           headers={"content-type": f"text/html; charset={odd}"}, body=b"<p>\xff+-</p>")
        assert isinstance(page.text(), str)
    assert page.tree() is page.tree() is not None
    assert FetchedPage(url=PAGE, final_url=PAGE, status=200, content_type="image/png", headers={},
                       body=b"\x89PNG").tree() is None


def test_parse_literal_reads_js_data_and_rejects_code() -> None:
    assert parse_literal("[{a: 'x', \"b\": 2, c: [true, null,],},]") == [{"a": "x", "b": 2, "c": [True, None]}]
    for bad in ["[f(1)]", "{a: 1 b: 2}", "[" * 100_000 + "]" * 100_000, "[" * 200 + "1", "{'a': "]:
        with pytest.raises(LiteralError):
            parse_literal(bad)


def test_strings_with_context_pairs_values_with_their_object() -> None:
    found = strings_with_context("x = {t: 'T', u: 'a.mp3', inner: {v: 'b.mp3'}}; y = 'c.mp3'",
                                 lambda s: s.endswith(".mp3"))
    assert [(s.value, s.keys.get("t")) for s in found] == [("a.mp3", "T"), ("b.mp3", None), ("c.mp3", None)]


# --- the framework ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MinimalConfig:
    host: str = "tunes.example"


class MinimalResolver(Resolver):
    """The smallest useful resolver: one site, items straight from the URL."""

    name: ClassVar[str] = "minimal"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings = parse_section(MinimalConfig, self.name, config)   # rejects unknown keys

    def claims(self, url: str) -> bool:
        return url.startswith(f"https://{self.settings.host}/track/")

    def needs_page(self, url: str) -> bool:
        return False   # the URL alone names the track

    async def resolve(self, url: str, page: FetchedPage | None, ctx: ResolveContext) -> Resolution:
        track = url.rsplit("/", 1)[-1]
        return Resolution(items=[AudioItem(url=f"https://cdn.{self.settings.host}/{track}.mp3", page=url,
                                           resolver=self.name, source_id=track,
                                           identity=RequestIdentity(user_agent=ctx.user_agent))])


class NotAResolver:
    pass


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [EntryPoint(name="minimal", value=f"{__name__}:MinimalResolver", group=registry.ENTRY_POINT_GROUP),
           EntryPoint(name="bogus", value=f"{__name__}:NotAResolver", group=registry.ENTRY_POINT_GROUP),
           EntryPoint(name="broken", value="no_such_module_here:X", group=registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: [e for e in eps if e.group == group])


def test_load_resolvers_keeps_config_order_and_puts_generic_last(plugins: None) -> None:
    resolvers = load_resolvers({"generic": {"max_items": 5}, "minimal": {"host": "other.example"}, "kugou": {}})
    assert [r.name for r in resolvers] == ["minimal", "kugou", "generic"]
    assert resolvers[-1].settings.max_items == 5   # type: ignore[attr-defined]
    assert pick(resolvers, "https://other.example/track/7").name == "minimal"
    assert pick(resolvers, "https://www.kugou.com/yy/special/single/1.html").name == "kugou"
    assert pick(resolvers, "https://tunes.example/track/7").name == "generic"


async def test_a_plugin_resolves_through_the_interface(plugins: None) -> None:
    [minimal, _generic] = load_resolvers({"minimal": {}})
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(ClientGetter(http), "UA/1")
        result = await minimal.resolve("https://tunes.example/track/7", None, ctx)
    [item] = result.items
    assert (item.url, item.resolver, item.identity) == ("https://cdn.tunes.example/7.mp3", "minimal",
                                                        RequestIdentity(user_agent="UA/1"))
    assert await minimal.reresolve(item, ctx) is None   # the base: cannot


def test_generic_is_present_even_when_not_named() -> None:
    assert [r.name for r in load_resolvers({})] == ["generic"]


@pytest.mark.parametrize("sections, message", [
    ({"nosuch": {}}, "nosuch: unknown resolver"),
    ({"bogus": {}}, "bogus: "),
    ({"broken": {}}, "broken: entry point"),
    ({"minimal": {"hots": "x"}}, "minimal.hots: unknown key"),
    ({"generic": {"max_item": 3}}, "generic.max_item: unknown key"),
    ({"generic": {"max_items": True}}, "generic.max_items: must be an integer"),
    ({"generic": {"max_items": 0}}, "generic.max_items: must be at least 1"),
    ({"generic": ["not", "a", "mapping"]}, "generic: section must be a mapping"),
])
def test_config_errors_name_the_resolver_and_key(plugins: None, sections: Any, message: str) -> None:
    with pytest.raises(ResolverConfigError, match=message):
        load_resolvers(sections)


def test_pls_titles_split_artist_like_extinf() -> None:
    text = "[playlist]\nFile1=/m/1.mp3\nTitle1=Some Artist - Some Title\nFile2=/m/2.mp3\nTitle2=Only Title\n"
    result = resolve(response(text.encode(), "audio/x-scpls", url="http://pl.example.com/a.pls"))
    assert [(i.artist, i.title) for i in result.items] == [("Some Artist", "Some Title"), (None, "Only Title")]


@pytest.mark.parametrize(("head", "media"), [
    (b"ID3\x04\x00\x00\x00\x00\x00\x00", True), (b"\xff\xfb\x90\x64" + b"\0" * 100, True),
    (b"\x00\x00\x00\x18ftypisom" + b"\0" * 100, True), (b"\x00\x00\x00\x18styp" + b"\0" * 100, True),
    (b"OggS" + b"\0" * 100, True), (b"\x1a\x45\xdf\xa3" + b"\0" * 100, True),
    ((b"\x47" + b"\0" * 187) * 3, True),                                # MPEG-TS packets (HLS segments)
    (b"<!doctype html><html>", False), (b"MZ\x90\x00\x03", False), (b'{"error": "expired"}', False),
    (b"#EXTM3U\n#EXT-X-VERSION:3\n", False), (b"", False),
])
def test_is_media_tells_a_download_worth_keeping(head, media):
    from crawler.web.media import is_media
    assert is_media(head) is media


# --- what a page says about its links to audio travels with them ------------------------------------------------

SONG_PAGE = ('<h1>Quiet Harbour</h1><p>by <span class="artist">Mia</span></p>'
             '<p><a href="/stream/7">Download</a></p><nav><a href="/songs/">All songs</a></nav>')


def test_a_stream_named_like_a_page_and_a_playlist_carry_the_pages_names() -> None:
    result = resolve(html_page(SONG_PAGE, head="<title>Quiet Harbour – Mia</title>"))
    assert result.items == [] and result.links == []
    named = result.link_meta["http://music.example.com/stream/7"]
    assert (named.title, named.artist) == ("Quiet Harbour", "Mia")
    assert named.meta_source == {"title": "heading", "artist": "class"}
    assert list(result.link_meta) == ["http://music.example.com/stream/7"]   # not the site's navigation
    body = SONG_PAGE.replace('href="/stream/7"', 'href="/p/7.m3u" data-artist="Mia"')
    result = resolve(html_page(body))
    assert result.links == ["http://music.example.com/p/7.m3u"]
    named = result.link_meta["http://music.example.com/p/7.m3u"]
    assert (named.title, named.artist, named.meta_source) == ("Quiet Harbour", "Mia",
                                                              {"title": "heading", "artist": "data"})
    # Two songs on a page: each link takes its own row's names, never the page's heading.
    rows = "".join(f'<li><span class="title">Song {i}</span><a href="/stream/{i}">Play</a></li>' for i in (1, 2))
    result = resolve(html_page(f"<h1>Two songs</h1><ul>{rows}</ul>"))
    assert [m.title for m in result.link_meta.values()] == ["Song 1", "Song 2"]


async def test_audio_found_by_its_first_bytes_takes_the_names_that_came_with_its_link() -> None:
    fetched: list[str] = []

    async def fetch_page(url: str) -> FetchedPage | None:
        fetched.append(url)
        return None

    named = LinkMeta(title="Quiet Harbour", artist="Mia", meta_source={"title": "heading", "artist": "class"})
    stream = response(b"\xff\xfb\x90\x64" + bytes(413), url="http://music.example.com/stream/7")
    stream.link_meta = named
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t", fetch_page=fetch_page)
        item = (await GenericResolver({}).resolve(stream.url, stream, ctx)).items[0]
    assert (item.title, item.artist, item.page) == ("Quiet Harbour", "Mia", PAGE)
    assert item.meta_source == {"title": "heading", "artist": "class"}
    assert fetched == []   # the linking page is not read again


def test_a_one_song_playlist_takes_the_names_of_its_link_and_passes_them_on() -> None:
    named = LinkMeta(title="Quiet Harbour", artist="Mia", meta_source={"title": "heading", "artist": "class"})
    playlist = response(b"#EXTM3U\n/media/7.mp3\n", "audio/x-mpegurl", url="http://music.example.com/p/7.m3u")
    playlist.link_meta = named
    item = only(playlist)
    assert (item.title, item.artist, item.meta_source) == ("Quiet Harbour", "Mia",
                                                           {"title": "heading", "artist": "class"})
    playlist = response(b"[playlist]\nFile1=/stream/7\nNumberOfEntries=1\n", "audio/x-scpls",
                        url="http://music.example.com/p/7.pls")
    playlist.link_meta = named
    result = resolve(playlist)
    assert result.links == ["http://music.example.com/stream/7"]
    assert result.link_meta["http://music.example.com/stream/7"] == named
    # A playlist of several songs gives none of them its link's names.
    playlist = response(b"#EXTM3U\n/media/1.mp3\n/media/2.mp3\n", "audio/x-mpegurl",
                        url="http://music.example.com/p/all.m3u")
    playlist.link_meta = named
    assert [i.title for i in resolve(playlist).items] == [None, None]
