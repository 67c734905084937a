"""Matching the fingerprints of what the crawl stored against the rights holder's references, in the master.

Two indexes live in memory, each a crawler.identify.ReferenceIndex: the works (built from the store's references
and kept current as the operator adds and removes them) and the recordings (one fingerprint per group of addresses
whose audio is the same recording; an address that matches none starts a group of its own). The store says what
is due (store_identify.py: fingerprints never matched, or matched before the newest reference came), so a new
fingerprint and a work added later are the same job, and a restart loses none of it.

Every index operation runs on the matcher's own thread, one batch (BATCH fingerprints) at a time: the event loop
only reads the batch and writes what was found, so a backlog (a big retroactive pass) slows matching, never the
crawl. Memory: the two indexes (the index's own figures) and one batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from crawler.identify import IdentifyError, Match
from crawler.master.store import Checked, MasterStore

log = logging.getLogger(__name__)

# Fingerprints matched per turn (one trip to the matcher's thread); references loaded per trip.
BATCH = 64
LOAD_BATCH = 256


class Index(Protocol):
    """What the matcher needs of crawler.identify.ReferenceIndex (a test passes a small fake)."""

    def add(self, work: str, fingerprint: bytes) -> None: ...

    def remove(self, work: str) -> None: ...

    def match(self, fingerprint: bytes) -> list[Match]: ...

    def __len__(self) -> int: ...


class Matcher:
    """The works and recordings indexes, and the steps that match what the store says is due.

    The store is used only by the caller's task (through the master's store gate); the indexes only on the
    matcher's thread."""

    def __init__(self, store: MasterStore, new_index: Callable[[], Index], *, batch: int = BATCH,
                 alert: bool = False) -> None:
        """alert: each new match also goes to the alerts' outbox (crawler/master/alerts.py)."""
        self.store = store
        self.alert = alert
        self.works = new_index()
        self.recordings = new_index()
        self.batch = batch
        self._works: set[str] = set()       # the works in the index
        self._top = 0                       # the newest reference id in the index
        self._count = -1                    # how many references the store had when the index was made current
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="identify")
        self.matched = 0                    # fingerprints matched since start

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def load(self) -> None:
        """The recordings index from the store (one fingerprint per recording), then the works."""
        after, n = "", 0
        while rows := self.store.recordings(after, LOAD_BATCH):
            await self._off_loop(_add_all, self.recordings, [(str(rec), fp) for _, rec, fp in rows])
            after, n = rows[-1][0], n + len(rows)
        await self.sync_references()
        if n or self._works:
            log.info("identification: %d references and %d recordings indexed", len(self._works), n)

    async def sync_references(self) -> bool:
        """Bring the works index up to the store's references (added, replaced, removed). True if it changed."""
        top, count = self.store.reference_state()
        if top == self._top and count == self._count:
            return False
        while rows := self.store.reference_fingerprints(self._top, LOAD_BATCH):
            # A work added again replaces its fingerprint; a new one is only added.
            await self._off_loop(_replace_all, self.works, [(work, fp) for _, work, fp in rows],
                                 [work for _, work, _ in rows if work in self._works])
            self._works.update(work for _, work, _ in rows)
            self._top = rows[-1][0]
        gone = self._works - self.store.reference_works()
        if gone:
            await self._off_loop(_remove_all, self.works, sorted(gone))
            self._works -= gone
        self._top, self._count = max(self._top, top), count
        return True

    async def step(self, now: float) -> tuple[int, list[dict[str, Any]]]:
        """Match one batch of what is due. Returns (how many fingerprints were matched, the new matches as
        export rows); (0, []) when nothing is due."""
        await self.sync_references()
        due = self.store.to_match(self._top, self.batch)
        if not due:
            # The live streams' windows when no file waits (they are matched against the works only).
            windows = self.store.windows_to_match(self._top, self.batch) if len(self._works) else []
            if not windows:
                return 0, []
            checked = await self._off_loop(_match_windows, self.works, windows, self._top)
            rows = self.store.record_checked(checked, now, alert=self.alert)
            self.matched += len(checked)
            return len(checked), rows
        # Ids for the recordings this batch may start, given out here (the store's counter is the loop's).
        fresh_ids = [self.store.new_recording() for _, _, recording, _ in due if recording is None]
        checked = await self._off_loop(_match_batch, self.works, self.recordings, due, self._top, fresh_ids)
        rows = self.store.record_checked(checked, now, alert=self.alert)
        self.matched += len(checked)
        return len(checked), rows


def _add_all(index: Index, rows: Sequence[tuple[str, bytes]]) -> None:
    for work, fp in rows:
        try:
            index.add(work, fp)
        except IdentifyError as e:
            log.warning("identification: %s not indexed: %s", work, e)


def _replace_all(index: Index, rows: Sequence[tuple[str, bytes]], known: Sequence[str]) -> None:
    _remove_all(index, known)
    _add_all(index, rows)


def _remove_all(index: Index, works: Sequence[str]) -> None:
    for work in works:
        try:
            index.remove(work)
        except (IdentifyError, KeyError) as e:
            log.warning("identification: %s not removed from the index: %s", work, e)


def _match_windows(works: Index, due: Sequence[tuple[int, bytes, int]], top: int) -> list[Checked]:
    """On the matcher's thread: each live stream's window against the works, with where in it each was heard."""
    out = []
    for window, fp, _checked in due:
        found: tuple[tuple[str, float, float, float, float], ...] = ()
        try:
            found = tuple((m.work, m.score, m.offset, m.at, m.length) for m in works.match(fp))
        except IdentifyError as e:
            log.warning("identification: the fingerprint of window %d is refused: %s", window, e)
        out.append(Checked("", top, None, found, window=window))
    return out


def _match_batch(works: Index, recordings: Index, due: Sequence[tuple[str, bytes, int | None, int]], top: int,
                 fresh_ids: list[int]) -> list[Checked]:
    """On the matcher's thread: each fingerprint against the works, and (when it has no recording yet) against
    the recordings, where it joins the one it matches or starts its own."""
    out = []
    ids = iter(fresh_ids)
    for url, fp, recording, _checked in due:
        lead = False
        found: tuple[tuple[str, float, float], ...] = ()
        # A fingerprint an index cannot read (a worker of another version) is marked done, never retried.
        try:
            found = tuple((m.work, m.score, m.offset) for m in works.match(fp)) if len(works) else ()
        except IdentifyError as e:
            log.warning("identification: the fingerprint of %s is refused: %s", url, e)
        if recording is None:
            try:
                same = recordings.match(fp)
                if same and same[0].work.isdigit():
                    recording = int(same[0].work)
                else:
                    recordings.add(str(fresh := next(ids)), fp)
                    recording, lead = fresh, True
            except IdentifyError as e:
                log.debug("identification: the fingerprint of %s starts no recording: %s", url, e)
        out.append(Checked(url, top, recording, found, lead))
    return out
