"""What a download hands the archive: each of its exchanges, and a metadata record naming the stored file.

An audio exchange is recorded without its bytes unless the worker's ``archive.audio_payload`` says otherwise:
the file is kept content-addressed beside the archive, so the response record carries the digest and size of the
bytes that exchange carried (a resumed download's ranged exchanges each their own part), and once the file is
stored a ``metadata`` record, referring to the last exchange, names the file, its sha256 and size. A 304 that
confirms a stored file is an exchange too, and gets the same metadata record: the address still serves that file.

Hashing: the partial already hashes the file as it is written (off the event loop). An exchange that carried the
file from its first byte is the partial's bytes, so its digest is the partial's hash, never computed twice; a
file small enough to be stored straight from memory is hashed once, when it is stored, and its exchange is
recorded then. Only an exchange that carried a part after bytes already held (a resume) hashes its own bytes.

The lean path (crawler/http/http1.py) sends exactly the headers it is given after Host: they are recorded as
``http1.sent_headers`` lists them. HLS goes through the stack's httpx client, recorded by
crawler/http/recording.py; its metadata record is made here as well (``stored``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yarl

from crawler.archive import Archive, Exchange
from crawler.archive.writer import ArchiveWriter
from crawler.http.http1 import Answer, sent_headers
from crawler.http.recording import version_of

if TYPE_CHECKING:
    import httpx

    from crawler.worker.audiostore import Partial

# Answers with no body to read: recording none of it leaves nothing out.
_BODILESS = frozenset((204, 304))
# With ``audio_payload``, an exchange's bytes are held until it is recorded: past this many, the exchange is
# recorded as when the payload is kept apart (its digest; the stored file beside the archive holds the bytes),
# so a download holds at most this much for the archive. A kept body past OFF_LOOP is compressed and written in
# a thread, not on the event loop.
KEPT_MAX = 16 * 1024 * 1024
OFF_LOOP = 256 * 1024


def stored_fields(path: str, sha256: str, size: int, content_type: str | None,
                  page: str) -> tuple[tuple[str, str], ...]:
    """The metadata record's fields for a stored file (WARC application/warc-fields)."""
    return (("stored-file", path), ("sha256", sha256), ("size", str(size)),
            ("content-type", content_type or ""), ("page", page))


