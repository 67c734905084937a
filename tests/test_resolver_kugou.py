"""The Kugou resolver against the fake Kugou over real loopback HTTP."""

from __future__ import annotations

import json
import pathlib
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from crawler.http.getter import ClientGetter
from crawler.items import FAILED, OK, UNAVAILABLE
from crawler.resolvers import ResolveContext, ResolverConfigError, load_resolvers, pick
from crawler.resolvers.kugou import DESKTOP_USER_AGENT, KugouResolver, search_url, unwrap_jsonp
from crawler.web.media import read_tags
from crawler.web.page import FetchedPage
from crawler.web.urls import NormalizeOptions, normalize
from tests.fakes.kugou import KugouController, make_kugou_app, serve

WORKER_UA = "AudioCrawler/0.1 (+https://example.org/bot)"


@dataclass
class Env:
    base: str
    kugou: KugouController
    resolver: KugouResolver
    ctx: ResolveContext
    http: httpx.AsyncClient

    async def page(self, path: str, referrer: str | None = None) -> FetchedPage:
        resp = await self.http.get(self.base + path, headers={"User-Agent": WORKER_UA})
        content_type = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        return FetchedPage(url=self.base + path, final_url=str(resp.url), status=resp.status_code,
                           content_type=content_type, headers={k.lower(): v for k, v in resp.headers.items()},
                           body=resp.content, referrer=referrer)

    async def resolve(self, path: str):
        url = self.base + path
        page = await self.page(path) if self.resolver.needs_page(url) else None
        return await self.resolver.resolve(url, page, self.ctx)


def config_for(base: str, **overrides: object) -> dict[str, object]:
    host = base.split("//", 1)[1]
    config: dict[str, object] = {"api_base": base, "mobile_api_base": base, "www_hosts": [host],
                                 "mobile_hosts": [host], "referer": base + "/", "retry_delay": 0,
                                 "mid": "0123456789abcdef0123456789abcdef", "search_api_base": base,
                                 "search_hosts": [host]}
    config.update(overrides)
    return config


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    app, kugou = make_kugou_app()
    async with serve(app) as base, httpx.AsyncClient(timeout=10) as http:
        resolver = KugouResolver(config_for(base))
        yield Env(base, kugou, resolver, ResolveContext(http=ClientGetter(http), user_agent=WORKER_UA, clock=kugou.clock), http)


def add_catalogue(kugou: KugouController):
    a = kugou.add_song("周杰伦", "晴天", album="叶惠美", seconds=269, bitrate=128)
    b = kugou.add_song("Faye Wong", "Dream Person", album="Faye Best", seconds=300, bitrate=320)
    paid = kugou.add_song("Paid Artist", "Members Only", album="Gold", paid=True)
    return a, b, paid


async def test_playlist_page_resolves_every_song_with_its_metadata(env: Env) -> None:
    a, b, paid = add_catalogue(env.kugou)
    path = env.kugou.add_special("547134", [a.hash, b.hash, paid.hash])

    result = await env.resolve(path)

    by_hash = {item.source_id: item for item in result.items}
    assert list(by_hash) == [a.hash, b.hash, paid.hash]
    first = by_hash[a.hash]
    assert first.status == OK and first.resolver == "kugou"
    assert (first.title, first.artist, first.album) == ("晴天", "周杰伦", "叶惠美")
    assert first.duration == 269.0 and first.bitrate == 128
    assert first.page == env.base + path
    assert first.cover is not None and "{size}" not in first.cover and "/480/" in first.cover
    assert first.extra["album_id"] == a.album_id and first.extra["filesize"] == len(a.audio)
    assert re.search(r"/\d{12}/[0-9a-f]{32}/", first.url)
    assert by_hash[b.hash].bitrate == 320 and by_hash[b.hash].title == "Dream Person"


async def test_paid_song_is_recorded_unavailable_with_metadata_and_asked_once(env: Env) -> None:
    _, _, paid = add_catalogue(env.kugou)
    path = env.kugou.add_special("1", [paid.hash])

    [item] = (await env.resolve(path)).items

    assert item.status == UNAVAILABLE and item.url == ""
    assert "paid" in (item.reason or "")
    assert (item.title, item.artist, item.album) == ("Members Only", "Paid Artist", "Gold")
    assert item.source_id == paid.hash and item.identity is None
    assert [r["hash"] for r in env.kugou.play_requests] == [paid.hash]


