"""Dedup: the Bloom filter's verdict, with whitelisted URLs rescued from false positives."""

from __future__ import annotations

import pytest

from crawler.bloom import BloomFilter
from crawler.master.dedup import Dedup


class FakeUrlStore:
    """The master's URL database, as far as dedup sees it: a set, and a log of the lookups asked."""

    def __init__(self) -> None:
        self.urls: set[str] = set()
        self.lookups: list[list[str]] = []

    def lookup(self, urls: list[str]) -> set[str]:
        self.lookups.append(list(urls))
        return {u for u in urls if u in self.urls}


WHITELIST = (r"/song/\d+$",)


def make(m: int = 1 << 16, k: int = 4) -> tuple[Dedup, FakeUrlStore]:
    store = FakeUrlStore()
    return Dedup(BloomFilter(m, k), WHITELIST, store.lookup), store


def test_new_urls_once_in_order() -> None:
    dedup, store = make()
    batch = ["http://x/a", "http://x/b", "http://x/a", "http://x/c", "http://x/b"]
    assert dedup.filter_new(batch) == ["http://x/a", "http://x/b", "http://x/c"]
    assert dedup.filter_new(["http://x/c", "http://x/d"]) == ["http://x/d"]
    s = dedup.stats
    assert (s.offered, s.batch_repeats, s.new, s.seen) == (7, 2, 4, 1)
    assert store.lookups == []  # nothing whitelisted was called seen


def test_whitelisted_duplicate_is_checked_and_dropped() -> None:
    dedup, store = make()
    song = "http://x/song/1"
    assert dedup.filter_new([song]) == [song]
    store.urls.add(song)
    assert dedup.filter_new([song, "http://x/page"]) == ["http://x/page"]
    assert store.lookups == [[song]]
    assert (dedup.stats.whitelist_checked, dedup.stats.rescued) == (1, 0)


def test_false_positives_never_lose_a_whitelisted_url() -> None:
    # 256 bits for 2000 URLs: the filter soon believes it has seen everything.
    dedup, store = make(m=256, k=2)
    songs_returned: list[str] = []
    others_returned: list[str] = []
    for batch_no in range(40):
        batch = [f"http://x/song/{batch_no * 25 + i}" for i in range(25)]
        batch += [f"http://x/page/{batch_no * 25 + i}" for i in range(25)]
        batch += batch[:10]  # repeats within the batch
        lookups_before = len(store.lookups)
        new = dedup.filter_new(batch)
        assert len(store.lookups) - lookups_before <= 1  # one batched lookup per call at most
        store.urls.update(new)  # the master records what it accepted before the next batch
        songs_returned += [u for u in new if "/song/" in u]
        others_returned += [u for u in new if "/page/" in u]
    assert sorted(songs_returned) == sorted(f"http://x/song/{i}" for i in range(1000))
    assert len(others_returned) < 1000  # the filter did drop unseen pages: false positives really happened
    assert dedup.stats.new == len(songs_returned) + len(others_returned)
    assert dedup.stats.rescued > 500  # most songs came through only thanks to the exact check
    for lookup in store.lookups:
        assert all("/song/" in u for u in lookup)  # only whitelisted suspects reach the store
    # And a song the store already holds is still a duplicate.
    assert dedup.filter_new(["http://x/song/5"]) == []


def test_without_whitelist_the_store_is_never_asked() -> None:
    store = FakeUrlStore()
    dedup = Dedup(BloomFilter(64, 2), (), store.lookup)
    for i in range(200):
        dedup.filter_new([f"http://x/song/{i}"])
    assert store.lookups == []
    assert dedup.stats.seen > 0  # the tiny filter produced false positives, and nothing rescued them
    assert dedup.stats.as_dict()["rescued"] == 0


# -- the seen-set grows, and says so ------------------------------------------------------------------------

def test_growth_past_the_first_capacity_is_one_warning_and_no_url_is_lost(caplog) -> None:
    import logging

    from crawler.bloom import GrowingBloomFilter

    store = FakeUrlStore()
    # At this rate the 2,000 fixed URLs below meet no false positive (at 1e-3 two or three would be lost, as the
    # rate says: a Bloom filter trades those for memory; the whitelist guards what must never be lost).
    dedup = Dedup(GrowingBloomFilter(100, 1e-6), (), store.lookup)
    assert dedup.figures() == {"urls": 0, "capacity": 100, "first_capacity": 100, "layers": 1,
                               "fp_estimate": 0.0, "fp_rate": 1e-6, "bytes": dedup.bloom.nbytes}
    urls = [f"http://a.test/p{i}" for i in range(2000)]
    with caplog.at_level(logging.INFO, logger="crawler.master"):
        new = []
        for start in range(0, len(urls), 64):
            new += dedup.filter_new(urls[start:start + 64])
    assert new == urls                                       # 20 times the first capacity, nothing lost
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "grew past its first capacity of 100 URLs" in warnings[0].getMessage()
    assert "dedup.expected_urls" in warnings[0].getMessage()
    later = [r for r in caplog.records if r.levelno == logging.INFO and "Bloom filter grew" in r.getMessage()]
    assert len(later) == 3                                   # 100 + 200 + 400 + 800 + 1600: five layers
    f = dedup.figures()
    assert f["urls"] == 2000 and f["layers"] == 5 and f["capacity"] == 3100 and 0 < f["fp_estimate"] <= 1e-6
    assert dedup.filter_new(urls[:10]) == []


