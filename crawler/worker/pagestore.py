"""Pages on the worker's disk, under names a hostile URL cannot steer.

Two formats, one index. Every stored page gets a line in pages/index.tsv:
location, URL, final URL, status, media type, time; the location says where the page's bytes are.

warc (the default): pages are appended as WARC/1.1 response records to pages/pages-<UTC time>-<n>.warc, a new
  file each start and each `warc_file_bytes`; the location is "<file>:<offset>:<length>". WARC is the archive
  format of web crawls (Heritrix, Common Crawl, the Internet Archive): standard tools (warcio, pywb) read and
  replay it, each record carries its fetch time and a SHA-1 payload digest, and a crawl of millions of pages
  makes a few large files instead of millions of small ones. One unbuffered append per page: a page the master
  heard about is in the file even if the worker is killed the next moment (the last record of a file a crash
  cut short is incomplete; readers stop there, and that page is fetched again).
  The body is stored decoded, as the worker read it: Content-Encoding, Transfer-Encoding and Content-Length are
  kept as X-Archive-Orig-* headers (the Wayback convention) and a Content-Length of the stored body is added.
  A body cut at the page cap carries WARC-Truncated: length.

files: one file per page at pages/<host>/<h[:2]>/<h>.<ext>, where h is the SHA-1 of its URL and <host> keeps
  only [a-z0-9.-] (the port joins with "_"); the location is that relative path. Handy for eyeballing a small
  crawl; creating a file per page costs the worker a tenth of its CPU.

Nothing of a URL's path reaches the file system in either format, so no URL can name a file outside the data dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from crawler import __version__

FORMATS = ("warc", "files")
_UNSAFE = re.compile(r"[^a-z0-9.-]")
_EXT = {"text/html": "html", "application/xhtml+xml": "html", "application/json": "json", "text/plain": "txt",
        "application/xml": "xml", "text/xml": "xml"}
# Headers that describe the bytes on the wire, not the decoded body we store.
_WIRE_HEADERS = frozenset((b"content-encoding", b"transfer-encoding", b"content-length"))
_CRLF_RUN = re.compile(rb"[\r\n]+")
_STATUS_LINES = {s.value: f"{s.value} {s.phrase}".encode() for s in HTTPStatus}

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
    def __init__(self, data_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(data_dir, clock)
        self._root = str(self.root)
        self._made: set[str] = set()

    def relative_path(self, url: str, content_type: str) -> str:
        h = hashlib.sha1(url.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{safe_host(url)}/{h[:2]}/{h}.{_EXT.get(content_type, 'bin')}"

    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes,
             headers: Headers = (), truncated: bool = False) -> str:
        """Stores one page; returns its location (a path relative to pages/)."""
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
    def __init__(self, data_dir: Path, *, file_bytes: int = 1024 ** 3,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(data_dir, clock)
        self._file_bytes = file_bytes
        self._fd = -1
        self._name = ""
        self._size = 0
        self._seq = 0
        self._stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(clock()))
        self._date_second = -1
        self._date = b""

    # ------------------------------------------------------------------ files
    def _roll(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        while True:
            name = f"pages-{self._stamp}-{self._seq:05d}.warc"
            self._seq += 1
            try:
                fd = os.open(self.root / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:      # a restart within the same second: the next number
                continue
            break
        self._fd, self._name, self._size = fd, name, 0
        info = (f"software: audio-crawler/{__version__}\r\nformat: WARC File Format 1.1\r\n"
                "conformsTo: https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/\r\n"
                ).encode()
        self._append(self._record(b"warcinfo", None, b"application/warc-fields", (info,),
                                  extra=f"WARC-Filename: {name}\r\n".encode()))

    def _append(self, data: bytes) -> int:
        offset = self._size
        try:
            _write_all(self._fd, data)
        except OSError:
            # A record cut short (disk full) must not stay in the file: the next one is appended after it and
            # the index would point at the wrong bytes. Truncating frees space, so it works on a full disk too.
            os.ftruncate(self._fd, offset)
            raise
        self._size += len(data)
        return offset

    def _record(self, kind: bytes, target: str | None, content_type: bytes, block: Sequence[bytes],
                extra: bytes = b"") -> bytes:
        """One record; its block given in parts, joined once with the head (a page body is copied once)."""
        head = [b"WARC/1.1\r\nWARC-Type: ", kind, b"\r\nWARC-Record-ID: <urn:uuid:", _uuid4(),
                b">\r\nWARC-Date: ", self._warc_date()]
        if target is not None:
            head += [b"\r\nWARC-Target-URI: ", _uri(target)]
        head += [b"\r\n", extra, b"Content-Type: ", content_type, b"\r\nContent-Length: ",
                 str(sum(map(len, block))).encode(), b"\r\n\r\n", *block, b"\r\n\r\n"]
        return b"".join(head)

    def _warc_date(self) -> bytes:
        second = int(self._clock())
        if second != self._date_second:    # formatted once a second, not once a record
            self._date_second = second
            self._date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)).encode()
        return self._date

    # ------------------------------------------------------------------ pages
    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes,
             headers: Headers = (), truncated: bool = False) -> str:
        """Appends one response record; returns its location, "<file>:<offset>:<length>"."""
        lines = [b"HTTP/1.1 ", _STATUS_LINES.get(status) or f"{status} ".encode(), b"\r\n"]
        for name, value in headers:
            if b"\r" in value or b"\n" in value:
                value = _CRLF_RUN.sub(b" ", value)
            if name.lower() in _WIRE_HEADERS:
                lines += [b"X-Archive-Orig-", name, b": ", value, b"\r\n"]
            else:
                lines += [name, b": ", value, b"\r\n"]
        lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n"]
        digest = _base32_160(hashlib.sha1(body).digest())
        extra = b"WARC-Payload-Digest: sha1:" + digest + b"\r\n"
        if truncated:
            extra += b"WARC-Truncated: length\r\n"
        record = self._record(b"response", final_url, b"application/http;msgtype=response",
                              (b"".join(lines), body), extra)
        if self._fd < 0 or (self._size and self._size + len(record) > self._file_bytes):
            self._roll()
        offset = self._append(record)
        location = f"{self._name}:{offset}:{len(record)}"
        self._index.add(location, url, final_url, status, content_type, self._clock())
        return location

    def close(self) -> None:
        super().close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


PageStore = WarcPageStore | FilePageStore


def open_page_store(data_dir: Path, fmt: str = "warc", *, warc_file_bytes: int = 1024 ** 3) -> PageStore:
    if fmt == "files":
        return FilePageStore(data_dir)
    if fmt == "warc":
        return WarcPageStore(data_dir, file_bytes=warc_file_bytes)
    raise ValueError(f"unknown page format {fmt!r}: expected one of {', '.join(FORMATS)}")


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
    """The stored body at an index location, in either format: "<file>.warc:<offset>:<length>" is a WARC
    record (its payload after the HTTP head is returned), anything else a path under pages_dir."""
    name, _, span = location.partition(".warc:")
    if not span:
        path = (pages_dir / location).resolve()
        if not path.is_relative_to(pages_dir.resolve()):
            raise ValueError(f"not a page location: {location!r}")
        return path.read_bytes()
    offset, _, length = span.partition(":")
    if "/" in name or name.startswith("."):
        raise ValueError(f"not a page location: {location!r}")
    with open(pages_dir / f"{name}.warc", "rb") as fh:
        fh.seek(int(offset))
        record = fh.read(int(length))
    _warc_head, _, block = record.partition(b"\r\n\r\n")
    _http_head, _, body = block.partition(b"\r\n\r\n")
    return body[:-4]     # the record's closing CRLF CRLF


def _uri(url: str) -> bytes:
    # A target URI is one header line: no control characters, whatever the page linked to.
    return url.encode("utf-8", "surrogatepass").translate(None, bytes(range(32)) + b"\x7f")


_B32 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = [bytes((_B32[i >> 5], _B32[i & 31])) for i in range(1024)]
_B32_SHIFTS = range(150, -1, -10)


def _base32_160(digest: bytes) -> bytes:
    """RFC 4648 base32 of a 20-byte digest (no padding is needed at 160 bits), by 10-bit table lookups:
    base64.b32encode is pure Python on 3.11 and was a third of the cost of archiving a page."""
    n = int.from_bytes(digest, "big")
    return b"".join([_B32_PAIRS[(n >> shift) & 1023] for shift in _B32_SHIFTS])


def _uuid4() -> bytes:
    """A random (version 4) UUID in its text form, without building a uuid.UUID."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}".encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
