"""The Bloom filter: sizing, the one-key and batch paths, false-positive rate, and snapshots."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawler import bloom
from crawler.bloom import BloomFileError, BloomFilter, GrowingBloomFilter


def test_for_capacity_is_optimal_and_honours_the_rate() -> None:
    bf = BloomFilter.for_capacity(1_000_000, 1e-4)
    # Theory: m/n = -ln p / ln(2)^2 = 19.17 bits, k = 13.3.
    assert 19.1 < bf.m / 1_000_000 < 19.3
    assert bf.k in (13, 14)
    assert bf.m % 64 == 0
    assert bf.expected_fp_rate(1_000_000) <= 1e-4
    assert bf.expected_fp_rate(1_000_000) > 0.95e-4  # not oversized either


def test_paper_parameters_give_their_true_rate() -> None:
    bf = BloomFilter.with_bits_per_item(1_000_000, 16, 8)
    assert (bf.m, bf.k) == (16_000_000, 8)
    assert bf.expected_fp_rate(1_000_000) == pytest.approx(5.74e-4, rel=0.01)
    assert bf.nbytes == 2_000_000


@pytest.mark.parametrize("bad", [
    lambda: BloomFilter.for_capacity(0, 0.01), lambda: BloomFilter.for_capacity(10, 0.0),
    lambda: BloomFilter.for_capacity(10, 1.0), lambda: BloomFilter.with_bits_per_item(10, 0, 3),
    lambda: BloomFilter(64, 0), lambda: BloomFilter(0, 3),
])
def test_bad_parameters_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        bad()


def test_add_and_contains() -> None:
    bf = BloomFilter.for_capacity(1000, 0.01)
    assert "http://a/1" not in bf
    assert bf.add("http://a/1") is True
    assert bf.add("http://a/1") is False
    assert "http://a/1" in bf
    assert bf.count == 1
    assert "http://a/2" not in bf
    assert "é".encode() not in bf
    bf.add("é")
    assert "é".encode() in bf  # str keys hash as their UTF-8 bytes


def test_add_many_reports_first_occurrence_only() -> None:
    bf = BloomFilter.for_capacity(10_000, 0.001)
    bf.add("old")
    keys = ["a", "b", "a", "old", "c", "b", "a"]
    assert bf.add_many(keys) == [True, True, False, False, True, False, False]
    assert bf.count == 4
    assert bf.add_many(keys) == [False] * len(keys)
    assert bf.contains_many(["a", "zz", "c"]) == [True, False, True]


def test_batches_span_chunks() -> None:
    n = bloom._CHUNK * 3 + 7
    keys = [f"k{i}" for i in range(n)]
    bf = BloomFilter.for_capacity(10 * n, 1e-6)
    # Repeats placed inside one chunk and across a chunk boundary.
    batch = keys + keys[:5] + [keys[bloom._CHUNK - 1], keys[bloom._CHUNK]]
    got = bf.add_many(batch)
    assert got == [True] * n + [False] * 7
    assert bf.count == n


@pytest.fixture(params=["narrow", "wide"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both index forms; the wide one normally needs m above 2**32 bits (512 MiB), so it is forced here."""
    if request.param == "wide":
        monkeypatch.setattr(bloom, "_NARROW_MAX_M", 0)
    return request.param


def test_batch_and_single_paths_set_the_same_bits(lanes: str) -> None:
    keys = [f"http://example.com/{i}" for i in range(2000)] + ["", "中文", "x" * 500]
    one, many = BloomFilter(50_000, 7), BloomFilter(50_000, 7)
    assert one._half == (32 if lanes == "narrow" else 64)
    for key in keys:
        one.add(key)
    many.add_many(keys)
    assert one._bits == many._bits
    assert one._bits.count() > 0
    assert many.contains_many(keys) == [key in one for key in keys]


def test_measured_false_positive_rate_matches_theory(lanes: str) -> None:
    n = 20_000
    bf = BloomFilter.for_capacity(n, 0.01)
    bf.add_many([f"http://in.example/{i}" for i in range(n)])
    probes = [f"http://out.example/{i}" for i in range(100_000)]
    rate = sum(bf.contains_many(probes)) / len(probes)
    theory = bf.expected_fp_rate(n)
    # 1000 expected hits: three standard deviations are under 10%.
    assert abs(rate - theory) / theory < 0.15
    assert math.isclose(bf.fill_ratio(), 0.5, abs_tol=0.02)  # an optimal filter is half full


