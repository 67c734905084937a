"""Benchmark the master's Bloom filter at 1M and 10M URLs, beside rbloom and pybloom-live when installed; or the
master's seen-set (the growing filter) at N URLs, projected to a billion.

    python scripts/bench_bloom.py            # 1M and 10M
    python scripts/bench_bloom.py --quick    # 1M only
    python scripts/bench_bloom.py --seen-set 100000000 [--fp 1e-4]   # the seen-set at 100M, projected to 1B

The seen-set run measures two masters at N URLs: one whose ``dedup.expected_urls`` is N (one layer) and one whose
crawl outgrew it tenfold (``expected_urls`` N/10: four layers). For each it prints adds/s and tests/s (a test of a
URL it holds and of one it does not, in the proportions of the run), the bytes its bits take and the process's
resident growth, and the false-positive rate measured on absent URLs against the configured one (which the run's
``--fp`` sets: at the default 1e-6 the thousands of false positives a measurement needs take billions of probes).
It then projects to a billion URLs: memory exactly (the layers' sizes follow from the sizing rule), and tests/s from
the measured cost per layer, since at 100M the bits are already far outside the CPU caches.

For each size it prints adds/s and tests/s (batch mode, the master's hot path; per CPU second of this
process, with wall-clock rates beside them since the machine may be shared), bytes per URL, resident
memory against the m/8 bytes the bits need, and the measured false-positive rate beside the theoretical
one. Enough absent URLs are probed to expect at least 2,000 false positives, so the measured rate is good
to about 7% (three standard deviations) and the 15% target is a real test. Keys are made a batch at a
time and their making is not timed.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from collections.abc import Callable, Iterator

from crawler.bloom import BloomFilter, GrowingBloomFilter

BATCH = 100_000  # URLs per add_many/contains_many call


def present(n: int) -> Iterator[list[str]]:
    for start in range(0, n, BATCH):
        yield [f"https://www.site{i % 997}.example/music/{i // 997}/song_{i}.html"
               for i in range(start, min(n, start + BATCH))]


def absent(n: int) -> Iterator[list[str]]:
    for start in range(0, n, BATCH):
        yield [f"https://cdn{i % 31}.other.example/track/{i}?from=list"
               for i in range(start, min(n, start + BATCH))]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Clock:
    """CPU seconds of this process (the figure that does not depend on what else the machine runs), and
    wall seconds beside them; both count only the time spent inside the timed operations."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def rate(self, n: int) -> str:
        return f"{n / self.cpu / 1e6:5.2f}M (wall {n / self.wall / 1e6:5.2f}M)"


def timed(batches: Iterator[list[str]], op: Callable[[list[str]], object],
          clock: Clock | None = None) -> tuple[Clock, list[object]]:
    """Run ``op`` on every batch; the clock and op's results."""
    clock = clock or Clock()
    results = []
    for batch in batches:
        c0, w0 = time.process_time(), time.perf_counter()
        results.append(op(batch))
        clock.cpu += time.process_time() - c0
        clock.wall += time.perf_counter() - w0
    return clock, results


def bench_ours(label: str, make: Callable[[], BloomFilter], n: int, probes: int, fp: float | None) -> None:
    gc.collect()
    before = rss()
    bf = make()
    held = rss() - before
    adds, _ = timed(present(n), bf.add_many)
    tests, hits = timed(present(n), bf.contains_many)
    tests, misses = timed(absent(probes), bf.contains_many, tests)
    assert all(all(h) for h in hits), "false negative"
    measured = sum(sum(m) for m in misses) / probes
    theory = bf.expected_fp_rate(n)
    test_rate = (n + probes) / tests.cpu
    print(f"  {label:<26} m={bf.m} k={bf.k}")
    print(f"    adds/s {adds.rate(n)}   tests/s {tests.rate(n + probes)}")
    print(f"    bytes/URL {bf.m / 8 / n:6.3f}   resident {held / 1e6:.1f} MB = {held / (bf.m / 8):.3f} x m/8")
    dev = (measured - theory) / theory
    print(f"    false positives: measured {measured:.3e}  theory {theory:.3e}  ({dev:+.1%})")
    checks = [("rate within 15% of theory", abs(dev) <= 0.15), ("tests/s >= 1M", test_rate >= 1e6),
              ("memory within 5% of m/8", abs(held / (bf.m / 8) - 1) <= 0.05)]
    if fp is not None:
        checks.append((f"measured rate under p={fp:g}", measured <= fp))
    print("    " + "   ".join(f"[{'ok' if ok else 'MISS'}] {name}" for name, ok in checks))


def bench_other(label: str, make: Callable[[], object], add_batch: Callable[[object, list[str]], object],
                test_batch: Callable[[object, list[str]], list[bool]], size_bits: Callable[[object], int],
                n: int, probes: int) -> None:
    bf = make()
    adds, _ = timed(present(n), lambda b: add_batch(bf, b))
    tests, _ = timed(present(n), lambda b: test_batch(bf, b))
    tests, misses = timed(absent(probes), lambda b: test_batch(bf, b), tests)
    measured = sum(sum(m) for m in misses) / probes
    print(f"  {label:<26} adds/s {adds.rate(n)}   tests/s {tests.rate(n + probes)}")
    print(f"    bytes/URL {size_bits(bf) / 8 / n:6.3f} (its own size)   fp measured {measured:.3e}")


