"""The archive: every HTTP exchange a node makes, kept as WARC 1.1 records, and evidence bundles made from them.

The parts, each with one job:

- ``records.py``: the records themselves, sans-IO (an Exchange and a time in, bytes out): a ``request`` and a
  ``response`` record per exchange, tied by ``WARC-Concurrent-To``, ``WARC-Block-Digest`` and
  ``WARC-Payload-Digest`` on each, ``metadata`` and ``resource`` records, one gzip member per record;
- ``writer.py``: the files on a node's disk (``<data dir>/archive/``), rotated by size and age, old ones removed
  by the retention settings, and the index that maps each record to its file, offset and length;
- ``wacz.py``: an evidence bundle (WACZ) of the records of some items' chains;
- ``evidence.py``: the chain of an item (page, resolver exchanges, audio exchange) found through the index.

The crawl's parts that make requests (the page fetcher, the downloader, the resolvers through their HTTP client, the
browser's proxy, the master's robots.txt fetch) are handed an ``Archive`` and call it once per exchange; with
archiving off they are handed ``NO_ARCHIVE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

Headers = tuple[tuple[bytes, bytes], ...]

# What an exchange was for; kept in each record (``WARC-Crawler-Role``) and in the index, so a chain can be read back.
ROLES = ("page", "robots", "api", "playlist", "audio", "segment", "browser")


class Exchange(msgspec.Struct, frozen=True):
    """One HTTP request and its answer, as the node sent and read them. A Struct, not a frozen dataclass: one is
    made for every page fetched, and a frozen dataclass sets each of its 15 fields through object.__setattr__
    (2 us, against 0.3)."""

    role: str                     # one of ROLES
    method: str
    url: str                      # the request's target (absolute)
    request_headers: Headers      # as sent, Host included
    status: int
    response_headers: Headers     # as received
    body: bytes                   # the payload as read (content-coding undone when ``decoded``)
    started: float                # wall-clock time the request was sent (the records' WARC-Date)
    page: str = ""                # the page whose chain this exchange belongs to ("" for a page fetch itself)
    request_body: bytes = b""
    http_version: str = "1.1"
    decoded: bool = True          # body stored decoded: the wire headers are kept as X-Archive-Orig-*
    truncated: str = ""           # WARC-Truncated ("length", "time", "disconnect"), "" when whole
    # When the payload is kept apart (audio stored content-addressed beside the archive) ``body`` is b"" and
    # these describe it: the digest of the bytes this exchange carried, their count, and the stored file.
    payload_digest: str = ""      # "sha256:<hex>" of the bytes this exchange carried
    payload_size: int = -1


@dataclass(frozen=True, slots=True)
class RecordRef:
    """One record as the index knows it: where its bytes are, and what it is."""

    file: str                     # a file name in the archive directory
    offset: int                   # of the record's gzip member
    length: int                   # of the gzip member
    kind: str                     # WARC-Type: request, response, metadata, resource, warcinfo
    role: str                     # one of ROLES
    target: str                   # WARC-Target-URI
    record_id: str                # "<urn:uuid:...>"
    refers_to: str                # WARC-Concurrent-To / WARC-Refers-To ("" if none)
    page: str                     # the chain's page ("" for a page's own records)
    date: str                     # WARC-Date
    digest: str                   # WARC-Payload-Digest as written ("" if none)
    sha256: str = ""              # for audio: the stored file's sha256 (hex), so a chain is found by it


class Archive(Protocol):
    """Where a node's exchanges go. Calls are cheap and never block on the disk for long (one append)."""

    def exchange(self, ex: Exchange) -> str:
        """Records ``ex`` as a request and a response record; returns the response record's id."""
        ...

    def metadata(self, target: str, fields: tuple[tuple[str, str], ...], *, refers_to: str, page: str,
                 role: str, now: float, sha256: str = "") -> str:
        """A ``metadata`` record (application/warc-fields) about ``target``; returns its id."""
        ...

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> str:
        """A ``resource`` record (a rendered DOM, a screenshot); returns its id."""
        ...


class NoArchive:
    """Archiving off: nothing kept, nothing costs."""

    def exchange(self, ex: Exchange) -> str:
        return ""

    def metadata(self, target: str, fields: tuple[tuple[str, str], ...], *, refers_to: str, page: str,
                 role: str, now: float, sha256: str = "") -> str:
        return ""

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> str:
        return ""


NO_ARCHIVE = NoArchive()
