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
