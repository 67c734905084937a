"""HTTP bodies bounded after decoding: the one reader every body the crawler takes from a web server goes through.

A server chooses the Content-Encoding, so it chooses how far a few KiB on the wire expand: one gzip layer over a
run of zeros is about 1000:1, and a stack of them (``Content-Encoding: gzip, gzip``) multiplies the ratios. So:

- a stack of more than one coding is refused outright (no real server needs one; RFC 9110 8.4 allows it, browsers
  cope, a crawler need not);
- a single coding is decoded here, incrementally, with the output of every step capped at what is left of the
  limit (zlib's ``max_length``), so the decoded size never passes the limit by more than one byte and the work
  per network chunk is bounded by the limit, not by the compression ratio;
- only the codings the crawler asks for (ACCEPT_ENCODING, sent with every request) are accepted: gzip and
  deflate always, br and zstd when their decoders are installed (brotli >= 1.2, whose output can be capped per
  call; the standard library's compression.zstd or its backport, with the window capped at 8 MiB as RFC 9659
  asks). Any other coding is refused rather than passed on undecoded.

Past the limit the body either ends (``cut``: pages and robots.txt are cut, as a browser would stop reading) or
raises BodyError (API answers and downloads: half a JSON document is no answer). BodyError is an
httpx.DecodingError, so every caller that handles httpx's errors already handles it, as a permanent failure.

The transport (crawler/http/transport.py) runs every response through a BoundedDecoder, so everything built on
it reads bounded bodies without doing anything: page fetches, resolvers' API calls and playlists, downloads, and
the master's robots.txt fetch.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from typing import Any

import httpx


def _optional(*names: str) -> Any:
    """The first of these modules that imports, or None: optional decoders, looked up by name so the type
    checker's view does not depend on which of them this machine has."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


brotli: Any = _optional("brotli")
# Before 1.2 the output of one call cannot be capped: a bomb would inflate whole.
if brotli is not None and "output_buffer_limit" not in (brotli.Decompressor.process.__doc__ or ""):
    brotli = None
zstd: Any = _optional("compression.zstd", "backports.zstd")     # the standard library's from Python 3.14

# The codings we decode, by name (RFC 9110 18.6; x-gzip is gzip's old alias).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_ZSTD_WINDOW_LOG = 23     # 8 MiB: RFC 9659 3 (a larger window is the sender's way to make us allocate)


def _brotli() -> Callable[[bytes, int], bytes]:
    d = brotli.Decompressor()

    def step(data: bytes, room: int) -> bytes:
        out: bytes
        if not d.can_accept_more_data():
            out = b"" if not data else d.process(b"", output_buffer_limit=room)
        else:
            out = d.process(data, output_buffer_limit=room)
        return out
    return step


def _zstd() -> Callable[[bytes, int], bytes]:
    d = zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: _ZSTD_WINDOW_LOG})

    def step(data: bytes, room: int) -> bytes:
        if d.eof:
            return b""    # what follows the frame is not part of the body
        out: bytes = d.decompress(data, max_length=room)
        return out
    return step


_STREAM_DECODERS: dict[str, Callable[[], Callable[[bytes, int], bytes]]] = {}
if brotli is not None:
    _STREAM_DECODERS["br"] = _brotli
if zstd is not None:
    _STREAM_DECODERS["zstd"] = _zstd
_STREAM_ERRORS: tuple[type[BaseException], ...] = tuple(
    e for e in (getattr(brotli, "error", None), getattr(zstd, "ZstdError", None), EOFError) if e is not None)
ACCEPT_ENCODING = ", ".join(["gzip", "deflate", *_STREAM_DECODERS])
# A body is read this much at a time unless a request's ``read_size`` asks for more (downloads read large chunks).
READ_CHUNK = 16 * 1024


class BodyError(httpx.DecodingError):
    """A body refused for what the server sent: too large once decoded, stacked or unknown codings, bad data."""


def content_coding(header: str | None) -> str:
    """The one coding a Content-Encoding header names ('' for none); BodyError for a stack or an unknown one."""
    if not header:
        return ""
    codings = [c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity"]
    if not codings:
        return ""
    if len(codings) > 1:
        raise BodyError(f"stacked content encodings refused: {header[:80]!r}")
    if codings[0] not in _WBITS and codings[0] not in _STREAM_DECODERS:
        raise BodyError(f"unsupported content encoding {codings[0][:40]!r}")
    return codings[0]


class BoundedDecoder:
    """Decodes one body chunk by chunk; the output in all never exceeds ``limit`` + 1 bytes.

    ``feed`` returns the decoded bytes of one chunk. When the body passes ``limit``, ``feed`` raises BodyError,
    or with ``cut`` returns what fits plus one byte (so the caller sees that the body was longer) and sets
    ``full``; feeding more after that returns nothing.
    """

    __slots__ = ("_first", "_stream", "_zlib", "coding", "cut", "full", "limit", "size")

    def __init__(self, coding: str, limit: int, *, cut: bool) -> None:
        self.coding = coding
        self.limit = limit
        self.cut = cut
        self.size = 0
        self.full = False
        self._zlib: Any = zlib.decompressobj(_WBITS[coding]) if coding in _WBITS else None
        self._stream = _STREAM_DECODERS[coding]() if coding in _STREAM_DECODERS else None
        self._first = True

    def feed(self, data: bytes) -> bytes:
        if self.full:
            return b""
        room = self.limit + 1 - self.size
        if self._zlib is not None:
            out = self._inflate(data, room)
        elif self._stream is not None:
            try:
                out = self._stream(data, room)[:room]
            except _STREAM_ERRORS as e:
                raise BodyError(f"undecodable {self.coding} body: {e}") from None
        else:
            out = data if len(data) <= room else data[:room]
        self.size += len(out)
        if self.size > self.limit:
            if not self.cut:
                raise BodyError(f"body larger than {self.limit} bytes"
                                + (f" once decoded ({self.coding})" if self.coding else ""))
            self.full = True
        return out

    def _inflate(self, data: bytes, room: int) -> bytes:
        d = self._zlib
        assert d is not None
        out: bytes
        try:
            out = d.decompress(data, room)
        except zlib.error as e:
            if not (self._first and self.coding == "deflate"):
                raise BodyError(f"undecodable {self.coding} body: {e}") from None
            # "deflate" is meant to be zlib-wrapped (RFC 9110 8.4.1.2); some servers send it raw, as httpx
            # and browsers accept.
            d = self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            try:
                out = d.decompress(data, room)
            except zlib.error as e2:
                raise BodyError(f"undecodable deflate body: {e2}") from None
        self._first = False
        # Input left in unconsumed_tail means the output reached room: the body is past the limit, and the
        # caller hears so from the size; the tail is never decoded.
        return out

