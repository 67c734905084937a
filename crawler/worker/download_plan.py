"""What a download does next, decided from what is on disk and what the server answered. No I/O, no clock.

The downloader (downloader.py) gathers the inputs -- the partial file's length and sidecar (``Held``), one
response's status line and headers (``Head``), the configured limits (``Limits``) -- and carries out the
action returned here. The table, for a request that asked ``Range: bytes=<offset>-`` (guarded by ``If-Range``)
when bytes are held, or for the whole file when none are:

    3xx with a Location                            ``Redirect`` (the shell joins and follows it)
    a body encoded although identity was asked     ``Fail`` (bytes kept when some are held)
    304 to a conditional request                   ``Confirmed``: the finished file is still current
    403 / 410 (the link expired)                   ``Reresolve`` once, else ``Fail`` keeping the bytes
    429, 5xx (and a broken connection, which the   ``Retry`` from the bytes held, more of them if the
      downloader maps to ``Retry`` itself)           body broke off after a while
    416 with a total equal to what we hold         ``Complete``: the bytes held are the whole file
    416 otherwise                                  ``Restart`` from byte 0
    200 (range ignored, or If-Range failed)        ``Body`` from byte 0: truncate what is held, take this
    206 at byte 0 with nothing held                ``Body`` from byte 0
    206 at our offset, same validators and total   ``Body(append=True)``: append to what is held
    206 elsewhere, lengths that disagree,          ``Restart`` from byte 0
      or another file under the address
    after a re-resolve (``Held.new_address``)      the 206 is the same file only with the same ETag or the
                                                   same total size (another host's dates mean nothing)
    any other status                               ``Fail`` (bytes kept for a later crawl)
    a body announced larger than ``max_size``      ``Fail``, the partial discarded

While a ``Body`` is read: a body from byte 0 whose first bytes are not audio fails at once
(``check_start``); one longer than announced restarts, one beyond ``max_size`` fails (``overrun``). A finished
file must have the announced size and start like audio (``check_finished``).

Before asking (``overgrown``, ``whole``): a part file longer than its file starts over, one as long as it is
stored without a request.

Across attempts (``after``): a retry, or an answer that brought nothing, counts towards ``max_attempts`` in a row
without progress; a restart towards ``max_restarts``; a link is re-resolved once per download.

The values made on every attempt (``Head``, the answers and steps, ``Ask``, ``Tries``) are frozen msgspec Structs:
a small file's download makes half a dozen, and a Struct is made in a tenth of a frozen dataclass's time (Head and
Body 0.25 us against 2.9). ``Held`` and ``Limits``, which callers derive with dataclasses.replace, stay dataclasses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from crawler.web import media

if TYPE_CHECKING:
    from crawler.worker.audiostore import Finished

REDIRECTS = frozenset({301, 302, 303, 307, 308})
_EXPIRED = frozenset({403, 410})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)", re.IGNORECASE)
_MAX_BACKOFF = 30.0
FIRST_BYTES = media.HEAD_BYTES           # how much of a body's start is judged (``check_start``)


# ---- inputs ----

@dataclass(frozen=True, slots=True)
class Held:
    """What is on disk for this file: a valid prefix of ``offset`` bytes and the sidecar's record of them."""

    offset: int = 0                      # bytes held (in the part file)
    etag: str | None = None              # the validators and total size of the file those bytes belong to
    last_modified: str | None = None
    expected_size: int | None = None
    content_type: str | None = None
    on_disk: bool = False                # a part file exists (else a small body may stay in memory)
    new_address: bool = False            # the bytes came from another address (the link was re-resolved)


class Head(msgspec.Struct, frozen=True):
    """One response without its body: the status and the headers the decision reads (None when absent)."""

    status: int
    url: str                             # the address that answered, after redirects
    content_range: str | None = None
    content_length: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    content_type: str | None = None
    content_encoding: str = ""           # a coding still on the body ("" for none or identity)
    location: str | None = None
    conditional: bool = False            # our request carried If-None-Match / If-Modified-Since


@dataclass(frozen=True, slots=True)
class Limits:
    max_size: int                        # bytes: a larger file is refused
    chunk_size: int                      # a file announced up to this size is kept in memory, not on disk
    max_attempts: int = 5                # attempts in a row without progress
    max_restarts: int = 3                # times the bytes held may be thrown away
    retry_backoff: float = 1.0           # seconds before the 2nd attempt, doubling, capped at 30


# ---- actions ----

class Redirect(msgspec.Struct, frozen=True):
    location: str


class Confirmed(msgspec.Struct, frozen=True):
    """304: the finished file stands; a 304 may carry fresher validators (RFC 9110 15.4.5)."""

    etag: str | None
    last_modified: str | None


class Reresolve(msgspec.Struct, frozen=True):
    reason: str


class Retry(msgspec.Struct, frozen=True):
    reason: str
    delay: float = 0.0                   # seconds to wait first (set by ``after``)


class Restart(msgspec.Struct, frozen=True):
    """The bytes held are not a prefix of what the address now serves: truncate and ask from byte 0."""

    reason: str