def test_the_master_saves_and_reloads_every_layer_and_an_old_snapshot(tmp_path, caplog) -> None:
    """In-process master state: a grown filter survives a restart whole; a snapshot from before the filter could
    grow (one filter sized for the whole rate) still loads instead of being rebuilt."""
    import logging

    from crawler.bloom import BloomFilter, GrowingBloomFilter, capacity_at
    from crawler.master.config import MasterConfig
    from crawler.master.server import Master
    from testkit.cluster import write_secret

    site = "http://music.example.org"
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["a"], "seeds": [site + "/"],
           "secret_file": str(write_secret(tmp_path / "s")), "dedup": {"expected_urls": 100, "fp_rate": 1e-6}}
    cfg = MasterConfig.from_mapping(raw, tmp_path)
    first = Master(cfg)
    first._open_state()
    urls = [f"{site}/p{i}" for i in range(1000)]
    new = first.dedup.filter_new(urls)
    assert new == urls and len(first.bloom.layers) == 4
    first.store.push([(u, 1, 0, "a", None) for u in new])
    first._snapshot_bloom()
    first.store.close()

    with caplog.at_level(logging.INFO, logger="crawler.master"):
        second = Master(cfg)
        second._open_state()
    assert "Bloom filter loaded" in caplog.text and "4 layers" in caplog.text
    assert [(f.m, f.k, f.count) for f in second.bloom.layers] == [(f.m, f.k, f.count) for f in first.bloom.layers]
    assert second.dedup.filter_new(urls) == []
    second.store.close()

    # The old format: one filter of the old sizing, holding what the table holds.
    old = BloomFilter.for_capacity(2000, 1e-6)
    old.add_many([site + "/", *urls])
    old.save(cfg.data_dir / "urls.bloom")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="crawler.master"):
        third = Master(MasterConfig.from_mapping({**raw, "dedup": {"expected_urls": 2000, "fp_rate": 1e-6}},
                                                 tmp_path))
        third._open_state()
    assert "Bloom filter loaded" in caplog.text and "rebuilt" not in caplog.text
    assert isinstance(third.bloom, GrowingBloomFilter) and len(third.bloom.layers) == 1
    assert third.bloom.layers[0].capacity == capacity_at(old.m, old.k, 5e-7)
    assert third.dedup.filter_new(urls) == []
    third.store.close()


def _master_raw(tmp_path, dedup):
    from testkit.cluster import write_secret
    return {"listen": "127.0.0.1:7700", "data_dir": "data", "secret_file": str(write_secret(tmp_path / "secret")),
            "nodes": ["a"], "seeds": ["http://127.0.0.1:8000/"], "dedup": dedup}


@pytest.mark.parametrize("dedup, key, words", [
    ({"bits_per_url": 16}, "dedup.hashes", "go together"),
    ({"hashes": 8}, "dedup.bits_per_url", "go together"),
    ({"bits_per_url": 0, "hashes": 8}, "dedup.bits_per_url", "between 1 and 256"),
    ({"bits_per_url": "many", "hashes": 8}, "dedup.bits_per_url", "expected a number"),
    ({"bits_per_url": 16, "hashes": 0}, "dedup.hashes", "between 1 and 64"),
    ({"bits_per_url": 16, "hashes": 8.5}, "dedup.hashes", "expected an integer"),
    # The paper's sizing cannot meet the default 1e-6: it would grow long before expected_urls.
    ({"bits_per_url": 16, "hashes": 8}, "dedup.bits_per_url", "under dedup.expected_urls"),
    ({"bits_per_url": 16, "hashes": 8, "fp_rate": 0.001}, "dedup.bits_per_url", "raise dedup.fp_rate"),
])
def test_bad_sizing_keys_are_refused(tmp_path, dedup, key, words) -> None:
    from crawler.config import ConfigError
    from crawler.master.config import MasterConfig

    with pytest.raises(ConfigError) as e:
        MasterConfig.from_mapping(_master_raw(tmp_path, dedup), tmp_path)
    assert e.value.key == key and words in str(e.value)


def test_the_paper_sizing_is_taken_with_a_rate_it_can_meet(tmp_path) -> None:
    from crawler.master.config import MasterConfig

    cfg = MasterConfig.from_mapping(_master_raw(tmp_path, {"bits_per_url": 16, "hashes": 8, "fp_rate": 0.002}),
                                    tmp_path)
    assert (cfg.dedup.bits_per_url, cfg.dedup.hashes) == (16.0, 8)
    defaults = MasterConfig.from_mapping(_master_raw(tmp_path, {}), tmp_path).dedup
    assert (defaults.bits_per_url, defaults.hashes) == (None, None)


def test_a_bad_sizing_key_is_one_line_and_exit_2(tmp_path) -> None:
    import subprocess
    import sys

    import yaml

    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(_master_raw(tmp_path, {"bits_per_url": 16, "hashes": 8})))
    r = subprocess.run([sys.executable, "-m", "crawler.master", "--config", str(cfg)], check=False,
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "dedup.bits_per_url" in r.stderr and "Traceback" not in r.stderr


def test_the_status_carries_the_seen_set_and_prints_it() -> None:
    from crawler.master.live import build_status, status_text

    db = {"states": {"done": 3}, "frontier_by_node": {}, "nodes": {}, "discards": {}, "audio": {}, "figures": {}}
    dedup = {"urls": 1234, "capacity": 1500, "first_capacity": 100, "layers": 4, "fp_estimate": 7.6e-7,
             "fp_rate": 1e-6, "bytes": 6288}
    for running in (True, False):      # a stopped master's last view still holds: its filter was saved with it
        st = build_status(db, {"dedup": dedup, "running": running}, ["w1"], 0.0, running=running)
        assert st["dedup"] == dedup
        text = status_text(st)
        assert "seen-set (Bloom filter): 1234 URLs in 4 layers for 1500" in text and "7.6e-07" in text
    assert build_status(db, None, ["w1"], 0.0, running=False)["dedup"] is None
    assert "seen-set" not in status_text(build_status(db, None, ["w1"], 0.0, running=False))
