"""Where audio lives on a worker's disk: partial downloads with their sidecars, and finished files by content.

    <data_dir>/audio/partial/<key>.part    bytes received so far, always a prefix of the file being fetched
    <data_dir>/audio/partial/<key>.json    sidecar: address, validators, expected size, bytes written
    <data_dir>/audio/finished.sqlite3                 the last finished download of each key (``Finished``)
    <data_dir>/audio/<sha[:2]>/<sha256><ext>          the finished file, stored once per content

Where each file was found (address, page) is the master's catalogue, which every finished item is reported to;
the worker keeps no second copy of it.

A download in progress is a ``Partial`` (``open_partial``): the one left on disk by an earlier attempt, or a new
one. The downloader appends to it, describes what its bytes belong to, and ends it with ``commit`` or
``discard``; it decides nothing (download_plan.py does) and calls nothing back.

A file that arrived whole in one chunk has no partial and no sidecar: it is written straight to its
content-addressed name (``put``). A crash mid-write leaves a file shorter than its record and its name says,
which ``holds`` and the duplicate check both refuse by its size, and the next download writes it again.

The key is derived from the site's own id when there is one, so a link that is re-resolved to a new
address keeps writing to the same partial file and finds the same finished record. Nothing derived from a URL
or header reaches a path except through ``extension_for``, which only ever returns a dot and a few lowercase
letters or digits; a finished record's stored path is accepted only in the exact shape ``commit`` produces, so
a damaged or planted record cannot point outside the audio tree.

A sidecar is written to a temporary file and renamed over the old one: a process killed at any instant leaves
the old record or the new one. Finished records are rows of one SQLite table (WAL, one short transaction
each): a file per record cost a file creation per download, as much CPU as the download itself. Records written
as files by earlier versions (``audio/done/<key[:2]>/<key>.json``) are still read. Nothing is fsynced; records
are caches of what the disk already holds, and one lost to a power cut costs a download, not data.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import math
import os
import re
import sqlite3
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from crawler.bloom import GrowingBloomFilter
from crawler.items import AudioItem
from crawler.web import media

_SAFE_EXT = re.compile(r"\.[a-z0-9]{1,5}")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_IOV_MAX = 512        # pieces per writev (Linux allows 1024)
_MiB = 1024 * 1024
# The filter of keys with a record starts sized for this many at this rate, and grows (crawler/bloom.py).
KNOWN_KEYS_CAPACITY = 1 << 20
KNOWN_KEYS_FP_RATE = 0.01
_CHECKPOINT = 16 * _MiB   # bytes between two sidecar updates during a download
_SORTED_JSON = json.JSONEncoder(sort_keys=True)     # json.dumps(..., sort_keys=True) without its set-up each call


def extension_for(urls: list[str], content_type: str | None) -> str:
    """An extension that is safe in a path: a known audio one from a URL, else one from the media type."""
    for url in urls:
        ext = media.url_extension(url)
        if ext in media.STORED_EXTENSIONS:
            return "." + ext
    ext = media.EXTENSION_BY_TYPE.get(media.media_type(content_type), "")
    ext = "." + ext if ext else ""
    assert ext == "" or _SAFE_EXT.fullmatch(ext)
    return ext


def partial_key(item: AudioItem) -> str:
    """Stable across re-resolution: the site's id if known, scoped by resolver (two sites' ids may clash)."""
    basis = f"{item.resolver}\0{item.source_id}" if item.source_id else item.url
    return hashlib.sha1(basis.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Sidecar:
    """What must survive a crash to resume a partial file safely."""

    url: str
    etag: str | None = None
    last_modified: str | None = None
    expected_size: int | None = None
    written: int = 0                  # as of the last checkpoint; the .part file may be a little longer
    content_type: str | None = None
    final_url: str | None = None      # where the bytes came from after redirects (for the extension only)

    def to_json(self) -> str:
        # vars(), not asdict(): the fields are flat, and asdict deep-copies each one.
        return json.dumps({"version": 1, **vars(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Sidecar:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("version") != 1 or not isinstance(d.get("url"), str):
            raise ValueError("not a sidecar")
        size = d.get("expected_size")
        return cls(url=d["url"], etag=_opt_str(d.get("etag")), last_modified=_opt_str(d.get("last_modified")),
                   expected_size=size if isinstance(size, int) and size >= 0 else None,
                   written=d["written"] if isinstance(d.get("written"), int) else 0,
                   content_type=_opt_str(d.get("content_type")), final_url=_opt_str(d.get("final_url")))


@dataclass(frozen=True)
class Finished:
    """A finished download of one key: enough to skip the next one, or to ask whether the file changed."""

    url: str                          # the address the bytes (or the last confirmation) came from
    sha256: str
    size: int
    path: str                         # relative to the data dir, as ``AudioStore.commit`` returned it
    etag: str | None = None
    last_modified: str | None = None
    content_type: str | None = None
    verified_at: float = 0.0          # wall-clock seconds when the server last served or confirmed it

    def to_json(self) -> str:
        # vars(), not asdict(): the fields are flat, and asdict deep-copies each one. The encoder json.dumps
        # would make for sort_keys, made once (a record a stored file).
        return _SORTED_JSON.encode({"version": 1, **vars(self)})

    @classmethod
    def from_json(cls, text: str) -> Finished:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("version") != 1:
            raise ValueError("not a finished-download record")
        url, sha, size, path = d.get("url"), d.get("sha256"), d.get("size"), d.get("path")
        if not isinstance(url, str) or not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError("finished record without an address or a sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError("finished record without a size")
        # Only the shape commit() writes: a record must not be able to name any other file.
        if not isinstance(path, str) or not re.fullmatch(rf"audio/{sha[:2]}/{sha}(\.[a-z0-9]{{1,5}})?", path):
            raise ValueError("finished record with a path the store did not write")
        at = d.get("verified_at")
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at := float(at)):
            raise ValueError("finished record without a verification time")
        return cls(url=url, sha256=sha, size=size, path=path, etag=_opt_str(d.get("etag")),
                   last_modified=_opt_str(d.get("last_modified")),
                   content_type=_opt_str(d.get("content_type")), verified_at=at)


class AudioStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir)
        self.audio_dir = self.root / "audio"
        self.partial_dir = self.audio_dir / "partial"
        self.done_dir = self.audio_dir / "done"
        self._partial_prefix = f"{self.partial_dir}{os.sep}"
        self._audio_prefix = f"{self.audio_dir}{os.sep}"    # paths as strings: pathlib cost more than the write
        # A worker owns its data dir, so the keys with a sidecar are listed once and then kept here: a download
        # that left nothing behind (nearly all of them) costs no failed open. Bounded by the partials on disk.
        self._sidecars: set[str] | None = None
        # Records kept as files by earlier versions are looked for only where such a version left some, and
        # content stored by them (not in the ``stored`` table) is looked for by listing its folder.
        self._legacy_records = self.done_dir.is_dir()
        self._legacy_content = self.audio_dir.is_dir() and not (self.audio_dir / "finished.sqlite3").exists()
        self._made: set[str] = set()     # shard folders known to exist: at most 256 of them
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()  # records are written from worker threads and the event loop
        # Look-ups have a connection of their own: under WAL a reader never waits for a writer, so the event
        # loop never waits for a batch of records being written in a thread.
        self._reader: sqlite3.Connection | None = None
        # The keys that may have a record (load_known_keys): a key it has never seen, nearly every download's,
        # is answered without asking SQLite. None until loaded; keys saved meanwhile are added as well.
        self._known: GrowingBloomFilter | None = None
        self._known_complete = False

    def part_path(self, key: str) -> Path:
        return self.partial_dir / f"{key}.part"

    def sidecar_path(self, key: str) -> Path:
        return self.partial_dir / f"{key}.json"

    def open_partial(self, key: str, url: str, chunk_size: int) -> Partial:
        """The partial download of key: the one left on disk (sidecar and part file), else a new one in memory.

        Raises OSError when what is on disk cannot be opened."""
        record = self.load_sidecar(key)
        return Partial(self, key, record or Sidecar(url=url), chunk_size, on_disk=record is not None)

    def load_sidecar(self, key: str) -> Sidecar | None:
        """The sidecar if it and its partial file are both usable; otherwise both are cleared."""
        if key not in self._sidecar_keys():
            return None
        try:
            with open(f"{self._partial_prefix}{key}.json", encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            self._sidecar_keys().discard(key)
            return None
        except (OSError, ValueError):    # unreadable, or not UTF-8
            text = ""
        try:
            record: Sidecar | None = Sidecar.from_json(text)
        except ValueError:
            record = None
        if record is None or not self.part_path(key).exists():
            self.discard(key)
            return None
        return record

    def _sidecar_keys(self) -> set[str]:
        if self._sidecars is None:
            try:
                names = os.listdir(self.partial_dir)
            except FileNotFoundError:
                names = []
            self._sidecars = {name[:-5] for name in names if name.endswith(".json")}
        return self._sidecars

    def save_sidecar(self, key: str, record: Sidecar) -> None:
        """Atomic: a crash leaves the old sidecar or the new one, never half of one."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.sidecar_path(key), record.to_json())
        self._sidecar_keys().add(key)

    def discard(self, key: str) -> None:
        self._sidecar_keys().discard(key)
        for p in (self.part_path(key), self.sidecar_path(key)):
            p.unlink(missing_ok=True)

    def finished_path(self, key: str) -> Path:
        """Where earlier versions kept key's finished record as a file (still read, never written)."""
        return self.done_dir / key[:2] / f"{key}.json"

    def _records(self) -> sqlite3.Connection:
        if self._db is None:
            self.audio_dir.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.audio_dir / "finished.sqlite3", isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # Rowid tables: a batch's rows are appended to the table's last pages, and only its keys (hashes,
            # so random pages) go into the key's index, whose entries are small (80 to a page, against a dozen
            # whole records in a WITHOUT ROWID tree). A batch of 32 records cost half the CPU so (0.016 against
            # 0.030 ms a record, fresh; 0.034 against 0.072 with 100,000 records held), look-ups no more.
            # A database made before keeps its tables as they are: the statements below work on both.
            db.execute("CREATE TABLE IF NOT EXISTS finished (key TEXT PRIMARY KEY, record TEXT NOT NULL)")
            # Which name each content was stored under: finding it under another extension takes one look-up,
            # not a listing of its shard folder (thousands of names in a long crawl).
            db.execute("CREATE TABLE IF NOT EXISTS stored (sha256 TEXT PRIMARY KEY, path TEXT NOT NULL)")
            self._db = db
        return self._db

    def load_known_keys(self) -> None:
        """Read every key with a record into a filter, so that load_finished answers most keys (those never
        finished here) from memory. Blocks for as long as reading the keys takes (1.4 s a million, measured):
        call it in a thread. Without it, or when it fails, every look-up asks SQLite."""
        if self._known is not None:
            return
        known = self._known = GrowingBloomFilter(KNOWN_KEYS_CAPACITY, KNOWN_KEYS_FP_RATE)   # saves land in it now
        if self._legacy_records:
            return     # records kept as files by earlier versions are not in the table: keep asking
        try:
            with self._db_lock:
                self._records()        # the tables exist
            db = sqlite3.connect(self.audio_dir / "finished.sqlite3", isolation_level=None)
            try:
                rows = db.execute("SELECT key FROM finished")
                while batch := rows.fetchmany(4096):
                    known.add_many([key for key, in batch])
            finally:
                db.close()
        except (OSError, sqlite3.Error):
            return
        self._known_complete = True

    def _lookups(self) -> sqlite3.Connection:
        if self._reader is None:
            # Not through the writer's lock: before its first write there is no table, and no record to find.
            self.audio_dir.mkdir(parents=True, exist_ok=True)
            self._reader = sqlite3.connect(self.audio_dir / "finished.sqlite3", isolation_level=None,
                                           check_same_thread=False)
        return self._reader

    def load_finished(self, key: str) -> Finished | None:
        """The record of key's last finished download; None when there is none or it is unreadable.

        An unreadable record is left where it is: the next finished download of the key replaces it.
        """
        if self._known_complete and key not in cast(GrowingBloomFilter, self._known):
            return None
        try:
            try:
                row = self._lookups().execute("SELECT record FROM finished WHERE key = ?", (key,)).fetchone()
            except sqlite3.OperationalError:
                row = None     # no table yet: nothing was recorded since the store was made
            if row is None and not self._legacy_records:
                return None
            text = row[0] if row is not None else self.finished_path(key).read_text(encoding="utf-8")
            return Finished.from_json(text)
        except (OSError, ValueError, ArithmeticError, RecursionError, TypeError, sqlite3.DatabaseError):
            return None    # gone, bad UTF-8, JSON, numbers, nesting, a damaged database

    def save_finished(self, key: str, record: Finished) -> None:
        """Raises OSError when the record cannot be kept (callers treat the record as a cache)."""
        self.save_finished_many([(key, record)])

    def save_finished_many(self, records: list[tuple[str, Finished]]) -> None:
        """Several records in one transaction (see save_finished), with the content each one names."""
        if not records:
            return
        if self._known is not None:     # before the rows: the filter may say too much, never too little
            self._known.add_many([key for key, _ in records])
        rows = [(key, record.to_json()) for key, record in records]
        contents = [(record.sha256, record.path) for _, record in records]
        try:
            with self._db_lock:
                db = self._records()
                db.execute("BEGIN")
                try:
                    db.executemany("INSERT OR REPLACE INTO finished (key, record) VALUES (?, ?)", rows)
                    db.executemany("INSERT OR REPLACE INTO stored (sha256, path) VALUES (?, ?)", contents)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise OSError(f"finished records: {exc}") from None

    def close(self) -> None:
        with self._db_lock:
            for db in (self._db, self._reader):
                if db is not None:
                    db.close()
            self._db = self._reader = None

    def holds(self, record: Finished) -> bool:
        """Whether the file a record names is still on disk at its size (an operator may have removed it).

        The size and not the hash is checked: rehashing a gigabyte on every refresh would cost more than
        the download it saves, and the store never rewrites a file in place.
        """
        try:
            st = (self.root / record.path).stat()
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == record.size

    def commit(self, key: str, sha256: str, size: int, ext: str) -> str:
        """Move a finished partial into the content-addressed tree; returns the path relative to the data dir.

        Content already stored (under any extension) is kept and the new copy dropped.
        """
        if not re.fullmatch(r"[0-9a-f]{64}", sha256) or (ext and not _SAFE_EXT.fullmatch(ext)):
            raise ValueError(f"refusing to store under {sha256!r}{ext!r}")
        folder = self._folder(sha256[:2])
        existing = self._existing(folder, sha256, size, ext)
        if existing is not None:
            self.part_path(key).unlink(missing_ok=True)
            rel = existing
        else:
            os.replace(self.part_path(key), f"{folder}{sha256}{ext}")
            rel = f"audio/{sha256[:2]}/{sha256}{ext}"
        self._sidecar_keys().discard(key)
        self.sidecar_path(key).unlink(missing_ok=True)
        return rel

    def put(self, sha256: str, pieces: list[bytes], size: int, ext: str) -> str:
        """Store a whole file held in memory under its content's name; returns the path relative to the data dir.

        Blocking (call it off the event loop). Content already stored at its full size is not written again.
        """
        out = self.put_many([(sha256, pieces, size, ext)])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def put_many(self, files: list[tuple[str, list[bytes], int, str]]) -> list[str | Exception]:
        """put() for several files (sha256, pieces, size, ext): each one's path, or the error that was its own.

        The names the contents were stored under are looked up for all of them in one query. New content (nearly
        every file) is then created with O_EXCL, without a stat first: three system calls a file (open, write,
        close); a name that exists is kept when it holds the file at its size, else written again."""
        out: list[str | Exception] = []
        todo: list[tuple[int, str]] = []     # index, folder
        for i, (sha256, _, _, ext) in enumerate(files):
            try:
                if not re.fullmatch(r"[0-9a-f]{64}", sha256) or (ext and not _SAFE_EXT.fullmatch(ext)):
                    raise ValueError(f"refusing to store under {sha256!r}{ext!r}")
                todo.append((i, self._folder(sha256[:2])))
            except Exception as exc:
                out.append(exc)
                continue
            out.append("")
        if not todo:
            return out
        stored = self._stored_names([files[i][0] for i, _ in todo])
        for i, folder in todo:
            sha256, pieces, size, ext = files[i]
            try:
                own = f"audio/{sha256[:2]}/{sha256}{ext}"
                other = stored.get(sha256)
                rel = None
                if (other is not None and other != own) or self._legacy_content:
                    # Stored under another name (or maybe, by an earlier version): the own name first, as commit().
                    rel = self._at_own_name(folder, sha256, size, ext) or \
                        self._under_other_name(folder, sha256, size, ext, other)
                if rel is None:
                    rel = self._create(folder, sha256, ext, pieces, size)
                    # The same content twice in one batch is written once (the second finds the first's name).
                    stored[sha256] = rel
                out[i] = rel
            except Exception as exc:
                out[i] = exc
        return out

    def _create(self, folder: str, sha256: str, ext: str, pieces: list[bytes], size: int) -> str:
        """Write a file under its content's own name, unless that name already holds it at its size (a file cut
        short by a crash is written again)."""
        path = f"{folder}{sha256}{ext}"
        rel = f"audio/{sha256[:2]}/{sha256}{ext}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        except FileExistsError:
            if self._at_own_name(folder, sha256, size, ext) is not None:
                return rel
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            write_pieces(fd, pieces)
        finally:
            os.close(fd)
        return rel

    def _folder(self, shard: str) -> str:
        """The shard's folder, made if need be, as a string ending in the separator."""
        folder = f"{self._audio_prefix}{shard}{os.sep}"
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        return folder

    def _existing(self, folder: str, sha256: str, size: int, ext: str) -> str | None:
        rel = self._at_own_name(folder, sha256, size, ext)
        if rel is not None:
            return rel
        return self._under_other_name(folder, sha256, size, ext, self._stored_names([sha256]).get(sha256))

    def _at_own_name(self, folder: str, sha256: str, size: int, ext: str) -> str | None:
        # The name this download would take first: one stat, the usual answer for content seen before.
        try:
            st = os.stat(f"{folder}{sha256}{ext}")
            if stat.S_ISREG(st.st_mode) and st.st_size == size:
                return f"audio/{sha256[:2]}/{sha256}{ext}"
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        return None

    def _stored_names(self, shas: list[str]) -> dict[str, str]:
        """The names these contents were stored under, as the ``stored`` table says (one query per 500)."""
        found: dict[str, str] = {}
        try:
            with self._db_lock:
                db = self._records()
                for i in range(0, len(shas), 500):
                    group = shas[i:i + 500]
                    found.update(db.execute(f"SELECT sha256, path FROM stored WHERE sha256 IN "
                                            f"({','.join('?' * len(group))})", group).fetchall())
        except sqlite3.Error:
            pass
        return found

    def _under_other_name(self, folder: str, sha256: str, size: int, ext: str, stored: str | None) -> str | None:
        """The same content under another extension (another site's name for it)."""
        if isinstance(stored, str) and re.fullmatch(rf"audio/{sha256[:2]}/{sha256}(\.[a-z0-9]{{1,5}})?", stored):
            try:
                st = os.stat(self.root / stored)
                if stat.S_ISREG(st.st_mode) and st.st_size == size:
                    return stored
            except OSError:
                pass
        if not self._legacy_content:
            return None
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if not name.startswith(sha256) or name == f"{sha256}{ext}" or name.endswith((".tmp", ".json")):
                    continue
                if entry.is_file(follow_symlinks=False) and entry.stat().st_size == size:
                    return f"audio/{sha256[:2]}/{name}"
        return None


