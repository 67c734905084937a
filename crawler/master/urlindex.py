"""The URL index: a URL's 64-bit hash -> the id of its row in the URL table.

Row ids are given in arrival order, so the URL table only ever appends (its B-tree is written at its right edge,
whatever its size). Finding a URL's row by its text needs an index from the URL's hash to its id, and a B-tree
keyed on random hashes is what made ingest fall as the table grew: each new key lands on a random page, and once
the tree outgrows the cache every insert reads a page and writes it back whole through the WAL. So on SQLite
the index is not a B-tree but a file of open-addressing hash tables (``FileUrlIndex``):

- each table is an array of 8-byte slots (the hash's top 24 bits, then the 40-bit id; 0 is empty), found by
  linear probing from the slot the hash's low bits name; an insert writes one slot, a lookup reads a few;
- when the newest table is three quarters full a table twice its size is appended to the file; full tables
  are never rehashed nor moved, so no insert ever waits for the index to be rebuilt. A lookup probes every
  table (13 at a billion URLs; a batch of keys is probed with numpy a step at a time, a few keys in Python);
- the file is mapped shared: a slot written is in the page cache at once, so a killed master loses none.
  Against a machine crash, ``sync`` (every minute, on the store's commit thread) fsyncs the file and records
  the highest id it covers; on opening, the rows after that id are indexed again (inserting is idempotent).
  An entry whose row was never committed (the master died first) is harmless: a lookup reads the rows its
  entries name and keeps only those whose text is the URL's, as it does for two URLs on one hash;
- the mapped pages are page cache, as the SQLite file's pages are: they count in the master's resident set
  (RssFile) while mapped, but the kernel writes them back and reclaims them under memory pressure like any
  file's pages. (Dropping the mapping after each commit kept the resident set small but cost 3 us per URL in
  page faults, a third of an insert.)

A missing file, or one written for another store (its token is the store's meta ``url_index``), is rebuilt
from the URL table. On PostgreSQL the index is a table of (hash, id) in the same database (``SqlUrlIndex``),
so a standby holds it with everything else.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import mmh3
import numpy as np

__all__ = ["FileUrlIndex", "SqlUrlIndex", "UrlIndex", "url_hash", "url_hashes"]

log = logging.getLogger(__name__)

MAGIC = b"ACRWUIX1"
HEADER = 4096
ID_BITS = 40
ID_MASK = (1 << ID_BITS) - 1       # also the largest id a slot holds
FIRST_SLOTS = 1 << 18            # slots of the first table (2 MiB); each next table doubles
MAX_LOAD = 0.75
MAX_TABLES = 48                  # 2^18 * (2^48 - 1) slots: far beyond any disk
# header: magic, version, table count, token (32 bytes), the id synced through, then each table's entry count
_HEAD = struct.Struct("<8sII32sQ")
_COUNTS_AT = 128
_U64 = (1 << 64) - 1
_SMALL = 256                     # below this many keys a lookup probes in plain Python


def url_hash(url: str) -> int:
    """A URL's 64-bit hash, as a signed integer (what SQL's BIGINT holds)."""
    return mmh3.hash64(url, 0x5EED, signed=True)[0]


def url_hashes(urls: Iterable[str]) -> list[int]:
    return [url_hash(u) for u in urls]


class UrlIndex(Protocol):
    """URL hash -> row ids. Entries are never removed; an entry may name a row that is not the URL's (another
    URL on the same hash, or a row that was never committed): callers check the row's text."""

    def find(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        """(position in ``hashes``, id) of every entry of each hash."""
        ...

    def add(self, hashes: Sequence[int], ids: Sequence[int]) -> None:
        """Index these rows (an entry already present is not added twice)."""
        ...

    def after_commit(self, committed_through: int, now: float) -> None:
        """Called after each commit, with the highest row id committed and the monotonic time."""
        ...

    def sync(self, committed_through: int) -> None:
        """Make every entry of the rows up to this id durable."""
        ...

    def close(self) -> None: ...


def _offset_of(table: int) -> int:
    """Where a table starts in the slot array (tables lie one after another)."""
    return FIRST_SLOTS * ((1 << table) - 1)


class FileUrlIndex:
    """The index of an SQLite store: hash tables in one mapped file beside it (see the module's text)."""

    SYNC_EVERY = 60.0

    def __init__(self, path: Path, token: str, *, readonly: bool = False) -> None:
        """Open the index at ``path`` if it is the one written for the store named ``token``; else start an
        empty one (``fresh`` is then True, and the caller indexes the table's rows with ``add``)."""
        self.path = path
        self.readonly = readonly
        self._token = token.encode()[:32].ljust(32, b"\0")
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._slots: np.ndarray[Any, np.dtype[np.uint64]] = np.zeros(0, np.uint64)
        self._words: memoryview | None = None
        self.tables = 0
        self.counts: list[int] = []
        self.synced_through = 0
        self.fresh = False
        self._next_sync: float | None = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        flags = os.O_RDONLY if self.readonly else os.O_RDWR | os.O_CREAT
        self._fd = os.open(self.path, flags, 0o644)
        size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, HEADER, 0) if size >= HEADER else b""
        ok = False
        if len(head) == HEADER:
            magic, version, tables, token, synced = _HEAD.unpack_from(head)
            counts = list(struct.unpack_from(f"<{MAX_TABLES}Q", head, _COUNTS_AT))
            ok = (magic == MAGIC and version == 1 and token == self._token and 1 <= tables <= MAX_TABLES
                  and size >= HEADER + 8 * _offset_of(tables))
        if ok:
            self.tables, self.synced_through, self.counts = tables, synced, counts[:tables]
            self._map()
            # Counts are written at each sync: the newest table may hold more since. Count it again.
            self.counts[-1] = int(np.count_nonzero(self._table(self.tables - 1)))
            return
        if self.readonly:
            raise FileNotFoundError(f"{self.path}: no URL index for this store")
        if size:
            log.warning("URL index %s is not this store's (or is damaged): building it again", self.path)
        os.ftruncate(self._fd, 0)
        os.posix_fallocate(self._fd, 0, HEADER + 8 * _offset_of(1))
        self.tables, self.counts, self.synced_through, self.fresh = 1, [0], 0, True
        self._map()
        self._write_header()

    def _map(self) -> None:
        self._drop_views()
        if self._mm is not None:
            self._mm.close()
        length = HEADER + 8 * _offset_of(self.tables)
        prot = mmap.PROT_READ if self.readonly else mmap.PROT_READ | mmap.PROT_WRITE
        self._mm = mmap.mmap(self._fd, length, mmap.MAP_SHARED, prot)
        self._slots = np.frombuffer(self._mm, dtype="<u8", offset=HEADER)
        self._words = memoryview(self._mm)[HEADER:].cast("Q")

    def _follow(self) -> None:
        """A reader maps the tables the writer had when it looked: see any it appended since."""
        assert self._mm is not None
        tables = _HEAD.unpack_from(self._mm)[2]
        if tables != self.tables and 1 <= tables <= MAX_TABLES:
            self.tables = tables
            self.counts = self.counts + [0] * (tables - len(self.counts))
            self._map()

    def _table(self, t: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
        return self._slots[_offset_of(t):_offset_of(t + 1)]

    def _write_header(self) -> None:
        assert self._mm is not None
        self._mm[:_HEAD.size] = _HEAD.pack(MAGIC, 1, self.tables, self._token, self.synced_through)
        counts = self.counts + [0] * (MAX_TABLES - self.tables)
        self._mm[_COUNTS_AT:_COUNTS_AT + 8 * MAX_TABLES] = struct.pack(f"<{MAX_TABLES}Q", *counts)

    # -- lookups and inserts ------------------------------------------------------------------------------

    def find(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        if not hashes:
            return []
        if self.readonly:
            self._follow()
        if len(hashes) < _SMALL:
            return self._find_small(hashes)
        h = np.array(hashes, dtype=np.int64).view(np.uint64)
        tag = h >> np.uint64(ID_BITS)
        out_pos: list[np.ndarray[Any, Any]] = []
        out_ids: list[np.ndarray[Any, Any]] = []
        for t in range(self.tables):
            table = self._table(t)
            mask = np.uint64(len(table) - 1)
            pending = np.arange(len(h))
            at = h & mask
            while pending.size:
                cur = table[at]
                taken = cur != 0
                hit = taken & ((cur >> np.uint64(ID_BITS)) == tag[pending])
                if hit.any():
                    out_pos.append(pending[hit])
                    out_ids.append(cur[hit] & np.uint64(ID_MASK))
                pending, at = pending[taken], (at[taken] + np.uint64(1)) & mask
        if not out_pos:
            return []
        return list(zip(np.concatenate(out_pos).tolist(), np.concatenate(out_ids).tolist()))

    def _find_small(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        # A few keys (one report's URLs): a step of numpy per probe costs more than the probe itself.
        slots = self._words
        assert slots is not None
        out: list[tuple[int, int]] = []
        for pos, x in enumerate(hashes):
            x &= _U64
            tag = x >> ID_BITS
            for t in range(self.tables):
                base, mask = _offset_of(t), (FIRST_SLOTS << t) - 1
                at = x & mask
                while cur := slots[base + at]:
                    if cur >> ID_BITS == tag:
                        out.append((pos, cur & ID_MASK))
                    at = (at + 1) & mask
        return out

    def add(self, hashes: Sequence[int], ids: Sequence[int]) -> None:
        if not hashes:
            return
        if self.readonly:
            raise PermissionError(f"{self.path}: opened read-only")
        if len(hashes) < _SMALL:
            self._add_small(hashes, ids)
            return
        h = np.array(hashes, dtype=np.int64).view(np.uint64)
        v = np.array(ids, dtype=np.uint64)
        if int(v.max()) > ID_MASK or int(v.min()) < 1:
            raise ValueError("URL row id out of the index's range")
        values = (h >> np.uint64(ID_BITS)) << np.uint64(ID_BITS) | v
        start = 0
        while start < len(h):
            t = self.tables - 1
            room = int(len(self._table(t)) * MAX_LOAD) - self.counts[t]
            if room <= 0:
                self._grow()
                continue
            end = min(len(h), start + room)
            self.counts[t] += self._insert(self._table(t), h[start:end], values[start:end])
            start = end

    def _add_small(self, hashes: Sequence[int], ids: Sequence[int]) -> None:
        # A few keys (one report's new URLs): numpy's steps cost more than the probes, as in _find_small. Keys
        # go in one by one, so two of them meeting at a free slot may end in each other's places compared with
        # _insert: a lookup probes to the first empty slot either way and finds the same entries.
        if min(ids) < 1 or max(ids) > ID_MASK:
            raise ValueError("URL row id out of the index's range")
        slots = self._words
        for x, i in zip(hashes, ids):
            t = self.tables - 1
            if self.counts[t] >= int((FIRST_SLOTS << t) * MAX_LOAD):
                self._grow()
                t += 1
                slots = self._words
            assert slots is not None
            x &= _U64
            value = (x >> ID_BITS) << ID_BITS | i
            base, mask = _offset_of(t), (FIRST_SLOTS << t) - 1
            at = x & mask
            while cur := slots[base + at]:
                if cur == value:            # already indexed (or by an earlier key of this batch)
                    break
                at = (at + 1) & mask
            else:
                slots[base + at] = value
                self.counts[t] += 1

    @staticmethod
    def _insert(table: np.ndarray[Any, np.dtype[np.uint64]], h: np.ndarray[Any, Any],
                values: np.ndarray[Any, Any]) -> int:
        """Linear probing, all keys a step at a time; returns how many slots were filled."""
        mask = np.uint64(len(table) - 1)
        at = h & mask
        pending = np.arange(len(h))
        filled = 0
        while pending.size:
            cur = table[at[pending]]
            there = cur == values[pending]          # already indexed (or indexed by an earlier key of this batch)
            free = cur == 0
            # Of the keys aiming at one free slot, the first takes it; the others see it taken next step.
            free_idx = pending[free]
            slots, first = np.unique(at[free_idx], return_index=True)
            winners = free_idx[first]
            table[slots] = values[winners]
            filled += len(winners)
            move = ~there & ~free
            at[pending[move]] = (at[pending[move]] + np.uint64(1)) & mask
            keep = ~there
            keep[np.flatnonzero(free)[first]] = False
            pending = pending[keep]
        return filled

    def _grow(self) -> None:
        if self.tables >= MAX_TABLES:
            raise OSError(f"{self.path}: URL index full")
        # The disk space is taken now: on a full disk this raises ENOSPC (the store's write fails and is rolled
        # back, as SQLite's does), where a write to a page of a sparse mapped file would kill the master (SIGBUS).
        old, new = HEADER + 8 * _offset_of(self.tables), HEADER + 8 * _offset_of(self.tables + 1)
        try:
            os.posix_fallocate(self._fd, old, new - old)
        except OSError:
            os.ftruncate(self._fd, old)
            raise
        self.counts.append(0)
        self.tables += 1
        self._map()
        self._write_header()     # readers opening from now on see the new table

    # -- durability and memory ------------------------------------------------------------------------------

    def after_commit(self, committed_through: int, now: float) -> None:
        if self.readonly or self._mm is None:
            return
        if self._next_sync is None:
            self._next_sync = now + self.SYNC_EVERY
        elif now >= self._next_sync:
            self.sync(committed_through)
            self._next_sync = now + self.SYNC_EVERY

    def sync(self, committed_through: int) -> None:
        """Make the index durable through this row id: every committed row's entry was written before its commit,
        so after the fsync the file holds all of them."""
        if self.readonly or self._mm is None:
            return
        os.fsync(self._fd)
        self.synced_through = max(committed_through, 0)
        self._write_header()
        os.fsync(self._fd)

    def _drop_views(self) -> None:
        self._slots = np.zeros(0, np.uint64)
        if self._words is not None:
            self._words.release()
            self._words = None

    def close(self) -> None:
        self._drop_views()
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SqlUrlIndex:
    """The index of a PostgreSQL store: the table url_hashes, written in the store's transactions."""

    DDL = ("CREATE TABLE IF NOT EXISTS url_hashes (h BIGINT NOT NULL, id BIGINT NOT NULL);"
           "CREATE INDEX IF NOT EXISTS url_hashes_h ON url_hashes(h)")

    def __init__(self, db: Any) -> None:
        self.db = db
        self.fresh = False
        self.synced_through = 0

    def find(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        if not hashes:
            return []
        positions: dict[int, list[int]] = {}
        for i, x in enumerate(hashes):
            positions.setdefault(x, []).append(i)
        out: list[tuple[int, int]] = []
        keys = list(positions)
        for start in range(0, len(keys), 2000):
            chunk = keys[start:start + 2000]
            for x, i in self.db.execute(f"SELECT h, id FROM url_hashes WHERE {self.db.in_list('h')}",
                                        (self.db.list_arg(chunk),)):
                out.extend((p, i) for p in positions[x])
        return out

    def add(self, hashes: Sequence[int], ids: Sequence[int]) -> None:
        self.db.executemany("INSERT INTO url_hashes(h, id) VALUES (?, ?)", list(zip(hashes, ids)))

    def after_commit(self, committed_through: int, now: float) -> None:
        pass

    def sync(self, committed_through: int) -> None:
        pass       # written in the store's transactions

    def close(self) -> None:
        pass
