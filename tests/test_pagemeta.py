"""Page metadata, layered by confidence, each field saying where it came from; and the referring page's
context for audio found only by its first bytes."""

from __future__ import annotations

import asyncio
import time
from html import escape

import httpx
import pytest

from crawler.http.getter import ClientGetter
from crawler.items import AudioItem
from crawler.resolvers.base import ResolveContext
from crawler.resolvers.generic import GenericResolver
from crawler.resolvers.pagemeta import is_generic_link_text
from crawler.web.page import FetchedPage
from tests.test_resolvers_generic import PAGE, html_page, only, resolve, response


def meta(item: AudioItem) -> tuple:
    return item.title, item.artist, item.album


def test_plain_text_in_named_elements_gives_title_artist_album_and_duration() -> None:
    body = ('<div class="song"><h1 class="song-title">Blue Moon</h1><p>by <span class="artist">Ann Lee</span>'
            ' from <a class="album-name" href="/al/3">Night Songs</a>, <span class="duration">3:25</span></p>'
            '<a href="/media/1.mp3">Download</a></div>')
    item = only(html_page(body, head="<title>Site</title>"))
    assert meta(item) == ("Blue Moon", "Ann Lee", "Night Songs")
    assert item.duration == 205
    assert item.meta_source == {"title": "class", "artist": "class", "album": "class", "duration": "class"}


def test_each_row_of_a_list_takes_its_own_named_values_never_a_neighbours() -> None:
    rows = "".join(f'<li><span class="title">Song {i}</span> - <span class="singer">Singer {i}</span> '
                   f'<a href="/m/{i}.mp3">play</a></li>' for i in range(5))
    items = resolve(html_page(f"<ol>{rows}</ol>", head='<meta property="og:title" content="All songs">')).items
    assert [meta(i)[:2] for i in items] == [(f"Song {i}", f"Singer {i}") for i in range(5)]
    assert all(i.meta_source["title"] == "class" for i in items)


def test_page_wide_named_value_applies_only_when_the_page_holds_one() -> None:
    # An artist page: one artist heading, rows with titles only.
    rows = "".join(f'<li><a href="/m/{i}.mp3">Track {i}</a></li>' for i in range(3))
    items = resolve(html_page(f'<h1 id="artist-name">The Band</h1><ul>{rows}</ul>')).items
    assert [meta(i)[:2] for i in items] == [(f"Track {i}", "The Band") for i in range(3)]
    assert items[0].meta_source == {"title": "link", "artist": "class"}
    # Two artists named on the page, none in the rows: neither is chosen.
    body = '<span class="artist">A</span><span class="artist">B</span><a href="/m/1.mp3">One</a>'
    assert only(html_page(body)).artist is None


def test_structured_data_at_the_element_beats_named_elements_and_labels_are_stripped() -> None:
    body = ('<div data-title="Data Title"><span class="title">Class Title</span>'
            '<span class="artist">Artist: Someone</span><a href="/a.mp3">x</a></div>')
    item = only(html_page(body))
    assert (item.title, item.artist) == ("Data Title", "Someone")
    assert item.meta_source == {"title": "data", "artist": "class"}


def test_json_ld_beats_page_wide_named_elements_and_link_text_beats_the_page_title() -> None:
    ld = '<script type="application/ld+json">{"@type": "MusicRecording", "name": "LD Song"}</script>'
    body = '<header><span class="title">Site header</span></header><a href="/a.mp3">Real name</a>'
    item = only(html_page(body, head=ld + "<title>Page</title>"))
    assert item.title == "LD Song" and item.meta_source["title"] == "jsonld"
    item = only(html_page('<p><a href="/a.mp3">Real name</a></p>', head="<title>Page</title>"))
    assert item.title == "Real name" and item.meta_source == {"title": "link"}
    item = only(html_page('<p><a href="/a.mp3">Download MP3</a></p>', head="<title>Page</title>"))
    assert item.title == "Page" and item.meta_source == {"title": "page-title"}


def test_subtitles_containers_and_paragraphs_are_not_names() -> None:
    body = ('<div class="track"><span class="subtitle">Live</span><p class="title">' + "long words " * 40
            + '</p><a href="/a.mp3">Download</a></div>')
    item = only(html_page(body, head="<title>Fallback</title>"))
    assert item.title == "Fallback"


