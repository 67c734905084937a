"""WARC 1.1 records, sans-IO: an Exchange (or a record's fields) and a time in, one gzip member out; and back.

Each record is its own gzip member (a record-compressed ``.warc.gz``, as Heritrix, warcprox and Webrecorder
write them): a reader seeks to a record's offset and inflates that member alone, so the index's
(file, offset, length) is all it takes to read one record back.

What is written for an exchange:

- a ``response`` record: the status line, the headers as received and the body as read. A body stored decoded
  keeps the wire's Content-Encoding, Transfer-Encoding and Content-Length as X-Archive-Orig-* headers (the Wayback
  convention) and gets a Content-Length of the stored body, so a replay serves what is in the record;
- a ``request`` record (``application/http;msgtype=request``): the request line and the headers as sent, Host
  included, and the request's body; its ``WARC-Concurrent-To`` names the response record;
- for an exchange whose payload is kept apart (audio stored content-addressed beside the archive: ``body`` b""
  and ``payload_digest`` "sha256:<hex>"), a ``revisit`` record in place of the response, with the profile
  *identical-payload-digest* of WARC 1.1 (6.7.2): the HTTP head only, and the payload digest of the bytes the
  exchange carried. That is the standard's way of saying "the payload is not in this record, find it by its
  digest", and what readers (warcio, pywb) expect of a record without its payload; a ``response`` record whose
  payload digest names bytes it does not hold fails every digest check.

Every record carries ``WARC-Block-Digest`` and ``WARC-Payload-Digest`` (SHA-1 in base32, as web archives write
them; the kept-apart payload's SHA-256 in base32), ``WARC-Crawler-Role`` (what the exchange was for) and, for the
records of a chain, ``WARC-Crawler-Page`` (the page it belongs to), so a chain can be rebuilt from the files alone.

Nothing from the web reaches a header line unchecked: target URIs, header names and values lose their control
characters (CR and LF in a value become a space), so no URL or header a site sends can end a line or forge a
record.

The page path is hot (the crawl archives every page): the digests' base32 is table-driven, the record id is made
without uuid.UUID, the date formatted once a second, the request line's target sliced from the URL, and the
gzip made by ISA-L's deflate at its fastest level (isal: on a 20 KB page 4.5 times faster than zlib's level 1,
itself 2.4 times faster than the default level 6, for 14% more bytes than level 1; on a 1.2 KB page 6.7 times,
for 30% more).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any
from dataclasses import dataclass
from http import HTTPStatus

from isal import isal_zlib

from crawler import __version__
from crawler.archive import Exchange, Headers

# Headers that describe the bytes on the wire, not the decoded body we store.
_WIRE_HEADERS = frozenset((b"content-encoding", b"transfer-encoding", b"content-length"))
_STATUS_LINES = {s.value: f"{s.value} {s.phrase}".encode() for s in HTTPStatus}
_CONTROLS = bytes(range(32)) + b"\x7f"
_NAME_DROP = _CONTROLS + b" :"
_CRLF_RUN = re.compile(rb"[\r\n]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_VALUE_CONTROLS = bytes(c for c in range(32) if c != 9) + b"\x7f"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
REVISIT_PROFILE = b"http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
GZIP_LEVEL = 0     # isal's levels are 0 to 3; 0 is still deflate with Huffman coding, not stored blocks
READ_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Built:
    """One record as made: its gzip member, and what the index says of it (the writer adds where it went)."""

    member: bytes
    kind: str
    record_id: str
    target: str
    refers_to: str
    date: str
    digest: str          # WARC-Payload-Digest as written


@dataclass(frozen=True, slots=True)
class Record:
    """A record read back: where its member was, its WARC headers (in order) and its block."""

    offset: int
    length: int
    headers: tuple[tuple[str, str], ...]
    block: bytes

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)


class Maker:
    """Makes records. Holds only the formatted date of the last second seen (a cache, not state a caller sees):
    the records themselves depend on nothing but the arguments (and a random id)."""

    def __init__(self) -> None:
        self._cached = (-1, b"")      # one tuple, replaced whole: a second thread never sees half of it

    def date(self, now: float) -> bytes:
        second = int(now)
        cached = self._cached
        if second == cached[0]:        # formatted once a second, not once a record
            return cached[1]
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)).encode()
        self._cached = (second, date)
        return date

    # ------------------------------------------------------------------ exchanges
    def exchange(self, ex: Exchange) -> tuple[Built, Built]:
        """The response (or revisit) record of ``ex`` and its request record, in the order they are written."""
        response, request = self._exchange(ex, True)
        assert request is not None
        return response, request

    def response(self, ex: Exchange) -> Built:
        """The response (or revisit) record of ``ex`` alone (a page store that keeps pages, not exchanges)."""
        return self._exchange(ex, False)[0]

    def _exchange(self, ex: Exchange, with_request: bool) -> tuple[Built, Built | None]:
        date = self.date(ex.started)
        target = _uri(ex.url)
        response_id = b"<urn:uuid:" + _uuid4() + b">"
        common = _common(ex.role, ex.page)
        # The response.
        apart = not ex.body and ex.payload_digest.startswith("sha256:")
        head = _response_head(ex, apart)
        if apart:
            kind = b"revisit"
            block_digest = _sha1(head)
            payload_digest = b"sha256:" + _sha256_b32(ex.payload_digest[7:])
            extra = [b"WARC-Profile: ", REVISIT_PROFILE, b"\r\n"]
            if ex.payload_size >= 0:
                extra += [b"WARC-Crawler-Payload-Length: ", str(ex.payload_size).encode(), b"\r\n"]
            block: tuple[bytes, ...] = (head,)
        else:
            kind = b"response"
            if ex.payload_digest.startswith("sha256:"):
                # Audio with its bytes in the record: the digest the stored file is known by, of these bytes.
                payload_digest = b"sha256:" + base64.b32encode(hashlib.sha256(ex.body).digest())
            else:
                payload_digest = b"sha1:" + _base32_160(hashlib.sha1(ex.body).digest())
            whole = hashlib.sha1(head)
            whole.update(ex.body)
            block_digest = _base32_160(whole.digest())
            extra = []
            block = (head, ex.body)
        if ex.truncated:
            extra += [b"WARC-Truncated: ", _token(ex.truncated), b"\r\n"]
        response = _record(kind, response_id, date, target,
                           [*extra, *common, b"WARC-Block-Digest: sha1:", block_digest,
                            b"\r\nWARC-Payload-Digest: ", payload_digest, b"\r\n"],
                           b"application/http;msgtype=response", block)
        d, t = date.decode(), target.decode("utf-8", "replace")
        rid = response_id.decode()
        built = Built(response, kind.decode(), rid, t, "", d, payload_digest.decode())
        if not with_request:
            return built, None
        # The request.
        request_id = b"<urn:uuid:" + _uuid4() + b">"
        request_head = _request_head(ex)
        request_payload = (_base32_160(hashlib.sha1(ex.request_body).digest()) if ex.request_body
                           else _EMPTY_SHA1)
        whole = hashlib.sha1(request_head)
        whole.update(ex.request_body)
        request = _record(b"request", request_id, date, target,
                          [b"WARC-Concurrent-To: ", response_id, b"\r\n", *common,
                           b"WARC-Block-Digest: sha1:", _base32_160(whole.digest()),
                           b"\r\nWARC-Payload-Digest: sha1:", request_payload, b"\r\n"],
                          b"application/http;msgtype=request", (request_head, ex.request_body))
        return built, Built(request, "request", request_id.decode(), t, rid, d, "sha1:" + request_payload.decode())

    # ------------------------------------------------------------------ the other kinds
    def metadata(self, target: str, fields: Sequence[tuple[str, str]], *, refers_to: str, page: str, role: str,
                 now: float, sha256: str = "") -> Built:
        """A ``metadata`` record (application/warc-fields: one "name: value" line a field) about ``target``;
        ``sha256``: of the stored file it is about, kept as WARC-Crawler-SHA256 so the index can be rebuilt."""
        lines = []
        for name, value in fields:
            lines += [_name(name.encode("utf-8", "surrogatepass")), b": ",
                      _value(value.encode("utf-8", "surrogatepass")), b"\r\n"]
        sha = sha256.lower()
        extra = [b"WARC-Crawler-SHA256: ", sha.encode(), b"\r\n"] if _HEX64.match(sha) else []
        return self._plain(b"metadata", target, b"application/warc-fields", b"".join(lines), refers_to, page,
                           role, now, extra)

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> Built:
        """A ``resource`` record: ``block`` as it is (a rendered DOM, a screenshot)."""
        return self._plain(b"resource", target, _value(content_type.encode("utf-8", "surrogatepass")) or
                           b"application/octet-stream", block, refers_to, page, role, now)

    def warcinfo(self, filename: str, now: float, fields: Sequence[tuple[str, str]] = ()) -> Built:
        """A file's first record: what wrote it, and in which format."""
        info = [("software", f"audio-crawler/{__version__}"), ("format", "WARC File Format 1.1"),
                ("conformsTo", "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"),
                *fields]
        block = b"".join(_name(k.encode()) + b": " + _value(v.encode("utf-8", "surrogatepass")) + b"\r\n"
                         for k, v in info)
        record_id = b"<urn:uuid:" + _uuid4() + b">"
        date = self.date(now)
        digest = _base32_160(hashlib.sha1(block).digest())
        member = _record(b"warcinfo", record_id, date, None,
                         [b"WARC-Filename: ", _uri(filename), b"\r\nWARC-Block-Digest: sha1:", digest,
                          b"\r\nWARC-Payload-Digest: sha1:", digest, b"\r\n"],
                         b"application/warc-fields", (block,))
        return Built(member, "warcinfo", record_id.decode(), "", "", date.decode(), "sha1:" + digest.decode())

    def _plain(self, kind: bytes, target: str, content_type: bytes, block: bytes, refers_to: str, page: str,
               role: str, now: float, more: Sequence[bytes] = ()) -> Built:
        record_id = b"<urn:uuid:" + _uuid4() + b">"
        date = self.date(now)
        uri = _uri(target)
        refers = _uri(refers_to)
        # The block is the payload of a metadata or resource record: one digest serves as both.
        digest = _base32_160(hashlib.sha1(block).digest())
        extra = [b"WARC-Refers-To: ", refers, b"\r\n"] if refers else []
        extra += more
        member = _record(kind, record_id, date, uri,
                         [*extra, *_common(role, page), b"WARC-Block-Digest: sha1:", digest,
                          b"\r\nWARC-Payload-Digest: sha1:", digest, b"\r\n"], content_type, (block,))
        return Built(member, kind.decode(), record_id.decode(), uri.decode("utf-8", "replace"),
                     refers.decode("utf-8", "replace"), date.decode(), "sha1:" + digest.decode())


