"""Which discovered URLs are new: the Bloom filter, with an exact check for whitelisted URLs.

A Bloom filter false positive drops a URL silently. For most pages that costs little, but losing an
audio detail page loses the audio, so (paper, section 3.3.2) URLs matching the whitelist patterns are
looked up in the master's URL store whenever the filter claims it has seen them. The store is asked once
per batch, and only about the whitelisted URLs the filter calls seen, so the hot path stays in the filter.

The filter grows (crawler/bloom.py GrowingBloomFilter): past its first capacity it adds a layer at a tighter
rate, so its false-positive rate stays under ``dedup.fp_rate`` at any size. The first growth is logged as a
WARNING (the crawl outgrew ``dedup.expected_urls``: the next run should be configured for its size); later
layers at INFO.

Contract with the master: every URL ``filter_new`` returns must be in the exact store before the next
call, or a whitelisted one the master dropped in between would come back as new (which is the safe
direction, but a repeat all the same).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from itertools import compress
from typing import Any

from crawler.bloom import BloomFilter, GrowingBloomFilter

__all__ = ["Dedup", "DedupStats"]

log = logging.getLogger("crawler.master")


@dataclass
class DedupStats:
    """Running totals since the master started, exported as crawler_dedup_urls_total{result}."""

    offered: int = 0             # URLs passed to filter_new, repeats included
    batch_repeats: int = 0       # repeats of a URL within one batch
    new: int = 0                 # URLs returned as new (rescued ones included)
    seen: int = 0                # dropped because the filter had seen them (true duplicates and false positives)
    whitelist_checked: int = 0   # whitelisted URLs the filter called seen, looked up in the store
    rescued: int = 0             # of those, the ones the store did not know: false positives caught

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Dedup:
    """Bloom filter plus whitelist; pure: the exact store is reached through ``exact_lookup`` only."""

    def __init__(self, bloom: GrowingBloomFilter | BloomFilter, whitelist: tuple[str, ...],
                 exact_lookup: Callable[[list[str]], set[str]]) -> None:
        """``exact_lookup(urls)`` returns the subset of ``urls`` the master's URL store already holds. A plain
        ``BloomFilter`` (tests, benchmarks) never grows."""
        self.bloom = bloom
        self._layers = self._layer_count()
        self.whitelist = tuple(whitelist)
        self._patterns = tuple(re.compile(p) for p in self.whitelist)
        self._lookup = exact_lookup
        self.stats = DedupStats()

    def whitelisted(self, url: str) -> bool:
        return any(p.search(url) for p in self._patterns)

    def filter_new(self, urls: Sequence[str]) -> list[str]:
        """The URLs of ``urls`` not seen before, in first-seen order, each once; they are now marked seen."""
        stats = self.stats
        unique = list(dict.fromkeys(urls))
        stats.offered += len(urls)
        stats.batch_repeats += len(urls) - len(unique)
        new_flags = self.bloom.add_many(unique)
        if self._layer_count() != self._layers:
            self._grew()
        if self._patterns:
            suspects = [u for u in compress(unique, (not f for f in new_flags)) if self.whitelisted(u)]
            if suspects:
                stats.whitelist_checked += len(suspects)
                known = self._lookup(suspects)
                rescued = {u for u in suspects if u not in known}
                if rescued:
                    stats.rescued += len(rescued)
                    new_flags = [f or u in rescued for u, f in zip(unique, new_flags)]
        out = list(compress(unique, new_flags))
        stats.new += len(out)
        stats.seen += len(unique) - len(out)
        return out

    def _layer_count(self) -> int:
        return len(self.bloom.layers) if isinstance(self.bloom, GrowingBloomFilter) else 1

    def _grew(self) -> None:
        before, self._layers = self._layers, self._layer_count()
        f = self.figures()
        line = (f"{f['urls']} URLs, {f['layers']} layers for {f['capacity']} URLs, estimated false-positive rate "
                f"{f['fp_estimate']:.2g} (target {f['fp_rate']:g}), {f['bytes']} bytes")
        if before == 1:
            log.warning("Bloom filter grew past its first capacity of %d URLs (dedup.expected_urls is too small for "
                        "this crawl; raise it to keep the filter in one layer): %s", f["first_capacity"], line)
        else:
            log.info("Bloom filter grew: %s", line)

    def figures(self) -> dict[str, Any]:
        """The filter's size and health, as status ``dedup`` and the crawler_bloom_* gauges show them."""
        b = self.bloom
        return {"urls": b.count, "capacity": b.capacity, "layers": self._layer_count(),
                "first_capacity": b.layers[0].capacity if isinstance(b, GrowingBloomFilter) else b.capacity,
                "fp_estimate": b.expected_fp_rate(),
                "fp_rate": b.fp_rate if isinstance(b, GrowingBloomFilter) else b.expected_fp_rate(b.capacity),
                "bytes": b.nbytes}