def test_script_and_json_sources_are_named() -> None:
    body = '<script>var song = {"file": "/a.mp3", "title": "S", "artist": "A"};</script>'
    item = only(html_page(body))
    assert item.meta_source == {"title": "script", "artist": "script"}


class _Pages:
    def __init__(self, pages: dict[str, FetchedPage]) -> None:
        self.pages = pages
        self.fetched: list[str] = []

    async def __call__(self, url: str) -> FetchedPage | None:
        self.fetched.append(url)
        for _ in range(20):         # a fetch takes a while: others arrive meanwhile (loop turns, not time)
            await asyncio.sleep(0)
        return self.pages.get(url)


async def test_audio_found_by_first_bytes_keeps_the_referring_pages_context() -> None:
    song = html_page('<h1 class="title">Quiet Song</h1><span class="artist">Mia</span>'
                     '<a href="http://cdn.example.com/get/123">Listen</a>', head="<title>Quiet Song - Mia</title>")
    pages = _Pages({PAGE: song})
    resolver = GenericResolver({})
    mp3 = b"\xff\xfb\x90\x64" + bytes(413)
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t", fetch_page=pages)
        # Extensionless links of one page, found at once: the page is fetched once for all of them.
        burst = [response(mp3, url=f"http://cdn.example.com/get/{n}") for n in range(123, 130)]
        results = await asyncio.gather(*(resolver.resolve(o.url, o, ctx) for o in burst))
        first = results[0].items[0]
        await resolver.resolve(burst[1].url, burst[1], ctx)   # and later, from the cache
    assert (first.title, first.artist, first.page) == ("Quiet Song", "Mia", PAGE)
    assert first.meta_source == {"title": "class", "artist": "class"}
    assert pages.fetched == [PAGE]


async def test_file_tags_fill_gaps_and_disagreements_are_kept_beside() -> None:
    id3 = _id3({"TIT2": "Tag Title", "TALB": "Tag Album"})   # no artist: the page is read
    song = html_page('<span class="title">Page Title</span><a href="http://cdn.example.com/get/123">x</a>')
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t", fetch_page=_Pages({PAGE: song}))
        item = (await GenericResolver({}).resolve("", response(id3 + b"\xff\xfb\x90\x64" + bytes(413)), ctx)).items[0]
    assert (item.title, item.album) == ("Page Title", "Tag Album")
    assert item.meta_source == {"title": "class", "album": "file"}
    assert item.file_tags == {"title": "Tag Title"}


async def test_a_referrer_that_cannot_be_fetched_costs_nothing() -> None:
    async def broken(url: str) -> FetchedPage | None:
        raise OSError("unreachable")

    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t", fetch_page=broken)
        item = (await GenericResolver({}).resolve("", response(b"\xff\xfb\x90\x64" + bytes(413)), ctx)).items[0]
    assert item.url == "http://cdn.example.com/get/123" and item.title is None


def _id3(frames: dict[str, str]) -> bytes:
    body = b""
    for fid, text in frames.items():
        data = b"\x03" + text.encode()
        body += fid.encode() + len(data).to_bytes(4, "big") + b"\x00\x00" + data
    n = len(body)
    return b"ID3\x03\x00\x00" + bytes([(n >> 21) & 127, (n >> 14) & 127, (n >> 7) & 127, n & 127]) + body


def test_named_element_index_is_bounded_on_a_hostile_page() -> None:
    deep = "<div>" * 3000 + '<span class="artist">X</span><a href="/a.mp3">y</a>' + "</div>" * 3000
    many = '<span class="artist">A</span>' * 20000
    started = time.process_time()
    item = only(html_page(deep + many))
    assert item.url.endswith("/a.mp3")
    assert time.process_time() - started < 5   # linear in the page, not in elements times ancestors


@pytest.mark.parametrize("page_value, file_value, kept", [
    ("Song", "song ", False), (200.0, 201.0, False), (200.0, 260.0, True), ("A", "B", True)])