class Sent:
    """One request of a download and what was read of its answer."""

    __slots__ = ("answer", "from_zero", "hasher", "headers", "pieces", "read", "size", "started", "truncated",
                 "untaken", "url")

    def __init__(self, url: yarl.URL, headers: list[tuple[str, str]], started: float,
                 answer: Answer | httpx.Response) -> None:
        self.url, self.headers, self.started, self.answer = url, headers, started, answer
        self.read = False             # the body was read (else only the head was)
        self.from_zero = False        # the body is the partial's from its first byte: the partial hashes it
        self.hasher: Any = None       # else this exchange's own hash
        self.pieces: list[bytes] | None = None   # the bytes themselves, when they are archived
        self.size = 0
        self.truncated = "length"     # until the body ends
        self.untaken = b""            # a piece read but not taken into the partial (its first bytes refused)

    def take(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.hasher is not None:
            self.hasher.update(piece)
        elif self.pieces is not None:
            self.pieces.append(piece)
            if self.size > KEPT_MAX:      # too big to hold: its digest only, from here on
                self.hasher = hashlib.sha256()
                for held in self.pieces:
                    self.hasher.update(held)
                self.pieces = None


class Trail:
    """One download's exchanges on their way to the archive, and the id of the last one (what the stored file's
    metadata record refers to)."""

    __slots__ = ("_archive", "_clock", "_keep_body", "_page", "_waiting", "last")

    def __init__(self, archive: Archive, page: str, *, keep_body: bool, clock: Callable[[], float]) -> None:
        self._archive, self._page, self._keep_body, self._clock = archive, page, keep_body, clock
        self.last = ""
        self._waiting: Sent | None = None

    def now(self) -> float:
        return self._clock()

    def begin_body(self, sent: Sent, partial: Partial) -> None:
        """The answer's body is about to be taken into ``partial`` (after any restart of it)."""
        sent.read = True
        if self._keep_body:
            sent.pieces = []
        elif partial.received == 0:
            sent.from_zero = True
        else:
            sent.hasher = hashlib.sha256()

    async def ended(self, sent: Sent, partial: Partial) -> None:
        """The answer was closed: recorded now, or (a file stored from memory) once the file's hash is known."""
        if not sent.read:
            status = sent.answer.status_code
            bodiless = status in _BODILESS or status < 200 or sent.answer.headers.get("content-length") == "0"
            await self._record(sent, truncated="" if bodiless else "length")
        elif not sent.from_zero:
            digest = f"sha256:{sent.hasher.hexdigest()}" if sent.hasher is not None else ""
            await self._record(sent, digest=digest)
        elif sent.truncated == "" and not partial.on_disk and partial.received == sent.size:
            self._waiting = sent      # the whole file, in memory: its hash is the stored file's
        else:
            h = await partial.taken_digest()
            if sent.untaken:
                h.update(sent.untaken)
            await self._record(sent, digest=f"sha256:{h.hexdigest()}")

    async def settle(self, partial: Partial | None = None, sha256: str = "") -> None:
        """The exchange waiting for its digest: the stored file's ``sha256``, else the partial's bytes."""
        sent, self._waiting = self._waiting, None
        if sent is None:
            return
        if not sha256 and partial is not None:
            sha256 = (await partial.taken_digest()).hexdigest()
        await self._record(sent, digest=f"sha256:{sha256}" if sha256 else "")

    async def settle_stored(self, target: str, *, path: str, sha256: str, size: int,
                            content_type: str | None) -> None:
        """``settle(sha256=sha256)`` then ``stored(...)``: a file stored from memory. The exchange waiting and
        the metadata record go to the archive in one append when it can take them so (the crawl's writer: one
        write to its file and one to its index instead of two each)."""
        sent = self._waiting
        archive = self._archive
        if sent is None or not sha256 or sent.pieces is not None or not isinstance(archive, ArchiveWriter):
            await self.settle(sha256=sha256)
            self.stored(target, path=path, sha256=sha256, size=size, content_type=content_type)
            return
        self._waiting = None
        self.last, _ = archive.exchange_stored(
            self._exchange(sent, digest=f"sha256:{sha256}"), target,
            stored_fields(path, sha256, size, content_type, self._page), now=self._clock(), sha256=sha256)

    def _exchange(self, sent: Sent, *, digest: str = "", truncated: str | None = None) -> Exchange:
        answer = sent.answer
        raw = answer.raw_headers if isinstance(answer, Answer) else tuple(answer.headers.raw)
        kept = sent.pieces is not None
        return Exchange(
            role="audio", method="GET", url=str(sent.url), request_headers=sent_headers(sent.url, sent.headers),
            status=answer.status_code, response_headers=raw,
            body=b"".join(sent.pieces) if sent.pieces is not None else b"", started=sent.started, page=self._page,
            http_version=version_of(answer.extensions),
            truncated=sent.truncated if truncated is None else truncated,
            payload_digest="" if kept else digest, payload_size=-1 if kept or not digest else sent.size)

    async def _record(self, sent: Sent, *, digest: str = "", truncated: str | None = None) -> None:
        exchange = self._exchange(sent, digest=digest, truncated=truncated)
        if sent.pieces is not None and sent.size > OFF_LOOP:
            self.last = await asyncio.to_thread(self._archive.exchange, exchange)
        else:
            self.last = self._archive.exchange(exchange)

    def stored(self, target: str, *, path: str, sha256: str, size: int, content_type: str | None,
               refers_to: str | None = None) -> None:
        """The metadata record of the stored file, referring to the last exchange (or ``refers_to``)."""
        self._archive.metadata(target, stored_fields(path, sha256, size, content_type, self._page),
                               refers_to=self.last if refers_to is None else refers_to, page=self._page,
                               role="audio", now=self._clock(), sha256=sha256)
