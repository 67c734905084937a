"""Pages on the worker's disk, under names a hostile URL cannot steer.

Two formats, one index. Every stored page gets a line in pages/index.tsv:
location, URL, final URL, status, media type, time; the location says where the page's bytes are. The pages
stored are the HTML pages a task parses (store_pages); `crawler-worker page URL` finds the latest through the index.

warc (the default): a page is its request and response records in the node's archive (crawler/archive/:
  record-compressed WARC 1.1 in <data dir>/archive/, rotated and retired by the `archive` settings); the location
  is "<file>:<offset>:<length>" of the response record's gzip member there. With archiving off (archive.enabled
  false) the page store keeps a writer of its own in the same place, for the pages alone (response records, no
  request records). WARC is the archive
  format of web crawls (Heritrix, Common Crawl, the Internet Archive): standard tools (warcio, pywb) read and
  replay it, each record carries its fetch time and its digests, and a crawl of millions of pages makes a few
  large files instead of millions of small ones. One unbuffered append per page: a page the master heard about is
  in the file even if the worker is killed the next moment.
  The body is stored decoded, as the worker read it: Content-Encoding, Transfer-Encoding and Content-Length are
  kept as X-Archive-Orig-* headers (the Wayback convention) and a Content-Length of the stored body is added.
  A body cut at the page cap carries WARC-Truncated: length.

files: one file per page at pages/<host>/<h[:2]>/<h>.<ext>, where h is the SHA-1 of its URL and <host> keeps
  only [a-z0-9.-] (the port joins with "_"); the location is that relative path. Handy for eyeballing a small
  crawl; creating a file per page costs the worker a tenth of its CPU. With archiving on, the page's exchange is
  in the archive too (every exchange is), the file is an extra copy.

Locations of the WARC page store before the archive ("<file>.warc:<offset>:<length>", uncompressed files in
pages/) are still read.

Nothing of a URL's path reaches the file system in either format, so no URL can name a file outside the data dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from crawler.archive import Exchange
from crawler.archive.records import http_payload, parse_member, read_member
from crawler.archive.writer import ArchiveWriter

FORMATS = ("warc", "files")
_UNSAFE = re.compile(r"[^a-z0-9.-]")
_EXT = {"text/html": "html", "application/xhtml+xml": "html", "application/json": "json", "text/plain": "txt",
        "application/xml": "xml", "text/xml": "xml"}

Headers = Sequence[tuple[bytes, bytes]]


def safe_host(url: str) -> str:
    s = urlsplit(url)
    host = _UNSAFE.sub("_", (s.hostname or "unknown").lower()).strip(".") or "unknown"
    if s.port:
        host += f"_{s.port}"
    return host[:200]


class _Index:
    def __init__(self, root: Path) -> None:
        self._file = open(root / "index.tsv", "a", encoding="utf-8")
        self._second = -1
        self._stamp = ""

    def _iso(self, now: float) -> str:
        # ISO-8601 UTC with milliseconds, as the logs print times; the seconds part is formatted once a second.
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def add(self, location: str, url: str, final_url: str, status: int, content_type: str, now: float) -> None:
        clean_url = url.replace("\t", " ").replace("\n", " ")
        clean_final = final_url.replace("\t", " ").replace("\n", " ")
        self._file.write(f"{location}\t{clean_url}\t{clean_final}\t{status}\t{content_type}\t{self._iso(now)}\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _Store:
    """What both formats share: the pages/ directory, its index, the clock."""

    def __init__(self, data_dir: Path, clock: Callable[[], float]) -> None:
        self.root = data_dir / "pages"
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = _Index(self.root)
        self._clock = clock

    def read(self, location: str) -> bytes:
        return read_page(self.root, location)

    def flush(self) -> None:
        self._index.flush()

    def close(self) -> None:
        self._index.close()


class FilePageStore(_Store):
    def __init__(self, data_dir: Path, archive: ArchiveWriter | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(data_dir, clock)
        self._root = str(self.root)
        self._made: set[str] = set()
        self.archive = archive      # the node's, when it archives: each page's exchange goes there too

    def relative_path(self, url: str, content_type: str) -> str:
        h = hashlib.sha1(url.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{safe_host(url)}/{h[:2]}/{h}.{_EXT.get(content_type, 'bin')}"

    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes,
             headers: Headers = (), truncated: bool = False, *, sent: Headers = (),
             started: float | None = None) -> str:
        """Stores one page; returns its location (a path relative to pages/)."""
        if self.archive is not None:
            self.archive.exchange(page_exchange(final_url, status, body, headers, truncated, sent,
                                                self._clock() if started is None else started))
        # Plain os calls on strings: this runs once per page, and pathlib's objects cost more than the write.
        rel = self.relative_path(url, content_type)
        directory, _, name = rel.rpartition("/")
        full_dir = f"{self._root}/{directory}"
        if directory not in self._made:
            os.makedirs(full_dir, exist_ok=True)
            if len(self._made) > 100_000:   # a broad crawl meets many hosts: stay bounded
                self._made.clear()
            self._made.add(directory)
        # Written in place, no temporary file and rename: a page cut short by a crash is simply fetched and
        # written again.
        fd = os.open(f"{full_dir}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, body)
        finally:
            os.close(fd)
        self._index.add(rel, url, final_url, status, content_type, self._clock())
        return rel


class WarcPageStore(_Store):
    """Pages as the archive's records: each page a request and a response record of the node's ArchiveWriter
    (given), or its response record alone in a writer of its own in <data dir>/archive/ when the node archives
    nothing else."""

    def __init__(self, data_dir: Path, archive: ArchiveWriter | None = None, *, file_bytes: int = 1024 ** 3,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(data_dir, clock)
        self._own = archive is None
        self.archive = archive if archive is not None else ArchiveWriter(data_dir / "archive", "worker",
                                                                          file_bytes=file_bytes, clock=clock)

    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes,
             headers: Headers = (), truncated: bool = False, *, sent: Headers = (),
             started: float | None = None) -> str:
        """Archives one page (its request and its response); returns the response record's location,
        "<file>:<offset>:<length>" in the archive directory."""
        ex = page_exchange(final_url, status, body, headers, truncated, sent,
                           self._clock() if started is None else started)
        # The node's archive keeps the exchange (request and response); a writer of the page store's own (archiving
        # off) keeps the page: its response record alone, half the cost.
        file, offset, length = self.archive.response_at(ex) if self._own else self.archive.exchange_at(ex)
        location = f"{file}:{offset}:{length}"
        self._index.add(location, url, final_url, status, content_type, self._clock())
        return location

    def close(self) -> None:
        super().close()
        if self._own:
            self.archive.close()


PageStore = WarcPageStore | FilePageStore


def open_page_store(data_dir: Path, fmt: str = "warc", *, archive: ArchiveWriter | None = None) -> PageStore:
    """archive: the node's, when it archives its exchanges (for the warc format, absent: one for pages alone)."""
    if fmt == "files":
        return FilePageStore(data_dir, archive)
    if fmt == "warc":
        return WarcPageStore(data_dir, archive)
    raise ValueError(f"unknown page format {fmt!r}: expected one of {', '.join(FORMATS)}")