# ---------------------------------------------------------------------- building


def _record(kind: bytes, record_id: bytes, date: bytes, target: bytes | None, extra: list[bytes],
            content_type: bytes, block: Sequence[bytes]) -> bytes:
    """One record as one gzip member; its block given in parts, compressed without joining them."""
    size = sum(map(len, block))
    head = [b"WARC/1.1\r\nWARC-Type: ", kind, b"\r\nWARC-Record-ID: ", record_id, b"\r\nWARC-Date: ", date,
            b"\r\n"]
    if target is not None:
        head += [b"WARC-Target-URI: ", target, b"\r\n"]
    head += [*extra, b"Content-Type: ", content_type, b"\r\nContent-Length: ", str(size).encode(), b"\r\n\r\n"]
    z = _compressor(size)
    parts = [z.compress(b"".join(head))]
    parts += [z.compress(b) for b in block if b]
    parts += [z.compress(b"\r\n\r\n"), z.flush()]
    return b"".join(parts)


def _compressor(size: int) -> Any:
    # ISA-L's deflate (isal) at its fastest level: on the crawl's pages 4 to 6 times faster than zlib's level 1,
    # for 10 to 30% more bytes; any gzip reader reads it. Its state is cheap to set up whatever the record's size.
    return isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 16 + 15)