async def test_identity_is_sent_to_the_api_and_carried_for_the_download(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    path = env.kugou.add_special("2", [a.hash])

    [item] = (await env.resolve(path)).items

    assert item.identity is not None
    assert item.identity.user_agent == DESKTOP_USER_AGENT
    assert dict(item.identity.cookies) == {"kg_mid": "0123456789abcdef0123456789abcdef"}
    assert dict(item.identity.headers) == {"Referer": env.base + "/"}
    [asked] = env.kugou.play_requests
    assert asked["user_agent"] == DESKTOP_USER_AGENT
    assert asked["kg_mid"] == asked["mid"] == "0123456789abcdef0123456789abcdef"
    assert asked["referer"] == env.base + "/"

    ok = await env.http.get(item.url, headers=item.identity.request_headers())
    assert ok.status_code == 200 and ok.content == a.audio
    assert read_tags(ok.content)["title"] == "晴天"


async def test_download_address_refuses_another_user_agent(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    [item] = (await env.resolve(env.kugou.add_special("3", [a.hash]))).items
    assert item.identity is not None
    headers = item.identity.request_headers()

    other = await env.http.get(item.url, headers={**headers, "User-Agent": WORKER_UA})

    assert other.status_code == 403
    assert env.kugou.downloads[-1]["status"] == 403


async def test_worker_user_agent_is_used_when_configured_to(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    resolver = KugouResolver(config_for(env.base, user_agent=None))

    [item] = (await resolver.resolve(env.base + env.kugou.add_special("4", [a.hash]),
                                     await env.page("/yy/special/single/4.html"), env.ctx)).items

    assert item.identity is not None and item.identity.user_agent == WORKER_UA
    assert env.kugou.play_requests[-1]["user_agent"] == WORKER_UA


async def test_share_page(env: Env) -> None:
    a, b, _ = add_catalogue(env.kugou)
    path = env.kugou.add_share("4fCqm6bdPV2", [b.hash, a.hash])

    result = await env.resolve(path)

    assert [(i.source_id, i.status, i.title) for i in result.items] == [
        (b.hash, OK, "Dream Person"), (a.hash, OK, "晴天")]


async def test_rank_page(env: Env) -> None:
    a, b, paid = add_catalogue(env.kugou)
    path = env.kugou.add_rank("1-8888", [a.hash, paid.hash, b.hash])

    result = await env.resolve(path)

    assert [i.status for i in result.items] == [OK, UNAVAILABLE, OK]
    assert result.items[2].artist == "Faye Wong"


async def test_song_url_is_resolved_from_its_fragment_without_a_page(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    url = f"{env.base}/song/#hash={a.hash}&album_id={a.album_id}"

    assert env.resolver.claims(url) and not env.resolver.needs_page(url)
    assert normalize(url, NormalizeOptions(keep_fragment=env.resolver.keep_fragment)) == url
    result = await env.resolver.resolve(url, None, env.ctx)

    [item] = result.items
    assert item.status == OK and item.source_id == a.hash and item.page == url
    assert item.extra["album_id"] == a.album_id


async def test_song_url_with_a_lower_case_hash_and_no_album(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    [item] = (await env.resolver.resolve(f"{env.base}/song/#hash={a.hash.lower()}", None, env.ctx)).items
    assert item.status == OK and item.title == "晴天"


async def test_plist_json_twin(env: Env) -> None:
    a, b, _ = add_catalogue(env.kugou)
    env.kugou.add_special("777", [a.hash, b.hash])
    url = env.base + "/plist/list/777"

    assert env.resolver.claims(url) and not env.resolver.needs_page(url)
    result = await env.resolver.resolve(url, None, env.ctx)

    assert [(i.source_id, i.status) for i in result.items] == [(a.hash, OK), (b.hash, OK)]


async def test_playlist_page_without_its_script_falls_back_to_the_json_twin(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    path = env.kugou.add_special("888", [a.hash])
    env.kugou.pages[path] = ("text/html", b"<html><script>var global = {};</script></html>")

    [item] = (await env.resolve(path)).items

    assert item.status == OK and item.source_id == a.hash


async def test_verification_error_is_retried_then_succeeds(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    env.kugou.verify_failures[a.hash] = 2   # the resolver allows two retries by default

    [item] = (await env.resolve(env.kugou.add_special("5", [a.hash]))).items

    assert item.status == OK
    assert len(env.kugou.play_requests) == 3


async def test_persistent_verification_error_fails_with_a_reason_after_bounded_retries(env: Env) -> None:
    a, b, _ = add_catalogue(env.kugou)
    env.kugou.verify_failures[a.hash] = 100
    env.kugou.song_info_up = False

    items = (await env.resolve(env.kugou.add_special("6", [a.hash, b.hash]))).items

    failed, ok = items
    assert failed.status == FAILED and "20010" in (failed.reason or "") and "getSongInfo" in failed.reason
    assert failed.title == "晴天" and failed.artist == "周杰伦"   # what the page listed
    assert ok.status == OK   # one song's trouble does not sink the page
    assert sum(r["hash"] == a.hash for r in env.kugou.play_requests) == 3


async def test_fake_answers_20010_without_the_kg_mid_cookie(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    resp = await env.http.get(env.base + "/yy/index.php",
                              params={"r": "play/getdata", "hash": a.hash, "callback": "cb"})
    assert unwrap_jsonp(resp.text) == {"status": 0, "err_code": 20010, "data": []}


async def test_reresolve_gives_a_fresh_address_after_expiry_and_the_download_resumes(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    [item] = (await env.resolve(env.kugou.add_special("7", [a.hash]))).items
    assert item.identity is not None
    first = await env.http.get(item.url, headers={**item.identity.request_headers(), "Range": "bytes=0-999"})
    assert first.status_code == 206 and first.content == a.audio[:1000]
    etag = first.headers["etag"]

    env.kugou.advance(env.kugou.link_lifetime + 1)
    expired = await env.http.get(item.url, headers=item.identity.request_headers())
    assert expired.status_code == 403

    fresh = await env.resolver.reresolve(item, env.ctx)
    assert fresh is not None and fresh.url != item.url and fresh.status == OK
    assert fresh.source_id == a.hash and fresh.title == item.title and fresh.identity is not None
    assert fresh.extra["issued_at"] == env.kugou.now
    rest = await env.http.get(fresh.url, headers={**fresh.identity.request_headers(),
                                                  "Range": "bytes=1000-", "If-Range": etag})
    assert rest.status_code == 206
    assert first.content + rest.content == a.audio


async def test_reresolve_returns_none_when_the_song_became_unavailable(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    [item] = (await env.resolve(env.kugou.add_special("8", [a.hash]))).items
    a.paid = True
    assert await env.resolver.reresolve(item, env.ctx) is None
    assert await env.resolver.reresolve(item.replace(resolver="generic"), env.ctx) is None


async def test_expired_status_is_configurable(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    env.kugou.expired_status = 410
    [item] = (await env.resolve(env.kugou.add_special("9", [a.hash]))).items
    assert item.identity is not None
    env.kugou.advance(env.kugou.link_lifetime - 1)
    assert (await env.http.get(item.url, headers=item.identity.request_headers())).status_code == 200
    env.kugou.advance(2)
    assert (await env.http.get(item.url, headers=item.identity.request_headers())).status_code == 410


@pytest.mark.parametrize("body, reason", [
    ("cb({\"status\": 1, \"err_code\": 0, \"data\": {\"play_url\": \"", "neither JSON nor JSONP"),
    ("cb([1, 2, 3]);", "not an object"),
    ("{\"status\": 0, \"err_code\": 30020, \"data\": []}", "err_code 30020"),
    ("cb({\"status\": 1, \"err_code\": 0, \"data\": []});", "no data object"),
    ("cb({\"status\": 1, \"err_code\": 0, \"data\": {\"play_url\": \"javascript:alert(1)\"}});", "not an http"),
    ("[" * 100_000, "neither JSON nor JSONP"),
    (("cb({\"status\": 1, \"err_code\": 0, \"data\": {\"play_url\": 7, \"bitrate\": Infinity,"
      " \"timelength\": NaN, \"authors\": [1, {\"author_name\": []}], \"img\": {}}});"), "not an http"),
])
async def test_unexpected_play_data_becomes_a_failed_item(env: Env, body: str, reason: str) -> None:
    a, _, _ = add_catalogue(env.kugou)
    env.kugou.play_body = body
    env.kugou.song_info_up = False

    [item] = (await env.resolve(env.kugou.add_special("10", [a.hash]))).items

    assert item.status == FAILED and reason in (item.reason or "")
    assert item.url == "" and item.source_id == a.hash


async def test_unreachable_api_becomes_a_failed_item(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    resolver = KugouResolver(config_for(env.base, api_base=closed, mobile_api_base=closed))

    [item] = (await resolver.resolve(env.base + "/song/#hash=" + a.hash, None, env.ctx)).items

    assert item.status == FAILED and "request failed" in (item.reason or "")
    assert "getSongInfo" in item.reason


@pytest.mark.parametrize("script", [
    "global.data = [{\"hash\": \"AB\", broken json",                      # never closes
    "global.data = [{\"hash\": 'x' + y}];",                                # code, not data
    "global.data = {\"not\": \"a list\"};",
    "global.data = " + "[" * 5000 + "]" * 5000 + ";",                      # nested beyond reason
    "var filler = '" + "x" * 3_000_000 + "';",                             # huge script, no list
])
async def test_hostile_playlist_pages_fail_clearly(env: Env, script: str) -> None:
    path = env.kugou.add_special("11", [])
    env.kugou.pages[path] = ("text/html", f"<html><script>{script}</script></html>".encode())
    env.kugou.pages["/plist/list/11"] = ("text/html", b"<html>not json</html>")

    result = await env.resolve(path)

    [item] = result.items
    assert item.status == FAILED and item.url == "" and "song list" in (item.reason or "")
    assert env.kugou.play_requests == []


async def test_list_entries_with_bad_hashes_are_skipped_and_js_literals_are_read(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    path = env.kugou.add_special("12", [])
    script = (f"global.data = [{{hash: 'not-a-hash'}}, {{hash: '{a.hash}', album_id: {a.album_id},"
              " filename: '周杰伦 - 晴天',}, 42, null,];")
    env.kugou.pages[path] = ("text/html", f"<html><script>{script}</script></html>".encode())

    [item] = (await env.resolve(path)).items

    assert item.source_id == a.hash and item.status == OK


async def test_empty_playlist_gives_nothing(env: Env) -> None:
    result = await env.resolve(env.kugou.add_special("13", []))
    assert result.items == [] and env.kugou.play_requests == []


async def test_missing_page_is_a_failure_not_a_crash(env: Env) -> None:
    [item] = (await env.resolve("/yy/special/single/404404.html")).items
    assert item.status == FAILED


async def test_max_songs_caps_a_page(env: Env) -> None:
    songs = [env.kugou.add_song("A", f"T{i}") for i in range(5)]
    resolver = KugouResolver(config_for(env.base, max_songs=2, concurrency=1))
    path = env.kugou.add_special("14", [s.hash for s in songs])
    result = await resolver.resolve(env.base + path, await env.page(path), env.ctx)
    assert [i.source_id for i in result.items] == [songs[0].hash, songs[1].hash]


def test_claims_only_the_page_kinds_it_understands() -> None:
    r = KugouResolver({})
    assert r.claims("https://www.kugou.com/yy/special/single/547134.html")
    assert r.claims("https://www.kugou.com/share/4fCqm6bdPV2.html")
    assert r.claims("https://www.kugou.com/yy/rank/home/1-8888.html")
    assert r.claims("https://www.kugou.com/song/#hash=0123456789ABCDEF0123456789ABCDEF&album_id=1")
    assert r.claims("http://m.kugou.com/plist/list/125032")
    for url in ("https://www.kugou.com/album/1645030.html", "http://www.kugou.com/yy/album/single/1645030.html",
                "https://www.kugou.com/singer/3520.html", "http://www.kugou.com/yy/singer/home/3520.html"):
        assert r.claims(url) and r.needs_page(url)
    search = "https://songsearch.kugou.com/song_search_v2?keyword=%E6%99%B4%E5%A4%A9&page=1&pagesize=30"
    assert r.claims(search) and not r.needs_page(search)
    assert not r.claims("https://songsearch.kugou.com/song_search_v2")     # no keyword
    assert not r.claims("https://www.kugou.com/album/")
    assert not r.claims("https://www.kugou.com/song/")             # no song named
    assert not r.claims("https://www.kugou.com/")
    assert not r.claims("https://www.example.com/yy/special/single/1.html")
    assert r.needs_page("https://www.kugou.com/yy/special/single/547134.html")
    keep = NormalizeOptions(keep_fragment=r.keep_fragment)
    song = "https://WWW.kugou.com:443/song/#hash=0123456789ABCDEF0123456789ABCDEF&album_id=1"
    assert normalize(song, keep) == "https://www.kugou.com/song/#hash=0123456789ABCDEF0123456789ABCDEF&album_id=1"
    assert normalize("https://www.kugou.com/yy/html/index.html#x", keep) == "https://www.kugou.com/yy/html/index.html"


def test_unwrap_jsonp() -> None:
    assert unwrap_jsonp('jQuery191_1({"a": 1});') == {"a": 1}
    assert unwrap_jsonp('/**/cb ( {"a": [1, ")"]} ) ;\n') == {"a": [1, ")"]}
    assert unwrap_jsonp('{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError):
        unwrap_jsonp("cb({broken);")


@pytest.mark.parametrize("section, message", [
    ({"api_base": "wwwapi.kugou.com"}, "kugou.api_base: must be an http(s) URL"),
    ({"www_hosts": "www.kugou.com"}, "kugou.www_hosts: must be a list"),
    ({"verify_retries": -1}, "kugou.verify_retries: must be at least 0"),
    ({"concurrency": "4"}, "kugou.concurrency: must be an integer"),
    ({"mid": "short"}, "kugou.mid"),
    ({"apibase": "https://x"}, "kugou.apibase: unknown key"),
    ({"search_api_base": "songsearch"}, "kugou.search_api_base: must be an http(s) URL"),
    ({"search_pages": 0}, "kugou.search_pages: must be at least 1"),
])
def test_config_errors_name_the_key(section: dict[str, object], message: str) -> None:
    with pytest.raises(ResolverConfigError, match=re.escape(message)):
        KugouResolver(section)


def test_kugou_is_picked_before_the_generic_resolver() -> None:
    resolvers = load_resolvers({"kugou": {}, "generic": {}})
    assert [r.name for r in resolvers] == ["kugou", "generic"]
    assert pick(resolvers, "https://www.kugou.com/yy/special/single/1.html").name == "kugou"
    assert pick(resolvers, "https://www.kugou.com/about.html").name == "generic"


def test_the_shipped_kugou_config_builds_its_resolvers() -> None:
    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "kugou.yaml"
    resolvers = load_resolvers(yaml.safe_load(path.read_text())["resolvers"])
    assert [r.name for r in resolvers] == ["kugou", "generic"]
    assert resolvers[0].claims("https://www.kugou.com/yy/special/single/547134.html")


async def test_album_page_lists_its_songs_in_a_script_and_each_is_resolved(env: Env) -> None:
    a, b, paid = add_catalogue(env.kugou)
    items = (await env.resolve(env.kugou.add_album("1645030", [a.hash, b.hash, paid.hash]))).items
    assert [(i.title, i.artist, i.album, i.status) for i in items] == [
        ("晴天", "周杰伦", "叶惠美", OK), ("Dream Person", "Faye Wong", "Faye Best", OK),
        ("Members Only", "Paid Artist", "Gold", UNAVAILABLE)]
    assert items[0].page == env.base + "/album/1645030.html"


async def test_singer_page_lists_its_songs_as_data_links(env: Env) -> None:
    a, b, _ = add_catalogue(env.kugou)
    items = (await env.resolve(env.kugou.add_singer("3520", [b.hash, a.hash]))).items
    assert [(i.source_id, i.title, i.status) for i in items] == [(b.hash, "Dream Person", OK), (a.hash, "晴天", OK)]


async def test_lyrics_are_kept_and_every_field_says_it_came_from_kugou(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    [item] = (await env.resolve(f"/song/#hash={a.hash}&album_id={a.album_id}")).items
    assert item.lyrics == "[00:00.78]晴天"
    assert item.meta_source["title"] == item.meta_source["lyrics"] == "kugou"


async def test_description_comes_from_the_songs_intro_where_the_answer_has_one(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    env.kugou.play_body = json.dumps({"status": 1, "err_code": 0, "data": {
        "song_name": "晴天", "author_name": "周杰伦", "intro": "  A song about  a sunny day. ",
        "play_url": env.base + "/x.mp3"}})
    [item] = (await env.resolve(f"/song/#hash={a.hash}")).items
    assert item.description == "A song about a sunny day." and item.meta_source["description"] == "kugou"


async def test_keyword_search_gives_song_urls_and_the_next_page(env: Env) -> None:
    songs = [env.kugou.add_song("周杰伦", f"Song {i}") for i in range(65)]
    env.kugou.add_song("Other", "Song x")
    resolver = KugouResolver(config_for(env.base, search_pages=2))
    url = search_url("周杰伦", 1, env.base)
    res = await resolver.resolve(url, None, env.ctx)
    assert res.items == []
    song_links = [u for u in res.links if "/song/#hash=" in u]
    assert song_links[0] == f"{env.base}/song/#hash={songs[0].hash}&album_id={songs[0].album_id}"
    assert len(song_links) == 30 and res.links[-1] == search_url("周杰伦", 2, env.base)
    # The last page allowed links no further page.
    res2 = await resolver.resolve(res.links[-1], None, env.ctx)
    assert len(res2.links) == 30 and all("/song/#hash=" in u for u in res2.links)
    assert [r["page"] for r in env.kugou.search_requests] == ["1", "2"]
    # A song link is resolved like any song URL.
    [item] = (await resolver.resolve(song_links[0], None, env.ctx)).items
    assert item.status == OK and item.title == "Song 0"


async def test_a_search_answer_of_another_shape_fails_clearly(env: Env) -> None:
    env.kugou.pages["/song_search_v2"] = ("application/json", b'{"error_code": 0, "data": {"info": []}}')
    resolver = KugouResolver(config_for(env.base))
    [item] = (await resolver.resolve(search_url("x", 1, env.base), None, env.ctx)).items
    assert item.status == FAILED and "data.lists" in (item.reason or "")


async def test_get_song_info_answers_when_play_data_fails(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    env.kugou.play_down.add(a.hash)
    [item] = (await env.resolve(f"/song/#hash={a.hash}&album_id={a.album_id}")).items
    assert item.status == OK and item.extra["via"] == "getSongInfo"
    assert (item.title, item.artist, item.duration, item.bitrate) == ("晴天", "周杰伦", 269, 128)
    assert env.kugou.song_info_requests == [a.hash]
    resp = await env.http.get(item.url, headers=item.identity.request_headers())
    assert resp.status_code == 200 and resp.content == a.audio


async def test_backup_address_is_the_address_when_play_url_is_empty(env: Env) -> None:
    a, _, _ = add_catalogue(env.kugou)
    backup = env.base + "/backup/x.mp3"
    env.kugou.play_body = json.dumps({"status": 1, "err_code": 0, "data": {
        "song_name": "晴天", "play_url": "", "play_backup_url": backup}})
    [item] = (await env.resolve(f"/song/#hash={a.hash}")).items
    assert item.status == OK and item.url == backup and "backup_url" not in item.extra


def test_the_master_settings_suggested_in_kugou_yaml_admit_every_page_kind_the_resolver_claims(tmp_path) -> None:
    from crawler.master.config import MasterConfig
    from crawler.web.urls import UrlPolicy
    from testkit.cluster import write_secret

    text = (pathlib.Path(__file__).resolve().parent.parent / "configs" / "kugou.yaml").read_text("utf-8")
    snippet = [line[4:] for line in text.splitlines() if line.startswith("#   ")]
    suggested = yaml.safe_load("\n".join(snippet))
    cfg = MasterConfig.from_mapping({"listen": "127.0.0.1:0", "data_dir": str(tmp_path),
                                     "secret_file": str(write_secret(tmp_path / "s")), "nodes": ["a"],
                                     **suggested}, tmp_path)
    c = cfg.crawl
    policy = UrlPolicy(max_length=c.max_url_length, max_depth=c.max_depth, max_query_params=c.max_query_params,
                       max_separator_ratio=c.max_separator_ratio, allowed_hosts=frozenset(c.allowed_hosts),
                       allow_patterns=c.allow_patterns, deny_patterns=c.deny_patterns)
    resolver = KugouResolver({})
    for url in ("https://www.kugou.com/yy/special/single/547134.html", "https://www.kugou.com/share/4fCqm6bdPV2.html",
                "https://www.kugou.com/yy/rank/home/1-8888.html", "https://www.kugou.com/album/1645030.html",
                "https://www.kugou.com/yy/album/single/1645030.html", "https://www.kugou.com/singer/3520.html",
                "https://www.kugou.com/yy/singer/home/3520.html", "http://m.kugou.com/plist/list/125032",
                "https://www.kugou.com/song/#hash=0123456789ABCDEF0123456789ABCDEF&album_id=1",
                *(s for s in cfg.seeds if "song_search_v2" in s)):
        assert resolver.claims(url), url
        assert policy.check(url, 1) is None, (url, policy.check(url, 1))
