"""Dedup: the Bloom filter's verdict, with whitelisted URLs rescued from false positives."""

from __future__ import annotations

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