def page_exchange(final_url: str, status: int, body: bytes, headers: Headers, truncated: bool, sent: Headers,
                  started: float) -> Exchange:
    """A page fetch as the archive records it (the page's own chain: no ``page``)."""
    return Exchange(role="page", method="GET", url=final_url, request_headers=tuple(sent), status=status,
                    response_headers=tuple(headers), body=body, started=started,
                    truncated="length" if truncated else "")


def find_page(pages_dir: Path, url: str) -> str | None:
    """The location of the latest stored copy of url (as fetched, or as finally answered), from the index."""
    found = None
    with open(pages_dir / "index.tsv", encoding="utf-8") as index:
        for line in index:
            fields = line.split("\t", 3)
            if len(fields) >= 3 and url in (fields[1], fields[2]):
                found = fields[0]
    return found


def read_page(pages_dir: Path, location: str) -> bytes:
    """The stored body at an index location, in either format: "<file>.warc.gz:<offset>:<length>" is a record
    in the archive beside pages/ (its payload after the HTTP head is returned), "<file>.warc:<offset>:<length>"
    one in an uncompressed WARC file in pages/ (the page store before the archive), anything else a path under
    pages_dir."""
    for suffix in (".warc.gz:", ".warc:"):
        name, _, span = location.partition(suffix)
        if span:
            break
    else:
        path = (pages_dir / location).resolve()
        if not path.is_relative_to(pages_dir.resolve()):
            raise ValueError(f"not a page location: {location!r}")
        return path.read_bytes()
    offset, _, length = span.partition(":")
    if "/" in name or "\\" in name or name.startswith(".") or not offset.isdigit() or not length.isdigit():
        raise ValueError(f"not a page location: {location!r}")
    if suffix == ".warc.gz:":
        member = read_member(pages_dir.parent / "archive" / f"{name}.warc.gz", int(offset), int(length))
        _headers, block = parse_member(member)
        return http_payload(block)[1]
    with open(pages_dir / f"{name}.warc", "rb") as fh:
        fh.seek(int(offset))
        record = fh.read(int(length))
    _warc_head, _, block = record.partition(b"\r\n\r\n")
    _http_head, _, body = block.partition(b"\r\n\r\n")
    return body[:-4]     # the record's closing CRLF CRLF


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
