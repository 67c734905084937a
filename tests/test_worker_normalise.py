"""A worker keys the links it reports exactly as the master does: with the crawl's options from the Welcome."""

from crawler import protocol as p
from crawler.items import LinkMeta
from crawler.web.page import FetchedPage
from crawler.worker.config import WorkerConfig
from crawler.worker.fetcher import SNIFF_BYTES
from crawler.worker.server import Worker, _started
from testkit.cluster import write_secret


def worker(tmp_path, resolvers=None) -> Worker:
    raw = {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path), "secret_file": str(write_secret(tmp_path / "s"))}
    if resolvers is not None:
        raw["resolvers"] = resolvers
    return Worker(WorkerConfig.build(None, raw))


def test_links_are_reported_once_in_the_crawls_own_spelling(tmp_path):
    w = worker(tmp_path)
    w._normalise_as(p.Welcome(b"\0" * 32, 5.0, sort_query=True, drop_params=("utm_source",)))
    links = ["http://s.example/a.html?utm_source=news&b=2&a=1", "http://s.example/a.html?a=1&b=2",
             "http://s.example/c.html#top", "http://s.example/c.html"]
    assert w._links_to_report(links, [], 1) == ["http://s.example/a.html?a=1&b=2", "http://s.example/c.html"]


def test_the_crawls_fragment_rules_come_from_the_welcome_and_change_with_a_fragment_rules_message(tmp_path):
    """The worker keys its links with the rules the master sends: in the Welcome, then in a FragmentRules when a
    worker joins whose resolvers bring new ones (the master takes them from its Auth)."""
    w = worker(tmp_path)
    song = "https://www.kugou.com/song/#hash=ABC"
    w._normalise_as(p.Welcome(b"\0" * 32, 5.0))
    assert w._links_to_report([song], [], 1) == ["https://www.kugou.com/song/"]
    (tmp_path / "k").mkdir()
    rules = tuple(r for res in worker(tmp_path / "k", {"kugou": {}}).resolvers for r in res.keep_fragment)
    assert rules
    w._normalise_as(p.Welcome(b"\0" * 32, 5.0, keep_fragment=rules))
    w.links.forget()
    assert w._links_to_report([song], [], 1) == [song]


def test_a_worker_announces_its_resolvers_fragment_rules(tmp_path):
    w = worker(tmp_path, {"kugou": {}, "generic": {}})
    assert w._fragment_rules == tuple(r for res in w.resolvers for r in res.keep_fragment)
    assert any("kugou" in r for r in w._fragment_rules)


def test_what_a_page_says_about_its_links_goes_under_the_links_reported_keys(tmp_path):
    w = worker(tmp_path)
    w._normalise_as(p.Welcome(b"\0" * 32, 5.0, drop_params=("utm_source",)))
    named = LinkMeta(title="T", meta_source={"title": "heading"})
    links = w._links_to_report(["http://s.example/stream/1?utm_source=x", "http://s.example/about"], [], 1)
    refs = w._links_to_report(["http://s.example/p/1.m3u#top"], [], 1)
    got = w._link_meta_of({"http://s.example/stream/1?utm_source=x": named, "http://s.example/p/1.m3u#top": named,
                           "http://s.example/not-reported": named}, links, refs)
    assert got == (("http://s.example/stream/1", named), ("http://s.example/p/1.m3u", named))


def _answer(body: bytes, status: int = 200, **headers: str) -> FetchedPage:
    return FetchedPage(url="http://s.example/stream/1", final_url="http://s.example/stream/1", status=status,
                       content_type="audio/mpeg", headers=headers, body=body)


def test_the_bytes_a_page_fetch_read_of_a_stream_start_its_download_only_when_they_are_the_files():
    whole = _started(_answer(b"x" * 1000))
    assert whole is not None and (whole.size, whole.body) == (1000, b"x" * 1000)   # read to its end
    cut = _started(_answer(b"x" * SNIFF_BYTES, **{"content-length": "200000", "etag": '"v1"'}))
    assert cut is not None and (cut.size, cut.etag, cut.url) == (200000, '"v1"', "http://s.example/stream/1")
    assert _started(_answer(b"x" * SNIFF_BYTES)).size is None                       # cut, size unknown
    assert _started(_answer(b"x" * 10, **{"content-encoding": "gzip"})) is None      # not the file's bytes
    assert _started(_answer(b"x" * 10, status=206)) is None
    assert _started(_answer(b"x" * 10, **{"content-length": "5"})) is None           # a lying length
    assert _started(_answer(b"")) is None and _started(None) is None
