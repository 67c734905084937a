"""A node's archive on its disk: record-compressed WARC files, rotated and retired, and the index of their records.

Files: ``<dir>/<prefix>-<UTC start, YYYYmmddHHMMSS>-<n>.warc.gz`` (the prefix names the node's role: "worker",
"master"), each with its index beside it, ``<same stem>.index.tsv``. A new file is started at each start of the
writer, when the next append would take it past ``file_bytes``, and once it is ``file_seconds`` old; each begins
with a ``warcinfo`` record.

Retention: at each new file, the oldest files (with their indexes) are removed while all of them hold more than
``keep_bytes``, and any whose last record is older than ``keep_seconds`` (a file's end is the start of the one
after it); 0 keeps all. The file being written is never removed.

Durability: one unbuffered append per exchange (its response and request members in one write; a download's
exchange with the metadata record of the file it stored, ``exchange_stored``), then one for their index lines.
What ``exchange`` returned for is in the file even if the process is killed the next moment.
A write that fails (disk full) is cut back off both files, so no record or line is left half written for the
next to follow. A crash can still cut the last record or line of a file: the next start writes a new file, cuts such a
tail off the newest old file and its index, and indexes the whole records the index missed (every field of an
entry is in the record's own headers: ``rebuild_index`` rewrites a lost index from its file); the index readers
skip a last line without its newline.

The index: one line per record, tab-separated, the fields of RecordRef in order. Every field is control-free by
construction (target URIs and pages lose their control characters in the record too), so a line is a line.
``iter_index`` reads them all back, ``read_record`` a record's gzip member by its RecordRef.

Sync on purpose: an append is a few microseconds of system calls and runs on the event loop, as the page store
always did; what costs is building the record (records.py), which does no I/O.
"""

from __future__ import annotations

import calendar
import errno
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from crawler.archive import ROLES, Exchange, RecordRef
from crawler.archive.records import (
    Built,
    Maker,
    Record,
    iter_records,
    parse_record,
    read_member,
    sha256_hex,
    token_text,
    uri_text,
)
from crawler.config import non_negative, positive, setting

log = logging.getLogger("crawler.archive")

WARC_SUFFIX = ".warc.gz"
INDEX_SUFFIX = ".index.tsv"
_FIELDS = tuple(f.name for f in fields(RecordRef))
_NAME = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]+?)-(?P<stamp>\d{14})-(?P<seq>\d{5,})\.warc\.gz$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TAIL_WALK = 64 * 1024 * 1024    # at most this much of an old file's end is read to find a torn record


@dataclass(frozen=True, kw_only=True)
class ArchiveConfig:
    """A node's `archive` section."""

    enabled: bool = setting("bool", True)
    file_bytes: int = setting("int", 1024 ** 3, positive)          # a new file past this size
    file_seconds: float = setting("float", 86_400.0, positive)     # a new file once the current is this old
    keep_bytes: int = setting("int", 0, non_negative)              # the oldest files removed past this total
    keep_seconds: float = setting("float", 0.0, non_negative)      # files older than this removed (0: none)
    audio_payload: bool = setting("bool", False)   # audio bytes written into the archive too, not only digests