def test_what_counts_as_a_disagreement(page_value, file_value, kept) -> None:
    field = "title" if isinstance(page_value, str) else "duration"
    item = AudioItem(url="u", page="p", **{field: page_value}).with_file_tags({field: file_value})
    assert (field in item.file_tags) is kept
    assert getattr(item, field) == page_value


async def test_a_file_that_names_itself_needs_no_second_look_at_its_page() -> None:
    pages = _Pages({})
    body = _id3({"TIT2": "Tag Title", "TPE1": "Tag Artist"}) + b"\xff\xfb\x90\x64" + bytes(413)
    async with httpx.AsyncClient() as http:
        ctx = ResolveContext(http=ClientGetter(http), user_agent="t", fetch_page=pages)
        item = (await GenericResolver({}).resolve("", response(body), ctx)).items[0]
    assert (item.title, item.artist, item.meta_source) == ("Tag Title", "Tag Artist",
                                                           {"title": "file", "artist": "file"})
    assert pages.fetched == []


# --- download labels are not names -------------------------------------------------------------------------

LABELS = ["Download", "download", "DOWNLOAD MP3", "下载", "下載", "点击下载", "在线试听", "高品质下载", "下载MP3",
          "MP3", "Listen", "Play", "▶ Play", "» Download now", "Click here", "Télécharger", "Télécharger (320 kbps)",
          "Écouter en ligne", "Descargar", "Descargar canción gratis", "Escuchar aquí", "Herunterladen",
          "Jetzt anhören", "Baixar", "Baixar música", "Ouvir agora", "Скачать", "Скачать mp3", "Слушать онлайн",
          "ダウンロード", "ここをクリック", "試聴する", "320kbps", "128K", "MP3 320", "Download MP3 (3.5 MB)",
          "FLAC 24bit", "M3U", "Playlist"]
NAMES = ["Blue Moon", "Track 3", "Song 12", "月亮代表我的心", "上を向いて歩こう", "Подмосковные вечера",
         "La Vie en rose", "Hier kommt die Sonne", "Despacito", "Download Blue Moon", "Play That Funky Music",
         "1999", "Télécharger l'amour"]


@pytest.mark.parametrize("text", LABELS)
def test_download_labels_in_the_crawls_languages_are_generic(text: str) -> None:
    assert is_generic_link_text(text)


@pytest.mark.parametrize("text", NAMES)
def test_names_are_not_generic_even_with_a_label_word_in_them(text: str) -> None:
    assert not is_generic_link_text(text)


def test_generic_link_text_takes_linear_time_and_long_texts_are_names() -> None:
    started = time.process_time()
    for text in ("下" * 100, "下载" * 60, "download " * 13, "a" * 119, "320" * 40):
        is_generic_link_text(text)
    assert not is_generic_link_text("download " * 200)   # a paragraph, not a label
    assert time.process_time() - started < 0.05


@pytest.mark.parametrize("label", LABELS)
def test_a_song_page_gives_its_heading_not_the_label_to_its_song(label: str) -> None:
    body = ('<h1>Quiet Harbour</h1><p>by <span class="artist">Mia</span></p>'
            f'<p><a href="/media/7.mp3">{escape(label)}</a></p>')
    item = only(html_page(body, head="<title>Quiet Harbour – Mia | Music Site</title>"))
    assert (item.title, item.artist) == ("Quiet Harbour", "Mia")
    assert item.meta_source == {"title": "heading", "artist": "class"}


def test_the_heading_names_only_a_page_about_one_song() -> None:
    rows = "".join(f'<li><a href="/m/{i}.mp3">Download</a></li>' for i in range(3))
    items = resolve(html_page(f"<h1>Top songs</h1><ul>{rows}</ul>", head="<title>Charts</title>")).items
    assert all(i.meta_source.get("title") != "heading" for i in items)
    # A heading that is itself a label names nothing: the page's <title> does.
    item = only(html_page('<h1>Download</h1><a href="/a.mp3">MP3</a>', head="<title>Real Song</title>"))
    assert (item.title, item.meta_source["title"]) == ("Real Song", "page-title")
    # A link text that names the song still comes first.
    item = only(html_page('<h1>My Blog</h1><a href="/a.mp3">Blue Moon</a>', head="<title>Blog</title>"))
    assert (item.title, item.meta_source["title"]) == ("Blue Moon", "link")
