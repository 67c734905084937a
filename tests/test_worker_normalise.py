"""A worker keys the links it reports exactly as the master does: with the crawl's options from the Welcome."""

import logging

from crawler import protocol as p
from crawler.worker.config import WorkerConfig
from crawler.worker.server import Worker
from scripts.cluster import write_secret


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


def test_a_fragment_rule_of_a_resolver_the_crawl_lacks_is_said_in_the_log(tmp_path, caplog):
    w = worker(tmp_path, {"kugou": {}, "generic": {}})
    song = "https://www.kugou.com/song/#hash=ABC"
    with caplog.at_level(logging.WARNING, logger="crawler.worker"):
        w._normalise_as(p.Welcome(b"\0" * 32, 5.0))
    assert "lacks fragment rules" in caplog.text
    assert w._links_to_report([song], [], 1) == ["https://www.kugou.com/song/"]
    # With the rule in the crawl's config (the master's default), the fragment names the song and stays.
    caplog.clear()
    rules = tuple(r for res in w.resolvers for r in res.keep_fragment)
    w.links.forget()
    with caplog.at_level(logging.WARNING, logger="crawler.worker"):
        w._normalise_as(p.Welcome(b"\0" * 32, 5.0, keep_fragment=rules))
    assert "lacks fragment rules" not in caplog.text
    assert w._links_to_report([song], [], 1) == [song]