class ArchiveWriter:
    """The Archive of one node: see the module's docstring. ``clock`` gives the wall-clock time of appends
    (file ages, metadata records' dates); an Exchange carries its own time."""

    def __init__(self, directory: Path, prefix: str = "worker", *, file_bytes: int = 1024 ** 3,
                 file_seconds: float = 86_400.0, keep_bytes: int = 0, keep_seconds: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"an archive file prefix is letters, digits, '_' and '.': {prefix!r}")
        self.directory = directory
        self.prefix = prefix
        self._file_bytes = file_bytes
        self._file_seconds = file_seconds
        self._keep_bytes = keep_bytes
        self._keep_seconds = keep_seconds
        self._clock = clock
        self._maker = Maker()
        # Appends are made on the event loop; the lock is for a caller on another thread (a browser's proxy),
        # whose records must not interleave with the loop's (uncontended, it costs a fraction of a microsecond).
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = -1
        self._index_fd = -1
        self.name = ""           # the file being written
        self._size = 0
        self._index_size = 0
        self._opened = 0.0
        self._info_size = 0      # of the current file's warcinfo record: a file holding only that is not rolled
        self._seq = 0
        # The closed files of this prefix, oldest first: (name, bytes with its index, start time).
        self._closed: list[tuple[str, int, float]] = []
        for path in sorted(directory.glob(f"{prefix}-*{WARC_SUFFIX}")):
            m = _NAME.match(path.name)
            if m is None or m["prefix"] != prefix:
                continue
            self._closed.append((path.name, _size(path) + _size(_index_path(path)), _stamp_time(m["stamp"])))
        if self._closed:
            _cut_torn_tail(directory / self._closed[-1][0])

    @classmethod
    def from_config(cls, cfg: ArchiveConfig, directory: Path, prefix: str, *,
                    clock: Callable[[], float] = time.time) -> ArchiveWriter:
        return cls(directory, prefix, file_bytes=cfg.file_bytes, file_seconds=cfg.file_seconds,
                   keep_bytes=cfg.keep_bytes, keep_seconds=cfg.keep_seconds, clock=clock)

    # ------------------------------------------------------------------ the Archive
    def exchange(self, ex: Exchange) -> str:
        response, request = self._maker.exchange(ex)
        sha = _payload_sha256(ex, response.digest)
        self._append((response, request), ex.role, ex.page, (sha, ""))
        return response.record_id

    def exchange_refs(self, ex: Exchange) -> tuple[RecordRef, RecordRef]:
        """Records ``ex``; the index entries of its response (or revisit) record and its request record."""
        response, request = self._maker.exchange(ex)
        sha = _payload_sha256(ex, response.digest)
        built = (response, request)
        refs = _refs(*self._append(built, ex.role, ex.page, (sha, "")), built, ex.role, ex.page, (sha, ""))
        return refs[0], refs[1]

    def exchange_at(self, ex: Exchange) -> tuple[str, int, int]:
        """Records ``ex``; where its response (or revisit) record is: (file, offset, length). What a page store
        keeps of a page, without the index entries exchange_refs makes."""
        response, request = self._maker.exchange(ex)
        sha = _payload_sha256(ex, response.digest)
        name, offset = self._append((response, request), ex.role, ex.page, (sha, ""))
        return name, offset, len(response.member)

    def response_ref(self, ex: Exchange) -> RecordRef:
        """Records the response (or revisit) record of ``ex`` alone; its index entry."""
        built = self._maker.response(ex)
        sha = _payload_sha256(ex, built.digest)
        return _refs(*self._append((built,), ex.role, ex.page, (sha,)), (built,), ex.role, ex.page, (sha,))[0]

    def response_at(self, ex: Exchange) -> tuple[str, int, int]:
        """Records the response (or revisit) record of ``ex`` alone; where it is: (file, offset, length)."""
        built = self._maker.response(ex)
        sha = _payload_sha256(ex, built.digest)
        name, offset = self._append((built,), ex.role, ex.page, (sha,))
        return name, offset, len(built.member)

    def metadata(self, target: str, fields: tuple[tuple[str, str], ...], *, refers_to: str, page: str,
                 role: str, now: float, sha256: str = "") -> str:
        built = self._maker.metadata(target, fields, refers_to=refers_to, page=page, role=role, now=now,
                                     sha256=sha256)
        self._append((built,), role, page, (sha256,))
        return built.record_id

    def exchange_stored(self, ex: Exchange, target: str, fields: tuple[tuple[str, str], ...], *, now: float,
                        sha256: str) -> tuple[str, str]:
        """Records ``ex`` and the ``metadata`` record about ``target`` of the file it stored (``fields``,
        referring to its response) in one append: three records, one write to the file and one to its index.
        Returns the ids of the response and of the metadata record."""
        response, request, meta = self._maker.exchange_metadata(ex, target, fields, now=now, sha256=sha256)
        self._append((response, request, meta), ex.role, ex.page, (_payload_sha256(ex, response.digest), "", sha256))
        return response.record_id, meta.record_id

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> str:
        built = self._maker.resource(target, content_type, block, refers_to=refers_to, page=page, role=role,
                                     now=now)
        self._append((built,), role, page, ("",))
        return built.record_id

    # ------------------------------------------------------------------ files
    def _append(self, built: tuple[Built, ...], role: str, page: str, sha256: tuple[str, ...]) -> tuple[str, int]:
        """Appends the records and their index lines; the file they went to and the first one's offset."""
        data = built[0].member if len(built) == 1 else b"".join([b.member for b in built])
        with self._lock:
            now = self._clock()
            if self._fd < 0 or (self._size + len(data) > self._file_bytes and self._size > self._info_size) \
                    or now - self._opened >= self._file_seconds:
                self._roll(now)
            offset = self._size
            self._write(built, role, page, sha256, data)
            return self.name, offset

    def _write(self, built: tuple[Built, ...], role: str, page: str, sha256: tuple[str, ...],
               data: bytes) -> None:
        # The index lines as _line writes a RecordRef, made from the records directly: building the RecordRefs
        # only to print them cost a fifth of archiving a page.
        name = self.name
        offset = self._size
        clean_role = _role_text(role)
        clean_page = uri_text(page) if page else ""
        out = []
        for b, sha in zip(built, sha256, strict=True):
            length = len(b.member)
            out.append(f"{name}\t{offset}\t{length}\t{b.kind}\t{clean_role}\t{b.target}\t{b.record_id}\t"
                       f"{b.refers_to}\t{clean_page}\t{b.date}\t{b.digest}\t{_sha_text(sha)}\n")
            offset += length
        lines = "".join(out).encode("utf-8", "surrogatepass")
        try:
            _write_all(self._fd, data)
        except OSError:
            # A record cut short (disk full) must not stay in the file: the next one would follow it and the
            # index point at the wrong bytes. Truncating frees space, so it works on a full disk too.
            os.ftruncate(self._fd, self._size)
            raise
        try:
            _write_all(self._index_fd, lines)
        except OSError:
            os.ftruncate(self._index_fd, self._index_size)
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._index_size += len(lines)

    def _roll(self, now: float) -> None:
        self._close_files()
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now))
        while True:
            name = f"{self.prefix}-{stamp}-{self._seq:05d}{WARC_SUFFIX}"
            self._seq += 1
            try:
                fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:      # a restart within the same second: the next number
                continue
            break
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        try:
            index_fd = os.open(_index_path(self.directory / name), flags, 0o644)
        except OSError:
            os.close(fd)
            os.unlink(self.directory / name)
            raise
        self._fd, self._index_fd, self.name = fd, index_fd, name
        self._size = self._index_size = 0
        self._opened = float(calendar.timegm(time.gmtime(now)))     # the start as the name says it
        self._retire(now)
        info = self._maker.warcinfo(name, now, (("isPartOf", self.prefix),))
        self._info_size = len(info.member)
        try:
            self._write((info,), "", "", ("",), info.member)
        except OSError:
            # A full disk: the empty files go, so that each append tried meanwhile leaves none behind.
            os.close(self._fd)
            os.close(self._index_fd)
            self._fd = self._index_fd = -1
            for path in (self.directory / name, _index_path(self.directory / name)):
                path.unlink(missing_ok=True)
            raise

    def _close_files(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            os.close(self._index_fd)
            self._closed.append((self.name, self._size + self._index_size, self._opened))
            self._fd = self._index_fd = -1

    def _retire(self, now: float) -> None:
        """Removes the closed files the retention settings no longer keep, oldest first."""
        if not self._keep_bytes and not self._keep_seconds:
            return
        total = sum(size for _, size, _ in self._closed)
        while self._closed:
            name, size, _ = self._closed[0]
            end = self._closed[1][2] if len(self._closed) > 1 else self._opened
            too_big = bool(self._keep_bytes) and total + self._size > self._keep_bytes
            too_old = bool(self._keep_seconds) and now - end > self._keep_seconds
            if not (too_big or too_old):
                break
            for path in (self.directory / name, _index_path(self.directory / name)):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:     # left for the next turn; the crawl goes on
                    log.warning("archive: cannot remove %s: %s", path, e.strerror or e)
            total -= size
            del self._closed[0]

    def files(self) -> list[str]:
        """The names of this writer's files on disk, oldest first, the current one last."""
        return [n for n, _, _ in self._closed] + ([self.name] if self._fd >= 0 else [])

    def close(self) -> None:
        with self._lock:
            self._close_files()


def open_archive(cfg: ArchiveConfig, directory: Path, prefix: str, *,
                 clock: Callable[[], float] = time.time) -> ArchiveWriter | None:
    """A node's writer, or None when its config turns archiving off."""
    return ArchiveWriter.from_config(cfg, directory, prefix, clock=clock) if cfg.enabled else None


# ---------------------------------------------------------------------- reading


def iter_index(archive_dir: Path) -> Iterator[RecordRef]:
    """Every record the index files of ``archive_dir`` name, file by file in name order (oldest first within a
    prefix). A last line a crash cut short, and any line that is not a whole entry, is skipped."""
    for path in sorted(archive_dir.glob(f"*{INDEX_SUFFIX}")):
        yield from _index_refs(path)


def _index_refs(path: Path) -> Iterator[RecordRef]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:     # removed by retention meanwhile
        return
    for raw in data.split(b"\n")[:-1]:       # what follows the last newline is a line cut short
        parts = raw.decode("utf-8", "surrogateescape").split("\t")
        if len(parts) != len(_FIELDS):
            continue
        try:
            yield RecordRef(parts[0], int(parts[1]), int(parts[2]), *parts[3:])
        except ValueError:
            continue


def read_record(archive_dir: Path, ref: RecordRef) -> bytes:
    """The raw gzip member of the record ``ref`` names."""
    name = ref.file
    if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(WARC_SUFFIX):
        raise ValueError(f"not an archive file: {name!r}")
    return read_member(archive_dir / name, ref.offset, ref.length)


# ---------------------------------------------------------------------- helpers


def _refs(name: str, offset: int, built: tuple[Built, ...], role: str, page: str,
          sha256: tuple[str, ...]) -> list[RecordRef]:
    """The index entries of records appended together at ``offset`` of the file ``name``: what _write wrote."""
    refs = []
    clean_role = _role_text(role)
    clean_page = uri_text(page) if page else ""
    for b, sha in zip(built, sha256, strict=True):
        refs.append(RecordRef(name, offset, len(b.member), b.kind, clean_role, b.target, b.record_id,
                              b.refers_to, clean_page, b.date, b.digest, _sha_text(sha)))
        offset += len(b.member)
    return refs


# The crawl's own roles as the records write them (token_text of each), so an append does not clean them again.
_ROLE_TEXTS = {role: token_text(role) for role in ROLES}


def _role_text(role: str) -> str:
    return _ROLE_TEXTS.get(role) or (token_text(role) if role else "")


def _payload_sha256(ex: Exchange, digest: str) -> str:
    """The hex SHA-256 of a record's payload, for its index line ("" when the exchange gave none). A revisit made
    from a digest given in hex (audio kept apart: the Maker refused it unless it is 64 hex digits) has it as
    given; decoding the record's base32 back (pure Python on 3.11) cost as much as writing the record."""
    given = ex.payload_digest
    if not given:
        return ""
    if not ex.body and len(given) == 71 and given.startswith("sha256:"):
        return given[7:].lower()
    return sha256_hex(digest)


def _sha_text(sha: str) -> str:
    if not sha:
        return ""
    low = sha.lower()
    return low if _HEX64.match(low) else ""


def _line(ref: RecordRef) -> str:
    return "\t".join(str(getattr(ref, f)) for f in _FIELDS) + "\n"


def _index_path(warc: Path) -> Path:
    return warc.with_name(warc.name[: -len(WARC_SUFFIX)] + INDEX_SUFFIX)


def _stamp_time(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y%m%d%H%M%S")))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def ref_of(name: str, record: Record) -> RecordRef:
    """The index entry of a record read back from the file ``name``: everything the index keeps is in the
    record's own headers."""
    h = {k.lower(): v for k, v in record.headers}
    digest = h.get("warc-payload-digest", "")
    sha = h.get("warc-crawler-sha256", "") or sha256_hex(digest)
    return RecordRef(name, record.offset, record.length, h.get("warc-type", ""), h.get("warc-crawler-role", ""),
                     h.get("warc-target-uri", ""), h.get("warc-record-id", ""),
                     h.get("warc-concurrent-to", "") or h.get("warc-refers-to", ""), h.get("warc-crawler-page", ""),
                     h.get("warc-date", ""), digest, sha if _HEX64.match(sha) else "")


def rebuild_index(warc: Path) -> int:
    """Writes the index of a WARC file anew from its records (an index lost or damaged); returns their count."""
    lines = [_line(ref_of(warc.name, r)) for r in iter_records(warc)]
    index = _index_path(warc)
    tmp = index.with_name(index.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8", errors="surrogateescape")
    os.replace(tmp, index)
    return len(lines)


def _cut_torn_tail(path: Path) -> None:
    """Cuts off the end of a file that is not whole gzip members (a record a crash cut short), from the end of
    the last record its index names; whole records past that end (a crash between the record and its index
    line) are indexed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    _cut_torn_line(_index_path(path))
    start = 0
    for ref in _index_refs(_index_path(path)):
        if ref.file == path.name:
            start = max(start, ref.offset + ref.length)
    if start >= size or size - start > _TAIL_WALK:
        return
    end = start
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            rest = fh.read()
    except OSError:
        return
    found: list[RecordRef] = []
    while rest:
        z = zlib.decompressobj(31)
        try:
            raw = z.decompress(rest)
        except zlib.error:
            break
        if not z.eof:
            break
        used = len(rest) - len(z.unused_data)
        try:
            headers, block = parse_record(raw)
        except ValueError:
            break
        found.append(ref_of(path.name, Record(end, used, headers, block)))
        end += used
        rest = z.unused_data
    if found:
        try:
            with open(_index_path(path), "a", encoding="utf-8", errors="surrogateescape") as index:
                index.write("".join(_line(r) for r in found))
            log.warning("archive: %d records of %s were not in its index: indexed", len(found), path.name)
        except OSError as e:
            log.warning("archive: cannot index the last records of %s: %s", path.name, e.strerror or e)
    if end < size:
        try:
            with open(path, "r+b") as fh:
                fh.truncate(end)
            log.warning("archive: %s ended in a record cut short (%d bytes): cut off", path.name, size - end)
        except OSError as e:
            if e.errno != errno.EROFS:
                log.warning("archive: cannot cut the torn end of %s: %s", path.name, e.strerror or e)


def _cut_torn_line(index: Path) -> None:
    """Cuts off a last index line without its newline (a crash in its write), so that lines can follow."""
    try:
        with open(index, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            if not size:
                return
            fh.seek(max(0, size - 65536))
            tail = fh.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            fh.truncate(size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= 65536 else size))
    except OSError:
        return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