class Complete(msgspec.Struct, frozen=True):
    """The bytes held are the whole file (a 416 naming their length as the total)."""

    size: int


class Fail(msgspec.Struct, frozen=True):
    """Give up on this item with ``reason``; ``discard`` when the bytes held are worthless."""

    reason: str
    discard: bool = False


class Body(msgspec.Struct, frozen=True):
    """Read this response's body: what the record of the file becomes, and how to read it.

    ``append``: continue the bytes held; otherwise truncate them (if any) and take the body from byte 0.
    ``bound``: more bytes than this received means ``overrun``. ``in_memory``: the whole file fits one chunk and
    is kept in memory to be stored in one piece. ``sniff``: judge the first bytes as soon as they are in.
    """

    append: bool
    etag: str | None
    last_modified: str | None
    expected_size: int | None
    content_type: str | None
    final_url: str
    bound: int
    in_memory: bool

    @property
    def sniff(self) -> bool:
        return not self.append


class Received(msgspec.Struct, frozen=True):
    """A body read to its clean end; ``complete`` when the file is whole, else the rest is to be asked for."""

    complete: bool


class Finish(msgspec.Struct, frozen=True):
    """Every byte is held: check and store the file."""


Answer = Redirect | Confirmed | Reresolve | Retry | Restart | Complete | Fail | Body
Outcome = Confirmed | Reresolve | Retry | Restart | Complete | Fail | Received
Step = Confirmed | Reresolve | Retry | Restart | Fail | Finish


class Ask(msgspec.Struct, frozen=True):
    """The headers one request adds for what is held (Range, If-Range) or known finished (conditionals)."""

    headers: dict[str, str]
    conditional: bool


class Tries(msgspec.Struct, frozen=True):
    """The count of what went wrong so far in one download."""

    failures: int = 0                    # attempts in a row that brought no bytes
    restarts: int = 0
    reresolved: bool = False


# ---- the decisions ----

def overgrown(offset: int, expected_size: int | None) -> bool:
    """A part file longer than the file it is a prefix of: nothing in it can be trusted, start over."""
    return expected_size is not None and offset > expected_size


def whole(offset: int, expected_size: int | None) -> bool:
    """Every byte of the file is held: nothing to ask for (a crash between the last byte and the commit)."""
    return expected_size is not None and offset == expected_size


def ask(held: Held, url: str, known: Finished | None) -> Ask | Fail:
    """What to ask ``url`` for, given the bytes held and the finished download known for this key."""
    if not url.lower().startswith(("http://", "https://")):
        return Fail(f"not an http(s) address: {url[:200]!r}", discard=True)
    headers = {"Accept-Encoding": "identity"}
    conditional = False
    if held.offset == 0 and known is not None:
        # Only a strong ETag: a weak one promises an equivalent file, and evidence must be the same bytes.
        # Last-Modified only from the address that gave it: another host's dates say nothing about this file.
        if known.etag and not known.etag.startswith("W/"):
            headers["If-None-Match"] = known.etag
            conditional = True
        elif known.last_modified and known.url == url:
            headers["If-Modified-Since"] = known.last_modified
            conditional = True
    if held.offset > 0:
        headers["Range"] = f"bytes={held.offset}-"
        # RFC 9110 13.1.5: If-Range takes a strong entity tag; a weak one could approve a different file.
        validator = held.etag if held.etag and not held.etag.startswith("W/") else held.last_modified
        # After a re-resolve the old validator may mean nothing to the new host: the 206 is judged here.
        if validator and not held.new_address:
            headers["If-Range"] = validator
    return Ask(headers, conditional)


def decide(held: Held, head: Head, limits: Limits) -> Answer:
    """What to do with one response, given the bytes held (see the module's table)."""
    status = head.status
    if status in REDIRECTS and head.location:
        return Redirect(head.location)
    if head.content_encoding:
        return Fail(f"body sent with Content-Encoding {head.content_encoding} although identity was asked",
                    discard=held.offset == 0)
    if status == 304 and head.conditional:
        return Confirmed(head.etag, head.last_modified)
    if status in _EXPIRED:
        return Reresolve(f"http {status}")
    if transient(status):
        return Retry(f"http {status}")
    if status == 416:
        m = _UNSATISFIED_RANGE.fullmatch((head.content_range or "").strip())
        total = int(m.group(1)) if m else None
        if held.offset > 0 and total == held.offset and held.expected_size in (None, total):
            return Complete(total)
        return Restart(f"http 416: holding {held.offset} bytes of a {total}-byte file")
    if status == 200:
        # The range was ignored, or If-Range said the file changed: this body is the whole file.
        return _body(held, head, limits, _length(head.content_length), append=False)
    if status == 206:
        m = _CONTENT_RANGE.fullmatch((head.content_range or "").strip())
        if m is None:
            return Restart("206 without a usable Content-Range")
        first, last = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        if first != held.offset:
            return Restart(f"asked for byte {held.offset}, got a range from {first}")
        length = _length(head.content_length)
        if last < first or (length is not None and length != last - first + 1) or (
                total is not None and last >= total):
            return Restart("Content-Length disagrees with Content-Range")
        if held.offset > 0 and not same_file(held, head, total):
            return Restart("the file changed under its address")
        return _body(held, head, limits, total, append=held.offset > 0)
    # Keep bytes already fetched: the address may come back, or be re-resolved on a later crawl.
    return Fail(f"http {status}", discard=held.offset == 0)