def test_small_tight_filters_keep_their_rate(lanes: str) -> None:
    """The first layers of a growing filter are small and tight (45 keys at 5e-7 in the dedup end-to-end test).
    Plain double hashing gave such filters ten to two hundred times the rate asked for, since a key whose two hash
    values fall near a member's shares all its indices; triple hashing keeps them at their rate."""
    hits = probes = 0
    for t in range(100):
        bf = BloomFilter.for_capacity(50, 1e-5)
        bf.add_many([f"http://in.example/{t}/{i}" for i in range(50)])
        out = [f"http://out.example/{t}/{j}" for j in range(20_000)]
        hits += sum(bf.contains_many(out))
        probes += len(out)
    # About 20 hits expected at 1e-5 (double hashing gave 150 and more): 60 is nine standard deviations up.
    assert hits / probes <= 3e-5, hits


def test_snapshots_of_the_double_hashing_versions_are_refused_as_mismatched(tmp_path: Path) -> None:
    """Versions 1 (one filter) and 2 (a chain of them) set other bits for the same key: loading them would answer
    wrongly, so they are refused and the master rebuilds its filter from the URL table."""
    one, chain = tmp_path / "one", tmp_path / "chain"
    BloomFilter.for_capacity(100, 0.01).save(one)
    GrowingBloomFilter(100, 0.01).save(chain)
    for path, offset, old in ((one, 8, 1), (chain, 8, 2)):
        raw = bytearray(path.read_bytes())
        raw[offset:offset + 2] = old.to_bytes(2, "little")
        path.write_bytes(bytes(raw))
        with pytest.raises(BloomFileError, match=f"mismatched: format version {old}"):
            GrowingBloomFilter.load(path, 0.01)
    with pytest.raises(BloomFileError, match="mismatched: format version 1"):
        BloomFilter.load(one)


@settings(derandomize=True, max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40)), max_size=300),
       st.integers(min_value=1, max_value=16), st.booleans())
def test_no_false_negatives_even_after_a_snapshot(tmp_path: Path, lanes: str, keys, k: int,
                                                  batched: bool) -> None:
    # A small filter: false positives are common, false negatives must never happen.
    bf = BloomFilter(max(64, len(keys) * 4), k)
    if batched:
        bf.add_many(keys)
    else:
        for key in keys:
            bf.add(key)
    assert all(key in bf for key in keys)
    assert all(bf.contains_many(keys))
    path = tmp_path / "f.bloom"
    bf.save(path)
    back = BloomFilter.load(path, expect_m=bf.m, expect_k=k)
    assert all(back.contains_many(keys))
    assert all(key in back for key in keys)


# -- snapshots -------------------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path: Path) -> tuple[BloomFilter, Path]:
    bf = BloomFilter.for_capacity(5000, 0.001)
    bf.add_many([f"u{i}" for i in range(3000)])
    path = tmp_path / "state" / "urls.bloom"
    path.parent.mkdir()
    bf.save(path)
    return bf, path


def test_snapshot_round_trip(saved: tuple[BloomFilter, Path]) -> None:
    bf, path = saved
    back = BloomFilter.load(path)
    assert (back.m, back.k, back.capacity, back.count) == (bf.m, bf.k, bf.capacity, bf.count)
    assert back._bits == bf._bits
    assert back.add("u1") is False and back.add("new one") is True
    assert os.listdir(path.parent) == ["urls.bloom"]  # no temporary file left behind


def test_missing_snapshot(tmp_path: Path) -> None:
    with pytest.raises(BloomFileError, match="missing") as err:
        BloomFilter.load(tmp_path / "nope.bloom")
    assert err.value.reason == "missing"


@pytest.mark.parametrize(("offset", "what"), [(-1, "payload"), (20, "header field"), (0, "magic"),
                                              (bloom._PREFIX.size + 3, "digest")])
def test_corrupt_snapshot_is_refused(saved: tuple[BloomFilter, Path], offset: int, what: str) -> None:
    _, path = saved
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(BloomFileError) as err:
        BloomFilter.load(path)
    assert err.value.reason == "corrupt", what


