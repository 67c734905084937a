"""The double-hash node table: which crawl node gets a URL (paper, section 3.4).

The config lists the M nodes that may exist; each owns one slot of a logical table. The first hash maps a
URL's key to a slot, and a live owner gets the URL. The URLs of a slot whose owner is down are spread over the
live nodes by a second hash: rendezvous (highest-random-weight) hashing, which is stable under changes of the
live set. So when a node leaves, only the URLs it held move; when it comes back, exactly those URLs move back
to it; nothing else changes. A plain ``hash % N`` would reshuffle almost everything on every change.

Pure and synchronous: the master calls it for every URL and does the I/O itself. Every hash comes from mmh3
with fixed seeds, never Python's ``hash()``, so every process and every run routes a URL the same way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import mmh3

KEYS = ("url", "host")

# Rendezvous runs per (slot, bucket), not per URL: the winners of a dead slot's buckets are computed once per
# live set and cached, so the hot path is one mmh3 call and two list lookups. 2**14 buckets a slot keeps the
# bucket-level unevenness of a dead slot's spread near 1% (about sqrt(N/2**14)), well inside the 5% budget.
_BUCKET_BITS = 14
_BUCKETS = 1 << _BUCKET_BITS
_BUCKET_SHIFT = 128 - _BUCKET_BITS   # bucket: top bits of the 128-bit hash; slot: the whole hash mod M
_URL_SEED = 0x5EED_0001
_WEIGHT_SEED = 0x5EED_0002
# A flapping node makes the live set alternate between a few values; keeping their tables avoids refilling.
_ROUTES_KEPT = 4


class UnknownNode(KeyError):
    """A node id that is not in the configured table."""

    def __str__(self) -> str:   # KeyError's own str() would print the message as a quoted repr
        return str(self.args[0])


def host_key(url: str) -> str:
    """The host of an already normalised URL: between "://" and the next "/", ":", "?", "#" or the end.

    Userinfo ("user:pw@") is skipped and an IPv6 literal keeps its brackets, so every URL of one host
    gets the same key whatever its port, path or credentials.
    """
    start = url.find("://")
    if start < 0:
        raise ValueError(f"not an absolute URL: {url!r}")
    end = url.find("/", start + 3)
    auth = url[start + 3:end] if end >= 0 else url[start + 3:]
    if "?" in auth or "#" in auth:
        auth = auth.partition("?")[0].partition("#")[0]
    if "@" in auth:
        auth = auth.rpartition("@")[2]
    if auth.startswith("["):
        close = auth.find("]")
        if close >= 0:
            return auth[:close + 1]
    return auth.partition(":")[0]


class _Route:
    """Per-live-set routing data: the live owner of each slot, else a lazily filled bucket table."""

    __slots__ = ("_names", "_prefixes", "owner", "tables")

    def __init__(self, nodes: tuple[str, ...], live: frozenset[str]) -> None:
        self.owner: list[str | None] = [n if n in live else None for n in nodes]
        self._names = [n for n in nodes if n in live]
        self._prefixes = [n.encode() + b"\0" for n in self._names]
        self.tables: list[list[str | None] | None] = [
            None if n in live or not live else [None] * _BUCKETS for n in nodes]

    def fill(self, slot: int, bucket: int) -> str:
        """The live node with the highest weight for this (slot, bucket).

        Ties (a 128-bit collision) go to the node listed first in the config, which is as stable under
        live-set changes as the weights themselves.
        """
        tail = (slot * _BUCKETS + bucket).to_bytes(8, "little")
        hash128 = mmh3.hash128
        weights = [hash128(p + tail, _WEIGHT_SEED, signed=False) for p in self._prefixes]
        winner = self._names[weights.index(max(weights))]
        self.tables[slot][bucket] = winner   # type: ignore[index]
        return winner


class NodeTable:
    """M configured node slots, N <= M of them live; routes each URL to one live node.

    The order of ``node_ids`` defines the slots: keep it stable across restarts, or URLs move.
    ``key="url"`` spreads even one big site over every node; ``key="host"`` keeps each host on one node.
    """

    def __init__(self, node_ids: Sequence[str], *, key: str = "url", live: Iterable[str] = ()) -> None:
        nodes = tuple(node_ids)
        if not nodes:
            raise ValueError("the node table needs at least one node id")
        for n in nodes:
            if not isinstance(n, str) or not n:
                raise ValueError(f"node ids must be non-empty strings, got {n!r}")
        if len(set(nodes)) != len(nodes):
            dups = sorted({n for n in nodes if nodes.count(n) > 1})
            raise ValueError(f"duplicate node ids: {', '.join(dups)}")
        if key not in KEYS:
            raise ValueError(f"key must be one of {KEYS}, got {key!r}")
        self.nodes: tuple[str, ...] = nodes
        self.key = key
        self._index = {n: i for i, n in enumerate(nodes)}
        self._live: frozenset[str] = frozenset()
        self._routes: OrderedDict[frozenset[str], _Route] = OrderedDict()
        for n in live:
            self.set_live(n, True)

    @property
    def live(self) -> frozenset[str]:
        return self._live

    def set_live(self, node: str, live: bool) -> None:
        if node not in self._index:
            raise UnknownNode(f"unknown node id {node!r}; the table has {', '.join(self.nodes)}")
        self._live = self._live | {node} if live else self._live - {node}

    def slot_of(self, url: str) -> int:
        return self._hash(url) % len(self.nodes)

    def owner_of(self, url: str) -> str:
        """The node that owns the URL's slot, live or not."""
        return self.nodes[self.slot_of(url)]

    def assign(self, url: str) -> str | None:
        """The live node that should crawl the URL; None when no node is live."""
        return self.assign_many((url,))[0]

    def assign_many(self, urls: Sequence[str]) -> list[str | None]:
        """assign() for a batch, in order: the master's hot path.

        The first batches after a live-set change also fill the dead slots' bucket tables (N hashes a bucket,
        once); after that a URL costs one mmh3 call. With key="host" a URL without "://" raises ValueError.
        """
        if not self._live:
            return [None] * len(urls)
        route = self._route()
        owner, tables, fill = route.owner, route.tables, route.fill
        m = len(self.nodes)
        hash128 = mmh3.hash128
        keys: Iterable[str] = urls if self.key == "url" else map(host_key, urls)
        out: list[str | None] = []
        append = out.append
        for k in keys:
            h = hash128(k, _URL_SEED, signed=False)
            slot = h % m
            node = owner[slot]
            if node is None:
                bucket = h >> _BUCKET_SHIFT
                node = tables[slot][bucket] or fill(slot, bucket)   # type: ignore[index]
            append(node)
        return out

    def _hash(self, url: str) -> int:
        return mmh3.hash128(url if self.key == "url" else host_key(url), _URL_SEED, signed=False)

    def _route(self) -> _Route:
        route = self._routes.get(self._live)
        if route is None:
            route = self._routes[self._live] = _Route(self.nodes, self._live)
            if len(self._routes) > _ROUTES_KEPT:
                self._routes.popitem(last=False)
        else:
            self._routes.move_to_end(self._live)
        return route