class Partial:
    """One download's partial file and its running hash, as ``AudioStore.open_partial`` gives it. Appends only.

    The downloader calls it, never the other way round: ``take``/``hand_over``/``flush`` append, ``describe``
    and ``checkpoint`` keep the sidecar, ``restart`` truncates, and ``commit`` or ``discard`` ends it (``aclose``
    keeps it for a later attempt).

    Nothing touches the disk until bytes must be kept there: a file that arrives whole within one chunk is
    committed straight from memory (the downloader stores ``in_memory()`` itself), with no part file and no
    sidecar. The first batch handed over, or a flush after a cut, creates them (sidecar first, so a part file on
    disk always has the validators of its bytes beside it).

    Writing and hashing run in two threads, one batch of ``chunk_size`` at a time, while the event loop
    receives the next batch: both release the GIL, so a large download keeps up with loopback on spare cores
    and never stalls page fetches on a slow disk. At most two batches are in memory per download. A batch goes
    to the file as the pieces the socket gave (one writev, hashed piece by piece), never joined into a copy.
    """

    def __init__(self, store: AudioStore, key: str, record: Sidecar, chunk_size: int, *, on_disk: bool) -> None:
        self.store, self.key, self.record = store, key, record
        self._fh: BinaryIO | None = None
        self.offset = 0                        # bytes on disk; exact whenever no batch is in flight
        if on_disk:                            # a sidecar vouches for the part file: continue it
            self._fh = open(store.part_path(key), "r+b", buffering=0)
            self.offset = self._fh.seek(0, 2)
        self.received = self.offset            # bytes taken in, including those not yet on disk
        self.hasher = hashlib.sha256()
        self._chunk_size = chunk_size
        self._pieces: list[bytes] = []
        self._pending = 0
        self._writing: asyncio.Future[Any] | None = None
        self._next_checkpoint = self.offset + _CHECKPOINT

    @property
    def on_disk(self) -> bool:
        return self._fh is not None

    def head(self, size: int) -> bytes:
        """The file's first bytes: from disk, or from memory while nothing was written."""
        if self._fh is not None:
            return os.pread(self._fh.fileno(), size, 0)
        head = b""
        for piece in self._pieces:
            head += piece[:size - len(head)]
            if len(head) >= size:
                break
        return head

    def in_memory(self) -> list[bytes]:
        """The whole body, for a partial that never went to disk."""
        assert self._fh is None and self._writing is None
        return self._pieces

    async def rehash(self) -> None:
        """Hash the bytes already on disk once, off the event loop: a resumed partial can be a gigabyte."""
        self.hasher = await asyncio.to_thread(hash_prefix, self.store.part_path(self.key), self.offset)

    async def taken_digest(self) -> hashlib._Hash:
        """The sha256 of every byte taken in so far, as a copy (the running hash goes on): the batch in flight
        hashed first, the pieces not yet handed over (at most a chunk) hashed here. A failed write's error stays
        for the next ``flush`` to raise."""
        if self._writing is not None:
            await asyncio.wait({self._writing})
        h = self.hasher.copy()
        for piece in self._pieces:
            h.update(piece)
        return h

    def take(self, piece: bytes) -> bool:
        """Queue a piece; True when a batch is full and ``hand_over`` should be awaited."""
        self._pieces.append(piece)
        self._pending += len(piece)
        self.received += len(piece)
        return self._pending >= self._chunk_size

    async def flush(self) -> None:
        """Everything taken in is on disk and hashed when this returns."""
        await self.hand_over()
        await self._drain()
        if self.offset >= self._next_checkpoint:
            self.checkpoint()

    async def hand_over(self) -> None:
        await self._drain()
        if not self._pieces:
            return
        batch, self._pieces, self._pending = self._pieces, [], 0
        # Writing and hashing in two threads at once: a batch then costs the slower of the two, not both.
        self._writing = asyncio.gather(asyncio.to_thread(self._write, batch), asyncio.to_thread(self._hash, batch))

    async def _drain(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing

    def _write(self, batch: list[bytes]) -> None:
        if self._fh is None:
            self.store.save_sidecar(self.key, self.record)
            # "w+b": a part file left without its sidecar (a crash between the two) holds nothing we can vouch for.
            self._fh = open(self.store.part_path(self.key), "w+b", buffering=0)
        write_pieces(self._fh.fileno(), batch)
        self.offset += sum(map(len, batch))

    def _hash(self, batch: list[bytes]) -> None:
        update = self.hasher.update
        for piece in batch:
            update(piece)

    def checkpoint(self) -> None:
        """Record the validators and progress beside the part file (nothing to record before it exists)."""
        if self._fh is None:
            return
        self.record.written = self.offset
        self.store.save_sidecar(self.key, self.record)
        self._next_checkpoint = self.offset + _CHECKPOINT

    def describe(self, *, etag: str | None, last_modified: str | None, expected_size: int | None,
                 content_type: str | None, final_url: str | None) -> None:
        """What the bytes held belong to (written to the sidecar at the next checkpoint)."""
        record = self.record
        record.etag, record.last_modified, record.expected_size = etag, last_modified, expected_size
        record.content_type, record.final_url = content_type, final_url

    def readdress(self, url: str) -> None:
        """The bytes held are now asked of url (the link was re-resolved)."""
        self.record.url = url

    def expect(self, size: int) -> None:
        """The file's whole size, as the server told it."""
        self.record.expected_size = size

    async def commit(self, sha256: str, ext: str) -> str:
        """Store the part file under its content's name (``AudioStore.commit``); returns the relative path."""
        await self.aclose()
        return self.store.commit(self.key, sha256, self.offset, ext)

    async def discard(self) -> None:
        """Throw the bytes held and their sidecar away."""
        await self.aclose()
        if self.on_disk:
            self.store.discard(self.key)

    async def restart(self, url: str) -> None:
        """Nothing held any more: truncate the part file and start a new record for url."""
        await self._drain()
        self._pieces, self._pending = [], 0
        self.offset = self.received = 0
        self.hasher = hashlib.sha256()
        self.record = Sidecar(url=url)
        self._next_checkpoint = _CHECKPOINT
        if self._fh is not None:
            self._fh.truncate(0)
            self._fh.seek(0)
            self.store.save_sidecar(self.key, self.record)

    async def aclose(self) -> None:
        # Even when cancelled, let a batch in flight finish: closing the file under a writing thread would
        # let the descriptor number be reused and the write land in some other file.
        if self._writing is not None:
            writing, self._writing = self._writing, None
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                await asyncio.wait({writing})
                raise
            except Exception:  # noqa: S110 - the write's own error was already raised to the download
                pass
        if self._fh is not None:
            self._fh.close()


def hash_prefix(path: Path, length: int) -> hashlib._Hash:
    """The sha256 of a file's first length bytes (blocking)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        left = length
        while left > 0:
            block = fh.read(min(_MiB, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h


def write_pieces(fd: int, pieces: list[bytes]) -> None:
    """Write pieces in order with as few system calls as the kernel allows, without joining them first."""
    for i in range(0, len(pieces), _IOV_MAX):
        group = pieces[i:i + _IOV_MAX]
        want = sum(map(len, group))
        done = os.writev(fd, group) if len(group) > 1 else os.write(fd, group[0])
        if done < want:   # a short write (a full disk, a signal): finish it the slow way, or raise
            view = memoryview(b"".join(group))[done:]
            while view:
                view = view[os.write(fd, view):]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None