@pytest.mark.parametrize("keep", [0, 10, bloom._HEADER_LEN, bloom._HEADER_LEN + 100])
def test_truncated_snapshot_is_refused(saved: tuple[BloomFilter, Path], keep: int) -> None:
    _, path = saved
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(BloomFileError, match="corrupt"):
        BloomFilter.load(path)


def test_mismatched_snapshot_is_refused(saved: tuple[BloomFilter, Path]) -> None:
    bf, path = saved
    BloomFilter.load(path, expect_m=bf.m, expect_k=bf.k)
    for kwargs in ({"expect_m": bf.m + 64}, {"expect_k": bf.k + 1}):
        with pytest.raises(BloomFileError, match="mismatched") as err:
            BloomFilter.load(path, **kwargs)
        assert err.value.reason == "mismatched"


def test_failed_save_keeps_the_previous_snapshot(saved: tuple[BloomFilter, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    bf, path = saved
    before = path.read_bytes()
    bf.add_many([f"v{i}" for i in range(100)])

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(bloom.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        bf.save(path)
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == ["urls.bloom"]


def test_a_save_on_another_thread_while_keys_are_added_holds_every_earlier_key(tmp_path):
    """The master saves its live filter from a thread while the loop goes on adding keys: the file must pass its
    digest check and hold every key added before the save began (keys added during it may or may not be in)."""
    bloom = BloomFilter.for_capacity(5_000_000, 1e-6)      # 18 MB of bits: the save takes a while
    before = [f"http://a.test/{i}" for i in range(20_000)]
    bloom.add_many(before)
    saver = threading.Thread(target=bloom.save, args=(tmp_path / "snap",))
    during = 0
    saver.start()
    while saver.is_alive():
        bloom.add_many([f"http://b.test/{during + i}" for i in range(500)])
        during += 500
    saver.join()
    assert during > 0, "no key was added while the save ran"
    loaded = BloomFilter.load(tmp_path / "snap")       # raises if the digest does not match the bits
    assert loaded.count == len(before)
    assert all(k in loaded for k in before)


def test_a_growing_filter_holds_every_key_and_keeps_its_rate_past_many_capacities():
    grown = GrowingBloomFilter(1_000, 0.01)
    keys = [f"k{i}" for i in range(60_000)]
    for start in range(0, len(keys), 777):           # batches that straddle the filters' capacities
        grown.add_many(keys[start:start + 777])
    assert len(grown._filters) == 6                  # 1k + 2k + 4k + 8k + 16k + 32k > 60k
    assert all(f.count <= f.capacity for f in grown._filters)
    assert 0.99 * len(keys) < grown.count <= len(keys) and all(k in grown for k in keys)
    others = [f"other{i}" for i in range(200_000)]
    rate = sum(k in grown for k in others) / len(others)
    assert 0.001 < rate < 0.01, rate                  # under the rate asked for, and not an empty answer


def test_a_growing_filter_finds_keys_added_by_another_thread_while_it_is_read():
    grown = GrowingBloomFilter(1_000, 0.01)
    keys = [f"k{i}" for i in range(20_000)]

    def add() -> None:
        for start in range(0, len(keys), 100):
            grown.add_many(keys[start:start + 100])

    adders = [threading.Thread(target=add) for _ in range(2)]
    for t in adders:
        t.start()
    while any(t.is_alive() for t in adders):
        assert "k0" in grown or grown.count == 0
    for t in adders:
        t.join()
    assert all(k in grown for k in keys)
    assert all(f.count <= f.capacity for f in grown._filters)


# -- the growing filter as the master's seen-set -------------------------------------------------------------

def test_capacity_at_is_the_last_count_within_the_rate():
    for m, k, rate in ((16_000_000, 8, 1e-3), (28_800, 20, 5e-7), (640, 3, 0.05)):
        n = bloom.capacity_at(m, k, rate)
        assert bloom._fp_rate(m, k, n) <= rate < bloom._fp_rate(m, k, n + 1)


def test_a_growing_filter_reports_novelty_across_its_layers():
    grown = GrowingBloomFilter(100, 0.01)
    assert grown.add_many([f"a{i}" for i in range(100)]) == [True] * 100
    assert len(grown.layers) == 1
    # The next batch fills a second layer; the old keys in it are seen, in the first layer, and take no room.
    keys = [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(150)]
    flags = grown.add_many(keys)
    assert len(grown.layers) == 2 and flags[:50] == [False] * 50 and sum(flags[50:]) >= 148
    assert grown.layers[1].count == sum(flags[50:])
    assert grown.add_many(["a7", "b7", "c1", "c1"]) == [False, False, True, False]


def test_keys_an_older_layer_holds_set_no_bits_in_the_newest():
    grown = GrowingBloomFilter(1000, 0.01)
    grown.add_many([f"a{i}" for i in range(1000)])
    grown.add_many(["b0"])                                  # opens the second layer
    newest = grown.layers[1]
    before = newest._bits.count()
    assert grown.add_many([f"a{i}" for i in range(1000)]) == [False] * 1000
    assert newest._bits.count() == before and newest.count == 1


@pytest.mark.parametrize("lanes", ["narrow", "wide"])
def test_a_grown_filter_keeps_its_rate_at_ten_times_its_first_capacity(lanes, monkeypatch):
    if lanes == "wide":
        monkeypatch.setattr(bloom, "_NARROW_MAX_M", 0)
    grown = GrowingBloomFilter(10_000, 0.01)
    keys = [f"https://site.example/song/{i}" for i in range(100_000)]
    for start in range(0, len(keys), 4096):
        grown.add_many(keys[start:start + 4096])
    assert len(grown.layers) == 4                     # 10k + 20k + 40k + 80k >= 100k
    assert grown.count <= grown.capacity and all(f.count <= f.capacity for f in grown.layers)
    assert all(grown.contains_many(keys)) and all(k in grown for k in keys[::97])
    others = [f"https://other.example/{i}" for i in range(300_000)]
    measured = sum(grown.contains_many(others)) / len(others)
    assert grown.expected_fp_rate() <= 0.01
    # 300k probes at the ~0.6% the layers give: about 1,800 hits, so +-10% is three standard deviations and more.
    assert 0.5 * grown.expected_fp_rate() < measured <= 0.01, (measured, grown.expected_fp_rate())


def test_a_growing_filter_hashes_each_key_once_for_the_whole_chain(monkeypatch):
    grown = GrowingBloomFilter(100, 0.01)
    grown.add_many([f"k{i}" for i in range(1000)])     # 100 + 200 + 400 + 800
    assert len(grown.layers) == 4
    calls = []
    real = bloom.mmh3.hash_bytes

    def counting(key):
        calls.append(key)
        return real(key)

    monkeypatch.setattr(bloom.mmh3, "hash_bytes", counting)
    keys = [f"k{i}" for i in range(500, 1500)]
    flags = grown.add_many(keys)
    assert len(calls) == len(keys) and flags[:500] == [False] * 500
    calls.clear()
    assert all(grown.contains_many(keys))
    assert len(calls) == len(keys)


def test_the_paper_sizing_makes_the_first_layer():
    grown = GrowingBloomFilter(10_000, 0.002, bits_per_item=16, hashes=8)
    first = grown.layers[0]
    assert (first.m, first.k) == (160_000, 8)
    assert first.capacity == bloom.capacity_at(160_000, 8, 0.001) > 10_000
    with pytest.raises(ValueError, match="together"):
        GrowingBloomFilter(10, 0.01, bits_per_item=16)


def grown_filter(layers: int) -> GrowingBloomFilter:
    grown = GrowingBloomFilter(500, 0.01)
    i = 0
    while len(grown.layers) < layers:
        grown.add_many([f"u{j}" for j in range(i, i + 300)])
        i += 300
    grown.add_many([f"u{j}" for j in range(i, i + 100)])
    return grown


def test_a_growing_snapshot_round_trips_every_layer(tmp_path):
    grown = grown_filter(4)
    path = tmp_path / "urls.bloom"
    grown.save(path)
    back = GrowingBloomFilter.load(path, 0.01)
    assert [(f.m, f.k, f.capacity, f.count) for f in back.layers] == \
        [(f.m, f.k, f.capacity, f.count) for f in grown.layers]
    assert all(a._bits == b._bits for a, b in zip(back.layers, grown.layers))
    assert os.listdir(tmp_path) == ["urls.bloom"]
    # It goes on growing from where it was.
    before = len(back.layers)
    back.add_many([f"more{i}" for i in range(back.capacity)])
    assert len(back.layers) == before + 1 and all(f.count <= f.capacity for f in back.layers)
    GrowingBloomFilter.load(path, 0.01, expect_first={(grown.layers[0].m, grown.layers[0].k)})
    for kwargs, reason in (({"fp_rate": 0.02}, "mismatched"), ({"expect_first": {(64, 3)}}, "mismatched")):
        with pytest.raises(BloomFileError) as err:
            GrowingBloomFilter.load(path, **{"fp_rate": 0.01, **kwargs})
        assert err.value.reason == reason


def test_a_damaged_growing_snapshot_is_refused(tmp_path):
    grown = grown_filter(3)
    path = tmp_path / "urls.bloom"
    grown.save(path)
    good = path.read_bytes()
    second = bloom._CHAIN_HEADER_LEN + bloom._HEADER_LEN + grown.layers[0].nbytes
    for offset in (0, 12, bloom._CHAIN_PREFIX.size + 1, bloom._CHAIN_HEADER_LEN + 20, second + 20, len(good) - 1):
        data = bytearray(good)
        data[offset] ^= 0x04
        path.write_bytes(bytes(data))
        with pytest.raises(BloomFileError) as err:
            GrowingBloomFilter.load(path, 0.01)
        assert err.value.reason == "corrupt", offset
    for keep in (5, bloom._CHAIN_HEADER_LEN, second, len(good) - 1):
        path.write_bytes(good[:keep])
        with pytest.raises(BloomFileError, match="corrupt"):
            GrowingBloomFilter.load(path, 0.01)
    path.write_bytes(good + b"\0")
    with pytest.raises(BloomFileError, match="corrupt"):
        GrowingBloomFilter.load(path, 0.01)


def test_an_old_single_filter_snapshot_loads_as_a_first_layer(tmp_path):
    """The master's snapshot from before it could grow: one filter sized for the whole rate at expected_urls."""
    old = BloomFilter.for_capacity(1000, 0.01)
    old.add_many([f"u{i}" for i in range(700)])
    old.save(tmp_path / "urls.bloom")
    back = GrowingBloomFilter.load(tmp_path / "urls.bloom", 0.01, expect_first={BloomFilter.sizing(1000, 0.01)})
    (first,) = back.layers
    assert first._bits == old._bits and first.count == old.count
    # It takes what it can within half the rate, then grows.
    assert first.capacity == bloom.capacity_at(old.m, old.k, 0.005) < 1000
    back.add_many([f"v{i}" for i in range(1000)])
    assert len(back.layers) == 2 and back.expected_fp_rate() <= 0.01
    assert all(f"u{i}" in back for i in range(700))
    # One filled past what it takes at half the rate cannot join a chain that keeps the rate.
    old.add_many([f"w{i}" for i in range(300)])
    old.save(tmp_path / "urls.bloom")
    with pytest.raises(BloomFileError, match="mismatched"):
        GrowingBloomFilter.load(tmp_path / "urls.bloom", 0.01)


def test_a_growing_save_on_another_thread_while_it_grows_holds_every_earlier_key(tmp_path):
    grown = GrowingBloomFilter(200_000, 1e-6)          # a few MB: the save takes a while
    before = [f"http://a.test/{i}" for i in range(150_000)]
    grown.add_many(before)
    saver = threading.Thread(target=grown.save, args=(tmp_path / "snap",))
    during = 0
    saver.start()
    while saver.is_alive() or during < 100_000:        # past the first layer: the chain grows meanwhile
        grown.add_many([f"http://b.test/{during + i}" for i in range(1000)])
        during += 1000
    saver.join()
    loaded = GrowingBloomFilter.load(tmp_path / "snap", 1e-6)
    assert len(grown.layers) == 2
    assert all(loaded.contains_many(before))


def test_a_failed_growing_save_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    grown = grown_filter(2)
    path = tmp_path / "urls.bloom"
    grown.save(path)
    before = path.read_bytes()
    grown.add_many([f"x{i}" for i in range(2000)])         # more layers now

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(bloom.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        grown.save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["urls.bloom"]
    assert len(GrowingBloomFilter.load(path, 0.01).layers) == 2