def _common(role: str, page: str) -> list[bytes]:
    out = [b"WARC-Crawler-Role: ", _token(role), b"\r\n"]
    if page:
        out += [b"WARC-Crawler-Page: ", _uri(page), b"\r\n"]
    return out


def _response_head(ex: Exchange, apart: bool) -> bytes:
    lines = [b"HTTP/", _token(ex.http_version) or b"1.1", b" ",
             _STATUS_LINES.get(ex.status) or f"{ex.status} ".encode(), b"\r\n"]
    decoded = ex.decoded
    for name, value in ex.response_headers:
        name = _name(name)
        if _BAD_VALUE.search(value):
            value = _value(value)
        if decoded and name.lower() in _WIRE_HEADERS:
            lines += [b"X-Archive-Orig-", name, b": ", value, b"\r\n"]
        else:
            lines += [name, b": ", value, b"\r\n"]
    # The length of the payload as stored: in this record, or (kept apart) beside it, when it is known.
    length = ex.payload_size if apart else len(ex.body)
    if decoded and length >= 0:
        lines += [b"Content-Length: ", str(length).encode(), b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


def _request_head(ex: Exchange) -> bytes:
    lines = [_token(ex.method) or b"GET", b" ", _uri(request_target(ex.url)), b" HTTP/",
             _token(ex.http_version) or b"1.1", b"\r\n"]
    for name, value in ex.request_headers:
        if _BAD_VALUE.search(value):
            value = _value(value)
        lines += [_name(name), b": ", value, b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


def request_target(url: str) -> str:
    """The request line's target of an absolute URL: its path and query ("/" when it has no path), without the
    fragment. A slice, not urlsplit: this runs for every archived request, and urlsplit was a seventh of the cost
    of archiving a page."""
    start = url.find("://")
    rest = url[start + 3:] if start >= 0 else url
    end = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if 0 <= i < end:
            end = i
    target = rest[end:].partition("#")[0]
    if not target.startswith("/"):
        target = "/" + target
    return target


def _uri(url: str) -> bytes:
    # A target URI is one header line: no control characters, whatever the page linked to; and a URI holds no
    # space (readers refuse one).
    b = url.encode("utf-8", "surrogatepass").translate(None, _CONTROLS)
    return b.replace(b" ", b"%20") if b" " in b else b


def uri_text(url: str) -> str:
    """A URI as the records write it (in WARC-Target-URI, WARC-Crawler-Page): what the index keeps too."""
    return _uri(url).decode("utf-8", "replace")


def token_text(s: str) -> str:
    """A token (a role) as the records write it."""
    return _token(s).decode("ascii")


def _token(s: str) -> bytes:
    return s.encode("ascii", "replace").translate(None, _NAME_DROP)


def _name(name: bytes) -> bytes:
    return name.translate(None, _NAME_DROP) or b"X-Empty"


def _value(value: bytes) -> bytes:
    return _CRLF_RUN.sub(b" ", value).translate(None, _VALUE_CONTROLS)


def _sha1(data: bytes) -> bytes:
    return _base32_160(hashlib.sha1(data).digest())


def _sha256_b32(hexdigest: str) -> bytes:
    """A SHA-256 given in hex, in base32 as WARC digests are written (and readers compare them)."""
    try:
        raw = bytes.fromhex(hexdigest)
    except ValueError:
        raise ValueError(f"not a SHA-256 in hex: {hexdigest[:80]!r}") from None
    if len(raw) != 32:
        raise ValueError(f"not a SHA-256 in hex: {hexdigest[:80]!r}")
    return base64.b32encode(raw)


def sha256_hex(digest: str) -> str:
    """The hex of a WARC SHA-256 digest ("sha256:<base32>" or "sha256:<hex>"); "" if it is none."""
    algo, _, value = digest.partition(":")
    if algo.lower() != "sha256":
        return ""
    if len(value) == 64:
        return value.lower()
    try:
        return base64.b32decode(value.upper()).hex()
    except ValueError:
        return ""


_B32 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = [bytes((_B32[i >> 5], _B32[i & 31])) for i in range(1024)]
_B32_SHIFTS = range(150, -1, -10)


def _base32_160(digest: bytes) -> bytes:
    """RFC 4648 base32 of a 20-byte digest (no padding is needed at 160 bits), by 10-bit table lookups:
    base64.b32encode is pure Python on 3.11 and was a third of the cost of archiving a page."""
    n = int.from_bytes(digest, "big")
    return b"".join([_B32_PAIRS[(n >> shift) & 1023] for shift in _B32_SHIFTS])


_EMPTY_SHA1 = _base32_160(hashlib.sha1(b"").digest())   # a GET's request payload


def _uuid4() -> bytes:
    """A random (version 4) UUID in its text form, without building a uuid.UUID."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}".encode()


# ---------------------------------------------------------------------- reading


def parse_member(member: bytes) -> tuple[tuple[tuple[str, str], ...], bytes]:
    """One gzip member (one record) back to its WARC headers, in order, and its block. ValueError if it is not
    a whole record."""
    try:
        z = zlib.decompressobj(31)
        raw = z.decompress(member)
    except zlib.error as e:
        raise ValueError(f"not a gzip member: {e}") from None
    if not z.eof:
        raise ValueError("the gzip member is cut short")
    return parse_record(raw)


def parse_record(raw: bytes) -> tuple[tuple[tuple[str, str], ...], bytes]:
    """An uncompressed record back to its WARC headers and its block."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"WARC/"):
        raise ValueError("not a WARC record")
    headers = []
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            headers.append((name.decode("utf-8", "replace").strip(), value.decode("utf-8", "replace").strip()))
    length = next((v for k, v in headers if k.lower() == "content-length"), None)
    if length is None or not length.isdigit() or len(rest) < int(length) + 4:
        raise ValueError("the record's block is cut short")
    return tuple(headers), rest[:int(length)]


def http_payload(block: bytes) -> tuple[bytes, bytes]:
    """An application/http block split into its head (start line and headers) and its payload."""
    head, _, payload = block.partition(b"\r\n\r\n")
    return head, payload


def read_member(path: str | os.PathLike[str], offset: int, length: int) -> bytes:
    """The raw gzip member at (offset, length) of a file."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"{os.fspath(path)}: no member of {length} bytes at {offset}")
    return data


def iter_records(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Every whole record of a record-compressed WARC file, in order; a last member a crash cut short ends the
    walk (what follows it cannot be told from garbage)."""
    with open(path, "rb") as fh:
        offset = 0
        pending = b""
        eof = False
        while True:
            z = zlib.decompressobj(31)
            out: list[bytes] = []
            used = 0
            data = pending
            pending = b""
            while True:
                if not data:
                    if eof:
                        return
                    data = fh.read(READ_CHUNK)
                    if not data:
                        eof = True
                        if not out and not used:
                            return
                        return      # a member cut short
                try:
                    out.append(z.decompress(data))
                except zlib.error:
                    return
                if z.eof:
                    pending = z.unused_data
                    used += len(data) - len(pending)
                    break
                used += len(data)
                data = b""
            try:
                headers, block = parse_record(b"".join(out))
            except ValueError:
                return
            yield Record(offset, used, headers, block)
            offset += used