def chain_bytes(expected: int, n: int, fp: float) -> tuple[int, int]:
    """(bytes, layers) of a seen-set configured for ``expected`` URLs at ``fp`` once it holds n: computed from the
    sizing rule, nothing allocated."""
    capacity, total, layers, held = expected, 0, 0, 0
    while True:
        m, _ = BloomFilter.sizing(capacity, fp / 2 ** (layers + 1))
        total += m // 8
        layers += 1
        held += capacity
        if held >= n:
            return total, layers
        capacity *= 2


def bench_seen_set(n: int, fp: float) -> None:
    probes = max(n // 10, math.ceil(2000 / fp))
    sample = n // 10
    print(f"seen-set: n = {n:,} URLs added, {sample:,} of them tested again, {probes:,} absent probes; "
          f"dedup.fp_rate = {fp:g}")
    per_test: dict[int, float] = {}
    for label, expected in (("expected_urls = n", n), ("expected_urls = n/10 (grown)", n // 10)):
        gc.collect()
        before = rss()
        seen = GrowingBloomFilter(expected, fp)
        # Each batch's answers are counted and dropped: a hundred million kept would outweigh the filter.
        adds, _ = timed(present(n), lambda b: seen.add_many(b).count(True))
        held = rss() - before
        tests, hits = timed(present(sample), lambda b: seen.contains_many(b).count(True))
        tests, misses = timed(absent(probes), lambda b: seen.contains_many(b).count(True), tests)
        assert sum(hits) == sample, "false negative"     # type: ignore[arg-type]
        measured = sum(misses) / probes                   # type: ignore[arg-type]
        layers = len(seen.layers)
        per_test[layers] = tests.cpu / (sample + probes)
        print(f"  {label:<30} {layers} layer{'s' if layers > 1 else ''}, capacity {seen.capacity:,}")
        print(f"    adds/s {adds.rate(n)}   tests/s {tests.rate(sample + probes)}")
        print(f"    bits {seen.nbytes / 1e6:,.0f} MB = {seen.nbytes * 8 / n:.1f} bits/URL; resident growth "
              f"{held / 1e6:,.0f} MB")
        print(f"    false positives: measured {measured:.3e}  estimated {seen.expected_fp_rate():.3e}  "
              f"configured {fp:g}  [{'ok' if measured <= fp else 'MISS'}] measured <= configured")
        del seen
    billion = 1_000_000_000
    one, grown = per_test[min(per_test)], per_test[max(per_test)]
    slope = (grown - one) / max(1, max(per_test) - min(per_test))
    print("  projected to 1B URLs (memory from the sizing rule; tests/s from the measured CPU per test and layer):")
    for label, expected, rate in (("expected_urls = 1B", billion, fp), ("expected_urls = 100M, grown", billion // 10, fp),
                                  ("expected_urls = 10M (default), grown", 10_000_000, fp),
                                  ("expected_urls = 1B at fp_rate 1e-6", billion, 1e-6),
                                  ("expected_urls = 10M at 1e-6, grown", 10_000_000, 1e-6)):
        nbytes, layers = chain_bytes(expected, billion, rate)
        cost = one + slope * (layers - 1)
        print(f"    {label:<38} {layers} layer{'s' if layers > 1 else ''}  {nbytes / 2**30:5.2f} GiB "
              f"({nbytes * 8 / billion:.1f} bits/URL)  tests/s about {1 / cost / 1e6:.2f}M")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M URLs only")
    ap.add_argument("--fp", type=float, help="false-positive rate to size for (default 1e-3; 1e-4 with --seen-set)")
    ap.add_argument("--no-others", action="store_true", help="skip rbloom and pybloom-live")
    ap.add_argument("--seen-set", type=int, metavar="N", help="measure the master's seen-set at N URLs instead, "
                    "projected to 1B (--fp defaults to 1e-4 there)")
    args = ap.parse_args()
    if args.seen_set:
        bench_seen_set(args.seen_set, args.fp or 1e-4)
        return
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000]
    p = args.fp or 1e-3
    for n in sizes:
        probes = max(n, math.ceil(2000 / p))
        print(f"n = {n:,} URLs, {probes:,} absent probes")
        bench_ours(f"for_capacity(p={p:g})", lambda n=n: BloomFilter.for_capacity(n, p), n, probes, p)
        paper_probes = max(n, math.ceil(2000 / 5.7e-4))
        bench_ours("paper: 16 bits, k=8", lambda n=n: BloomFilter.with_bits_per_item(n, 16, 8), n,
                   paper_probes, None)
        if args.no_others:
            continue
        try:
            import rbloom
        except ImportError:
            print("  rbloom                     not installed (pip install rbloom)")
        else:
            bench_other(f"rbloom(p={p:g})", lambda n=n: rbloom.Bloom(n, p), lambda bf, b: bf.update(b),
                        lambda bf, b: list(map(bf.__contains__, b)), lambda bf: bf.size_in_bits, n, probes)
        try:
            import pybloom_live
        except ImportError:
            print("  pybloom-live               not installed (pip install pybloom-live)")
        else:
            def add_each(bf: object, batch: list[str]) -> None:
                for key in batch:
                    bf.add(key)  # type: ignore[attr-defined]

            bench_other(f"pybloom-live(p={p:g})", lambda n=n: pybloom_live.BloomFilter(n, p), add_each,
                        lambda bf, b: list(map(bf.__contains__, b)), lambda bf: bf.num_bits, n, probes)


if __name__ == "__main__":
    main()