def same_file(held: Held, head: Head, total: int | None) -> bool:
    """Whether a 206 continues the file the bytes held belong to."""
    if held.expected_size is not None and total is not None and total != held.expected_size:
        return False
    if held.new_address:
        # Another host's validators need not match for the same file; the size is what both can agree on.
        return (held.etag is not None and head.etag == held.etag) or (
            held.expected_size is not None and total == held.expected_size)
    if held.etag and head.etag and head.etag != held.etag:
        return False
    return not (held.last_modified and head.last_modified and head.last_modified != held.last_modified
                and not (held.etag and head.etag))


def _body(held: Held, head: Head, limits: Limits, total: int | None, *, append: bool) -> Body | Fail:
    if append:
        # A 206 continuing our bytes that omits a validator keeps the one we had: it was judged the same file.
        etag, last_modified = head.etag or held.etag, head.last_modified or held.last_modified
        expected = total if total is not None else held.expected_size
        content_type = held.content_type
    else:
        # A body from byte 0 is described by its own response alone.
        etag, last_modified, expected, content_type = head.etag, head.last_modified, total, None
    if expected is not None and expected > limits.max_size:
        return Fail(f"too large: {expected} bytes (max {limits.max_size})", discard=True)
    if head.content_type:
        content_type = media.media_type(head.content_type)[:100] or None
    return Body(append=append, etag=etag, last_modified=last_modified, expected_size=expected,
                content_type=content_type, final_url=head.url,
                bound=expected if expected is not None else limits.max_size,
                in_memory=not held.on_disk and expected is not None and expected <= limits.chunk_size)


def check_start(first_bytes: bytes) -> Fail | None:
    """A body from byte 0 is judged by its first ``media.HEAD_BYTES``: a 2 GiB page of junk served as audio is
    refused after 4 KiB, not after all of it was downloaded."""
    return None if media.is_media(first_bytes) else Fail("not audio", discard=True)


def overrun(received: int, body: Body, limits: Limits) -> Fail | Restart:
    """More than ``body.bound`` bytes came: past the size limit, or past the size announced."""
    if received > limits.max_size:
        return Fail(f"too large: more than {limits.max_size} bytes", discard=True)
    return Restart(f"body longer than the {body.expected_size} bytes announced")


def body_ended(received: int, expected: int | None) -> Received:
    """A body that ended cleanly: a 206 that stopped short of the end leaves the rest to ask for."""
    return Received(expected is None or received >= expected)


def check_finished(size: int, expected_size: int | None, first_bytes: bytes) -> Fail | None:
    """Whether the bytes held make a file to keep."""
    if expected_size is not None and size != expected_size:
        return Fail(f"size {size} disagrees with the server's {expected_size}", discard=True)
    return check_start(first_bytes)


def after(tries: Tries, outcome: Outcome, *, progressed: bool, can_reresolve: bool,
          limits: Limits) -> tuple[Tries, Step]:
    """The next step of a download after one attempt; ``progressed`` when the attempt added bytes."""
    if isinstance(outcome, Retry):
        failures = 0 if progressed else tries.failures + 1
        if failures >= limits.max_attempts:
            return tries, Fail(f"gave up after {failures} attempts without progress: {outcome.reason}")
        return Tries(failures, tries.restarts, tries.reresolved), Retry(outcome.reason,
                                                                         backoff(failures, limits.retry_backoff))
    if isinstance(outcome, Restart):
        restarts = tries.restarts + 1
        if restarts > limits.max_restarts:
            return tries, Fail(f"gave up after {restarts} restarts: {outcome.reason}", discard=True)
        return Tries(tries.failures, restarts, tries.reresolved), outcome
    if isinstance(outcome, Reresolve):
        if not can_reresolve or tries.reresolved:
            return tries, Fail(f"link expired ({outcome.reason})")
        return Tries(tries.failures, tries.restarts, True), outcome
    if isinstance(outcome, Complete) or (isinstance(outcome, Received) and outcome.complete):
        return tries, Finish()
    if isinstance(outcome, Received):
        # A clean but short answer; one that brought nothing must not loop for ever.
        failures = 0 if progressed else tries.failures + 1
        if failures >= limits.max_attempts:
            return tries, Fail(f"gave up after {failures} answers without progress")
        return Tries(failures, tries.restarts, tries.reresolved), Retry("short answer")
    return tries, outcome


def transient(status: int) -> bool:
    """A status worth asking again for after a pause: the server is busy (429) or failing (5xx) for now."""
    return status == 429 or status >= 500


def backoff(failures: int, base: float) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: base, doubling, capped at 30; 0 for none."""
    return min(_MAX_BACKOFF, base * 2 ** (failures - 1)) if base > 0 and failures else 0.0


def _length(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    return int(value)
