"""What the master's readers (the observer, the status page and /metrics) see of the running master.

They never hold the ``Master``: the master hands them a callable that returns a ``MasterStatistics``, a frozen
snapshot of its in-memory figures taken when asked, and, once its state is open, the store as a ``StoreView``,
the few reads they make of it. So observe.py and web.py import nothing of server.py, and nothing they do can
change the crawl.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class NodeStatistics:
    """A connected worker."""

    node: str
    last_seen: float              # wall-clock seconds of its last frame
    fault: str | None = None      # it cannot store anything (its disk): no work until it says otherwise


@dataclass(frozen=True)
class MasterStatistics:
    sessions: tuple[NodeStatistics, ...]     # the workers connected now
    in_flight: Mapping[str, int]             # leases out, by node
    held: int                                # leased pages the master holds back (politeness gates)
    at_workers: int                          # leased pages sent to the workers
    run_pages: int                           # pages fetched in this run
    paused: bool                             # the operator paused the crawl
    dedup: Mapping[str, Any]                 # the Bloom filter's size and health (Dedup.figures)
    dedup_counts: Mapping[str, int]          # the dedup decisions so far (DedupStats)
    # The sites' figures by pattern (crawler/master/sitestats.py), for sites of the sites: table; {} with none.
    sites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def connected(self) -> int:
        return len(self.sessions)

    @property
    def faulted(self) -> int:
        return sum(1 for s in self.sessions if s.fault is not None)


class StoreView(Protocol):
    """The reads the observer and the web server make of the master's store (``MasterStore`` is one)."""

    def status(self) -> dict[str, Any]: ...

    def frontier_size(self) -> int: ...

    def url_counts(self) -> dict[str, int]: ...

    def match_count(self) -> int: ...

    def recordings_stored(self) -> int: ...

    def get_meta(self, key: str, default: Any = None) -> Any: ...
