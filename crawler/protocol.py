"""The master/worker wire protocol, sans-IO: bytes in, messages out; messages in, bytes out.

A frame is a 4-byte unsigned big-endian length followed by that many bytes of msgpack: an array whose first
element is the message type code and the rest the message's fields in order. No sockets, no asyncio here: the
daemons own a thin stream shell (crawler/connection.py) around `FrameDecoder`, `encode` and a handshake object.

Each message is defined once, as a msgspec Struct (array_like, tagged with its type code) whose field types
carry every limit a peer's value must keep (msgspec.Meta: string lengths, integer and float ranges, byte sizes,
list and map sizes); audio items come from crawler/items.py, defined the same way. One msgspec decoder over the
union of all messages turns a payload into a checked message in one pass; the few checks a type cannot say
(a download outcome is ok or failed, the nested values of an item's free-form maps) run right after it.

Errors, split as h11 splits them: anything the peer sends that breaks the protocol raises `ProtocolError` (the
connection shell closes that one connection), with a one-line message naming the field. Misusing this module
from our own code (encoding a message past the frame limit, a handshake step out of order) raises
`LocalProtocolError`, never a ProtocolError, so a bug of ours is never blamed on the peer.

Every peer is hostile until it has proved the secret. The master's decoder takes a Hello of at most
PRE_AUTH_MAX_FRAME bytes and then an Auth of at most AUTH_MAX_FRAME (refused from the 4-byte header alone), and
every field is checked for its
type and range while it is decoded: integers within signed 64 bits and their field's range, floats finite,
strings capped (MAX_URL, MAX_TEXT, MAX_NAME), nonces and MACs exactly 32 bytes, ext types refused, so no value
reaches the store or the catalogue that SQLite or strict JSON refuse.

Handshake (version 4: the worker proves the secret first; the secret never crosses the wire):
    worker -> Hello(worker_id, version, capacity, nonce_w)
    master -> Challenge(nonce_m)                              (or Refused: protocol version not supported)
    worker -> Auth(mac = HMAC(secret, "crawler-worker" | T), fragment rules)
    master -> Welcome(proof = HMAC(secret, "crawler-master" | T), settings...)   or Refused(reason, code)
where T = version | capacity | nonce_w | nonce_m | worker_id | rules binds the whole Hello, the Auth's fragment
rules and both fresh nonces. The
master computes no HMAC over anything before the worker's MAC checks out, so an unauthenticated peer gets no
oracle to test guesses of the secret offline; a replayed Hello/Auth fails against a fresh nonce_m, and a replayed
Welcome against a fresh nonce_w. `MasterHandshake` and `WorkerHandshake` hold one connection's state and the
table of messages legal in each state (MASTER_RECEIVES, WORKER_RECEIVES), for the handshake and the session.

Every frame after the Welcome (version 11), both ways, is followed by a TAG_SIZE-byte tag: keyed BLAKE2b over
direction | sequence | frame (header and payload), with one key per direction derived from the secret and the
handshake's transcript (both nonces: fresh keys for every connection, see SessionKeys). The sequence is not sent:
each side counts the frames, from 0 after the Welcome, so a frame altered, injected, dropped, replayed or moved
fails its tag, and the connection closes (ProtocolError). A relay on the path can still cut the connection,
never speak on it. `FrameSealer` tags what a side sends, `FrameDecoder.authenticate` checks what it reads.

A refusal is final for that worker process (wrong secret, unknown id, other protocol version, its id already
connected): retrying cannot help until the operator changes something, so the worker exits. The one exception is
code DUPLICATE_ID seen by a worker that was connected before: its own old connection may not be gone yet.

Local faults: a worker whose disk is full or read-only sends Fault(reason, leases) to hand back the leases it cannot
finish and stops granting credit; the master routes its work to the live nodes and counts no attempt against the
URLs. The worker's next Credit says it can take work again.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
import re
import struct
import sys
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self, TypeVar

import msgspec
import msgspec.inspect as mi
from msgspec import Meta

# The caps on strings and containers are the records' own, the same on the wire (p.MAX_URL ... are these).
from crawler.items import (
    FAILED,
    INT64_MAX,
    MAX_ITEMS,
    MAX_MAP,
    MAX_NAME,
    MAX_TEXT,
    MAX_URL,
    OK,
    AudioItem,
    LinkMeta,
    Name,
    Text,
    Url,
)

# 2: Welcome carries max_depth; 3: Result carries the links cut at the depth limit, Welcome the private
# addresses the crawl may reach; Fetched, Task.after; 4: the worker proves the secret first, the master in its
# Welcome, and every value is range-checked; 5: Result may end with sitemap dates of its links; 6: Fault (a
# worker's local fault), Refused carries a code; 7: Result may end with the page's validators, a worker's
# Heartbeat names the leases it still works on (they are renewed), Result may end with the page's audio
# references (followed past the depth limit); DownloadAsk, DownloadGrant, DownloadDone: audio downloads under
# the master's politeness, one per address in the cluster; 8: a page reports before its downloads end (its items
# "pending"), each download's outcome comes in a DownloadReport, and the master hands the pending downloads of a
# node that died to another in a DownloadWork; 9: messages are msgspec Structs: every field is sent (a Task's
# validators as one [etag, last_modified] field), trailing fields with defaults may be left out; 10: the worker's
# Auth carries its resolvers' fragment rules (bound by its MAC), and the master tells connected workers the crawl's
# rules again in a FragmentRules when a worker brought new ones; 11: every frame after the Welcome carries a tag
# (a MAC with an implicit sequence number); 12: Result may end with what the page says about its links that may
# lead to audio (link_meta), and a Task carries it to the link's own fetch; 13: an audio item may carry its file's
# acoustic fingerprint (one made after its outcome went comes in a DownloadReport of its own), and a worker's
# Heartbeat its fingerprint backlog; 14: EvidenceAsk and EvidenceRecords, an item's archived chain fetched from the
# node that holds it; 15: Welcome carries the crawl's proxies and the sites' policies (crawler/sites.py), and the
# master's proof covers every setting of the Welcome, not only the fragment rules; a worker hands back the tasks
# of a site it cannot log into in a SiteWait (the site waits at the master, not the node)
PROTOCOL_VERSION = 15
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
# The largest frame the master reads before the peer proved the secret: a Hello with a 128-character id fits.
PRE_AUTH_MAX_FRAME = 640
# The same for the Auth that follows a Hello of the right version: it carries the worker's fragment rules.
MAX_RULES = 8                  # fragment rules a worker brings
MAX_RULE = 512                 # characters in one
AUTH_MAX_FRAME = 4608
# The largest frame the worker reads before the master proved the secret (a Welcome carries URL patterns, and the
# sites' policies with their cookies: the master refuses at load a sites table whose Welcome would not fit).
HANDSHAKE_MAX_FRAME = 4 * 1024 * 1024
NONCE_SIZE = 32
MAC_SIZE = 32
TAG_SIZE = 16                  # bytes of a session frame's tag: 128 bits, one tag per frame
_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size

# Range checks for values on the wire (the string caps MAX_URL, MAX_TEXT, MAX_NAME and the container caps
# MAX_ITEMS, MAX_MAP live with the records in crawler/items.py).
INT64_MIN = -(1 << 63)
MAX_WORKER_ID = 128            # characters
MAX_CAPACITY = 1_000_000       # tasks a worker may hold, and credit it may grant at once
MAX_DEPTH = (1 << 31) - 1
MAX_COUNT = (1 << 31) - 1      # counts the worker reports (links cut at the depth limit)
MAX_EXTRA_DEPTH = 16           # nesting inside an audio item's free-form `extra` map
_FLOAT_MAX = sys.float_info.max



class ProtocolError(Exception):
    """The peer broke the protocol: bad frame, bad message, message out of order, failed authentication."""


class FrameTooLarge(ProtocolError):
    pass


class HandshakeFailed(ProtocolError):
    """The handshake cannot go on; `reply` (a Refused) is what to send the peer before closing, if anything."""

    def __init__(self, message: str, reply: Refused | None = None) -> None:
        super().__init__(message)
        self.reply = reply


class PeerRefused(Exception):
    """The master refused us with a Refused message: `reason` is its word (wrong secret, unknown id ...), `code`
    what a program can act on (Refused.code)."""

    def __init__(self, reason: str, code: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class LocalProtocolError(ValueError):
    """Our own code misused this module: a frame past the limit, a handshake step out of order."""


# --------------------------------------------------------------------------------------------- field types
# Each limit once, as a type; msgspec checks it while decoding (and names the field when it does not hold).
_T = TypeVar("_T")
Many = Annotated[tuple[_T, ...], Meta(max_length=MAX_ITEMS)]
NonNeg = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]     # NaN and the infinities are refused
Seconds = Annotated[float, Meta(ge=0.0, le=1e12)]
Depth = Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
Capacity = Annotated[int, Meta(ge=0, le=MAX_CAPACITY)]
Nonce = Annotated[bytes, Meta(min_length=NONCE_SIZE, max_length=NONCE_SIZE)]
Mac = Annotated[bytes, Meta(min_length=MAC_SIZE, max_length=MAC_SIZE)]
WorkerId = Annotated[str, Meta(min_length=1, max_length=MAX_WORKER_ID)]
Rules = Annotated[tuple[Annotated[str, Meta(min_length=1, max_length=MAX_RULE, title="rule")], ...],
                  Meta(max_length=MAX_RULES)]
# The two validators of a page's answer, named for the error messages (tuple places have no names of their own).
ETag = Annotated[str, Meta(max_length=MAX_NAME, title="etag")]
LastModified = Annotated[str, Meta(max_length=MAX_NAME, title="last_modified")]


def check_json_value(v: Any, name: str, depth: int = 0) -> None:
    """Free-form data (an audio item's `extra`, `file_tags`) must be what strict JSON and SQLite can hold, within
    the limits every typed field keeps. msgspec decodes it as any value, so it is checked here, after decoding."""
    t = type(v)
    if v is None or t is bool:
        return
    if t is int:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ProtocolError(f"{name}: {v} is outside {INT64_MIN}..{INT64_MAX}")
    elif t is float:
        if not math.isfinite(v):
            raise ProtocolError(f"{name}: {v!r} is not a finite number")
    elif t is str:
        if len(v) > MAX_TEXT:
            raise ProtocolError(f"{name}: {len(v)} characters, more than {MAX_TEXT}")
    elif depth >= MAX_EXTRA_DEPTH:
        raise ProtocolError(f"{name}: nested deeper than {MAX_EXTRA_DEPTH}")
    elif t is list:
        if len(v) > MAX_ITEMS:
            raise ProtocolError(f"{name}: {len(v)} entries, more than {MAX_ITEMS}")
        for x in v:
            check_json_value(x, name, depth + 1)
    elif t is dict:
        if len(v) > MAX_MAP:
            raise ProtocolError(f"{name}: {len(v)} entries, more than {MAX_MAP}")
        for k, x in v.items():
            if type(k) is not str:
                raise ProtocolError(f"{name}: map keys must be strings")
            check_json_value(k, name, depth + 1)
            check_json_value(x, name, depth + 1)
    else:
        raise ProtocolError(f"{name}: {t.__name__} is not allowed here")


def _check_item(a: AudioItem, where: str) -> None:
    """What the item's types cannot say: its free-form maps hold only JSON values."""
    if a.extra:
        check_json_value(a.extra, f"{where}.extra")
    if a.file_tags:
        check_json_value(a.file_tags, f"{where}.file_tags")


# --------------------------------------------------------------------------------------------- messages
class Message(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A message: encoded as [TYPE, field, ...]. TYPE is the Struct's tag (set below for each message)."""

    TYPE: ClassVar[int]

    def _after_decode(self) -> None:
        """The checks a field type cannot say, run on a decoded message: ProtocolError naming the field."""

    def fields(self) -> list[Any]:
        """The message's fields as plain msgpack values, in wire order."""
        out: list[Any] = msgspec.msgpack.decode(_ENCODER.encode(self))
        return out[1:]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        """A message of this type from its fields, checked as if it came from a peer."""
        msg = decode_payload(_ENCODER.encode([cls.TYPE, *f]))
        assert isinstance(msg, cls)
        return msg


class Hello(Message, tag=1, frozen=True):
    worker_id: WorkerId
    version: Annotated[int, Meta(ge=0, le=1 << 31)]
    capacity: Capacity
    nonce: Nonce


class Challenge(Message, tag=2, frozen=True):
    """The master's fresh nonce. It carries no proof: the master proves the secret only in its Welcome."""

    nonce: Nonce


class Auth(Message, tag=3, frozen=True):
    mac: Mac
    # The fragment rules of the worker's resolvers (regexes of URLs whose fragment names the resource, see
    # crawler/web/urls.py): the master adds them to crawl.keep_fragment, so every node keys those URLs alike.
    # The MAC covers them.
    keep_fragment: Rules = ()


class CookieWire(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One record of a site's cookies file (crawler/web/cookies.py CookieRecord, field for field)."""

    domain: Name
    include_subdomains: bool
    path: Url
    secure: bool
    expires: NonNeg
    name: Name
    value: Text
    http_only: bool = False


class LoginWire(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    url: Url
    fields: Many[tuple[Name, Text]]
    success: Text


class SiteWire(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """What a worker needs of one site's policy (crawler/sites.py SitePolicy; its politeness is the master's
    own). proxies None: the crawl's; () : direct."""

    pattern: Name
    user_agent: Text | None = None
    headers: Many[tuple[Name, Text]] = ()
    max_depth: Depth | None = None
    proxies: Many[Url] | None = None
    cookies: Many[CookieWire] = ()
    login: LoginWire | None = None


class Welcome(Message, tag=4, frozen=True):
    """The master accepts the worker, proves it knows the secret, and tells it the settings the crawl shares."""

    proof: Mac                                # HMAC(secret, "crawler-master" | transcript): see master_proof()
    heartbeat_interval: Annotated[float, Meta(ge=0.001, le=86400.0)]
    keep_fragment: Many[Url] = ()             # URL patterns whose fragment is meaningful (normalise alike)
    # The master refuses larger frames: the worker splits its reports. Below 1024 bytes no report fits.
    max_frame: Annotated[int, Meta(ge=1024, le=0xFFFFFFFF)] = DEFAULT_MAX_FRAME
    # Links of a page at this depth would be too deep: the worker neither extracts nor reports them. (Reported
    # anyway, the master would drop them, and the worker's link cache would then hold back the same links found
    # later on a shallower page.) None: no limit.
    max_depth: Depth | None = None
    # Addresses outside the public internet the crawl may reach (crawler/http/targets.py): the seeds' "host:port"
    # and the configured networks ("10.0.0.0/8"). Everything else private is refused after DNS.
    allowed_origins: Many[Name] = ()
    allowed_networks: Many[Name] = ()
    # The rest of the crawl's URL normalisation (crawl.sort_query, crawl.drop_params), so that the worker keys its
    # links exactly as the master does.
    sort_query: bool = False
    drop_params: Many[Name] = ()
    # Where the crawl's requests leave from (crawler/http/proxies.py Proxy.wire, credentials included) and the
    # sites' own policies. The master's proof covers them with every other setting here.
    proxies: Many[Url] = ()
    sites: Many[SiteWire] = ()

    def settings(self) -> bytes:
        """Every field but the proof, encoded: what the master's proof covers besides the transcript."""
        return _ENCODER.encode(self.fields()[1:])


# Refused.code values: why, in a form the worker can act on (the reason is for people).
AUTH_FAILED = "auth"
UNKNOWN_ID = "unknown_id"
DUPLICATE_ID = "duplicate_id"


class Refused(Message, tag=5, frozen=True):
    # Without a code the frame keeps its version-2 shape [5, reason] (see encode), so a worker of any other
    # protocol version can still read why it was refused.
    reason: Name
    code: Name = ""


class Task(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    lease: NonNeg
    url: Url
    depth: Depth
    parent: Url | None = None
    # Start only when the page request of this earlier lease (sent to the same worker) ends, and not at all if
    # it was answered 429/503: the master hands out a host's next request ahead of the slot freeing, so the
    # host's concurrency limit is used to the full without a round trip to the master between requests.
    after: NonNeg | None = None
    # The page's validators from its last full answer, (ETag, Last-Modified), for a conditional fetch: a 304
    # then costs no body and no parse.
    validators: tuple[ETag | None, LastModified | None] | None = None
    # What the page that linked this URL said about the link (its names for the song: Result.link_meta), so that
    # audio found here is named without fetching that page again.
    link_meta: LinkMeta | None = None


class Assign(Message, tag=6, frozen=True):
    tasks: Many[Task]


# Result.status values
DONE = "done"          # fetched (any HTTP status the crawl treats as final, 404 included)
ERROR = "error"        # permanent failure (bad URL, refused by robots, too large ...)
RETRY = "retry"        # transient failure (timeout, connection reset, 5xx): the master may try again
# A page answered with one of these reports its Location as its one link: the same resource under another
# address, which the master queues at the redirecting URL's own depth.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class Result(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    lease: NonNeg
    url: Url
    status: Annotated[str, Meta(pattern=r"^(done|error|retry)\Z")]        # DONE, ERROR, RETRY
    http_status: Annotated[int, Meta(ge=0, le=999)] | None = None
    final_url: Url | None = None
    content_type: Name | None = None
    size: NonNeg | None = None
    error: Text | None = None
    links: Many[Url] = ()
    audio: Many[AudioItem] = ()
    # Links the page has but the worker did not follow because the page is at the crawl's depth limit: the
    # master counts them as discarded for depth without receiving them.
    cut: Annotated[int, Meta(ge=0, le=MAX_COUNT)] = 0
    # When some of the links' pages last changed, as a sitemap says: (link, epoch seconds).
    lastmod: Many[tuple[Annotated[str, Meta(max_length=MAX_URL, title="url")],
                        Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX, title="time")]]] = ()
    # What the page's answer says for its next visit: (ETag, Last-Modified, 64-bit digest of a 2xx body).
    validators: tuple[ETag | None, LastModified | None,
                      Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX, title="digest")] | None] | None = None
    # Addresses that resolve this page's audio (a playlist, a stream, an API answer): part of the page, so the
    # master queues them even past the depth limit (see crawler/web/urls.py AUDIO_REF_HOPS). Normalised, like links.
    refs: Many[Url] = ()
    # What the page says about those of its links (and refs) that may lead to audio without saying so (a
    # playlist, a stream named like a page): (link, its names). Normalised, like links. The master keeps each with
    # its link's frontier entry and hands it out in the link's Task.
    link_meta: Many[tuple[Annotated[str, Meta(max_length=MAX_URL, title="url")], LinkMeta]] = ()

    def to_wire(self) -> list[Any]:
        """The result as plain msgpack values, in wire order."""
        out: list[Any] = msgspec.msgpack.decode(_ENCODER.encode(self))
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> Result:
        """A result from plain values, checked as the master checks one from a peer."""
        return _decode_result(_ENCODER.encode(raw))


def _check_result_items(r: Result, where: str) -> None:
    for j, a in enumerate(r.audio):
        _check_item(a, f"{where}.audio[{j}]")


def _decode_result(payload: bytes) -> Result:
    try:
        r = _RESULT_DECODER.decode(payload)
    except _DECODE_ERRORS as e:
        raise _refusal(e, Result) from None
    _check_result_items(r, "Result")
    return r


def check_result(r: Result) -> None:
    """The master's checks on one result, for the worker to run before sending it: a value the master would
    refuse (a hostile page's 100 KiB title, a NaN duration) must not cost the connection, and with it every
    result in flight, each time the page is crawled again."""
    _decode_result(_ENCODER.encode(r))


class Report(Message, tag=7, frozen=True):
    results: Many[Result]

    def _after_decode(self) -> None:
        for i, r in enumerate(self.results):
            if r.audio:
                _check_result_items(r, f"Report.results[{i}]")


class ProxyCount(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One proxy's counters on a worker since it started (crawler/http/egress.py): its label, never its
    credentials."""

    label: Name
    requests: NonNeg
    failures: NonNeg


# A node counts at most this many proxies (crawler/http/proxies.py MAX_PROXIES).
MAX_PROXY_COUNTS = 64


class Heartbeat(Message, tag=8, frozen=True):
    """Both ways, every heartbeat interval. A worker's names the leases it still works on (a page being parsed,
    a long playlist resolved; never a download, which its page does not wait for): the master renews them, so
    only a dead or silent worker loses its leases."""

    sent_at: Finite
    leases: Many[NonNeg] = ()
    # Stored files waiting for the worker's fingerprint pool (the master's status shows it per node).
    fingerprint_backlog: Capacity = 0
    # Requests and failures per proxy, for the master's /metrics.
    proxies: Annotated[tuple[ProxyCount, ...], Meta(max_length=MAX_PROXY_COUNTS)] = ()


class Credit(Message, tag=9, frozen=True):
    """The worker may take `n` more tasks (flow control: the master never exceeds the credit granted)."""

    n: Capacity


class Shutdown(Message, tag=10, frozen=True):
    reason: Name


class PageFetch(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One page request ended (its answer read, or failed): what the host said and how fast."""

    lease: NonNeg
    http_status: Annotated[int, Meta(ge=100, le=999)] | None = None    # None: no answer (network error, timeout)
    retry_after: Seconds | None = None   # seconds, from a Retry-After header (a date already turned into seconds)
    latency: Seconds | None = None       # seconds from sending the request to having the page


class Fetched(Message, tag=20, frozen=True):
    """Sent by a worker the moment page requests end, ahead of their results (which wait for parsing and
    resolving, and are batched): the master frees the host's politeness slot at once, and a
    429/503 slows the host for every worker before anyone else is sent there."""

    fetches: Many[PageFetch]


class Fault(Message, tag=11, frozen=True):
    """The worker cannot store what it fetches (disk full, read-only, no permission): it hands back these
    leases, unfinished, and takes no work until its next Credit. Not the URLs' fault: no attempt is counted."""

    reason: Name
    leases: Many[NonNeg] = ()


class SiteWait(Message, tag=29, frozen=True):
    """A site cannot be logged into on this worker (a wrong password, its login server down): the worker hands
    back these leases of the site, unfinished. Not the node's fault and not the URLs': no attempt is counted,
    and the node keeps taking other work. The master parks the site (its URLs wait, outside the level barrier)
    until `retry_in` seconds from now, when this worker tries its login again."""

    site: Name            # the site's pattern in the sites: table
    reason: Text
    retry_in: Seconds
    leases: Many[NonNeg] = ()


class DownloadAsk(Message, tag=21, frozen=True):
    """The worker wants to download these audio addresses: (ticket, url), the ticket its own number for the
    download. The master answers each with a Grant, when the address's host may take one more download."""

    asks: Many[tuple[Annotated[int, Meta(ge=0, le=INT64_MAX, title="ticket")],
                     Annotated[str, Meta(max_length=MAX_URL, title="url")]]]


GRANT_GO = "go"        # download it now (a slot of its host is the worker's until its DownloadDone)
GRANT_COPY = "copy"    # already downloaded by `node`: record that place, fetch nothing


class Grant(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    ticket: NonNeg
    verdict: Annotated[str, Meta(pattern=r"^(go|copy)\Z")]               # GRANT_GO, GRANT_COPY
    node: Annotated[str, Meta(max_length=MAX_WORKER_ID)] | None = None     # copy: the node that holds the file
    sha256: Name | None = None
    size: NonNeg | None = None
    path: Name | None = None       # copy: where the file is in that node's data dir


class DownloadGrant(Message, tag=22, frozen=True):
    grants: Many[Grant]


class DownloadEnd(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    ticket: NonNeg
    sha256: Name | None = None     # set: the file is stored (then size and path too); None: it failed
    size: NonNeg | None = None
    path: Name | None = None


class DownloadDone(Message, tag=23, frozen=True):
    """Downloads the master granted ended: their hosts' slots are free, and the stored ones can be copied."""

    ends: Many[DownloadEnd]


class DownloadReport(Message, tag=24, frozen=True):
    """Downloads a worker's pages reported as pending (or the master handed it in a DownloadWork) ended: each
    the item as reported (its page and the address it was reported under, `url`, which name the pending
    download) and the item as it ended (status ok or failed; sha256, size, path, the file's tags, the reason).
    Sent by the worker as its downloads end, apart from the page reports, which never wait for them."""

    # (the address the item was pending under, the item as it ended)
    outcomes: Many[tuple[Annotated[str, Meta(max_length=MAX_URL, title="url")], AudioItem]]

    def _after_decode(self) -> None:
        for i, (_, item) in enumerate(self.outcomes):
            where = f"DownloadReport.outcomes[{i}]"
            if item.status not in (OK, FAILED):
                raise ProtocolError(f"{where}.status: {item.status[:40]!r} is not an outcome (ok or failed)")
            _check_item(item, where)


class DownloadWork(Message, tag=25, frozen=True):
    """The master hands a worker pending downloads as download-only work: those of a node that died (or did
    not come back after the master restarted), or the worker's own again after it rejoined (it ignores those it
    still runs). Each is the item as its page reported it (status pending); its outcome is a DownloadReport."""

    items: Many[AudioItem]

    def _after_decode(self) -> None:
        for i, a in enumerate(self.items):
            if not a.url:
                raise ProtocolError(f"DownloadWork.items[{i}].url: a download without an address")
            _check_item(a, f"DownloadWork.items[{i}]")


class FragmentRules(Message, tag=26, frozen=True):
    """The crawl's fragment rules changed (a worker joined whose resolvers brought new ones): every rule in force
    now, as a Welcome's keep_fragment. The worker keys its links with them from now on."""

    keep_fragment: Many[Url]


# Evidence: the items an ask may name, and the largest piece of an answer in one frame (a frame stays under the
# Welcome's max_frame too: the worker cuts its pieces to fit both).
MAX_EVIDENCE_ITEMS = 256
MAX_EVIDENCE_KNOWN = 16 * MAX_EVIDENCE_ITEMS   # catalogue rows told with an ask
MAX_EVIDENCE_CHUNK = 1024 * 1024
EVIDENCE_WARC = "warc"       # a piece of the record-compressed WARC stream of the chains' records
EVIDENCE_CHAINS = "chains"   # a piece of the JSON of the chains (steps, times, stored files) and their pages


class EvidenceAsk(Message, tag=27, frozen=True):
    """The master wants the archived chains of these items (audio URL, page URL or sha256) for an evidence
    bundle: the worker answers with EvidenceRecords under the same request number. A worker answers one ask at
    a time (another while one runs is answered with an error at once) and caps the bytes of an answer."""

    request: NonNeg
    wanted: Annotated[tuple[Url, ...], Meta(max_length=MAX_EVIDENCE_ITEMS)]
    records: bool = True     # False: only the chains (for the text of --show), no records
    # What the master's catalogue knows of the items: (item's place in wanted, its page, its audio URL). A chain
    # may lie on two nodes (the page fetched by one, the audio by another): the node with the page alone could
    # not tie it to an audio URL or a sha256 without this.
    known: Annotated[tuple[tuple[Annotated[int, Meta(ge=0, lt=MAX_EVIDENCE_ITEMS, title="item")],
                                 Annotated[str, Meta(max_length=MAX_URL, title="page")],
                                 Annotated[str, Meta(max_length=MAX_URL, title="audio")]], ...],
                     Meta(max_length=MAX_EVIDENCE_KNOWN)] = ()


class EvidenceRecords(Message, tag=28, frozen=True):
    """A piece of the answer to an EvidenceAsk: the WARC pieces first, in order, then the chains' JSON; the
    last piece says so. An answer that failed (no archive, past the cap, a stored file that is not its bytes) is
    one last piece carrying the error."""

    request: NonNeg
    part: Annotated[str, Meta(pattern=r"^(warc|chains)\Z")]     # EVIDENCE_WARC, EVIDENCE_CHAINS
    chunk: Annotated[bytes, Meta(max_length=MAX_EVIDENCE_CHUNK)] = b""
    last: bool = False
    error: Text | None = None


AnyMessage = (Hello | Challenge | Auth | Welcome | Refused | Assign | Report | Heartbeat | Credit | Shutdown
              | Fetched | Fault | DownloadAsk | DownloadGrant | DownloadDone | DownloadReport | DownloadWork
              | FragmentRules | EvidenceAsk | EvidenceRecords | SiteWait)
MESSAGE_TYPES: dict[int, type[Message]] = {}
for _cls in AnyMessage.__args__:
    _cls.TYPE = _cls.__struct_config__.tag
    MESSAGE_TYPES[_cls.TYPE] = _cls

_ENCODER = msgspec.msgpack.Encoder()
# What msgspec's decoder raises for a peer's bytes: its own errors, UnicodeDecodeError for a string that is not
# UTF-8, RecursionError for containers nested past the interpreter's limit (inside an item's free-form maps).
_DECODE_ERRORS = (msgspec.MsgspecError, UnicodeDecodeError, RecursionError)
_DECODER: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(AnyMessage)
_RESULT_DECODER = msgspec.msgpack.Decoder(Result)


# --------------------------------------------------------------------------------------------- refusals
# msgspec says what is wrong and where by position ("Expected `int` <= 999 - at `$[1][0][3]`"); the peer's
# operator needs the field's name. The path is walked over the message's own type information.
_STEP = re.compile(r"\[(\d+)\]|\.(\w+)")
_LENGTH = re.compile(r"Expected `array` of (?:at most |at least )?length \d+, got (\d+)")
_MISSING = re.compile(r"Object missing required field `(\w+)`")


def _peek_type(payload: bytes) -> type[Message] | None:
    """The message class a payload names, read from its first bytes (an array header, then a small integer)."""
    if not payload:
        return None
    first = payload[0]
    i = 1 if 0x90 <= first <= 0x9F else 3 if first == 0xDC else 5 if first == 0xDD else None
    if i is None or len(payload) <= i:
        return None
    tag = payload[i] if payload[i] < 0x80 else payload[i + 1] if payload[i] == 0xCC and len(payload) > i + 1 else -1
    return MESSAGE_TYPES.get(tag)


def _unwrap(info: mi.Type) -> tuple[mi.Type, str | None]:
    """The type inside an Optional or an Annotated, and the title given to it, if any."""
    title = None
    while True:
        if isinstance(info, mi.Metadata):
            title = (info.extra_json_schema or {}).get("title", title)
            info = info.type
        elif isinstance(info, mi.UnionType) and len(info.types) == 2 and mi.NoneType() in info.types:
            info = next(t for t in info.types if not isinstance(t, mi.NoneType))
        else:
            return info, title


def _locate(root: type[Any] | None, path: str) -> tuple[str, mi.Type | None]:
    """The field a msgspec error path points at, by name ("Report.results[0].audio[1].duration"), and its type."""
    if root is None:
        return ("message type" if path == "$[0]" else "message"), None
    label, info = root.__name__, mi.type_info(root)
    tagged = issubclass(root, Message)
    for m in _STEP.finditer(path, 1):
        info, _ = _unwrap(info)
        index, name = m.groups()
        if isinstance(info, mi.StructType) and index is not None:
            i = int(index) - (1 if tagged else 0)
            tagged = False
            if i < 0:
                return f"{label} type", None
            if i >= len(info.fields):
                break
            label, info = f"{label}.{info.fields[i].name}", info.fields[i].type
        elif isinstance(info, (mi.DataclassType, mi.StructType)) and name is not None:   # a map: by name
            field = next((f for f in info.fields if f.name == name), None)
            if field is None:
                break
            label, info = f"{label}.{name}", field.type
        elif isinstance(info, (mi.VarTupleType, mi.ListType)) and index is not None:
            label, info = f"{label}[{index}]", info.item_type
        elif isinstance(info, mi.TupleType) and index is not None and int(index) < len(info.item_types):
            _, title = _unwrap(info.item_types[int(index)])
            label, info = (f"{label}.{title}" if title else f"{label}[{index}]"), info.item_types[int(index)]
        else:
            break
        tagged = False
    else:
        return label, info
    return f"{label} (at {path})", None


def _problem(what: str, info: mi.Type | None) -> str:
    """msgspec's words for what is wrong, in terms of the field's declared limits where it has them."""
    inner = _unwrap(info)[0] if info is not None else None
    numbers = [t for t in (inner.types if isinstance(inner, mi.UnionType) else (inner,))
               if isinstance(t, (mi.IntType, mi.FloatType))]
    if what.startswith("Expected `int` ") and numbers and "got" not in what:
        n = numbers[0]
        return f"outside {n.ge}..{n.le}"
    if what.startswith("Expected `float` ") and numbers and "got" not in what:
        n = numbers[-1]
        bounds = "" if n.le == _FLOAT_MAX else f" in {n.ge}..{n.le}"
        return f"not a finite number{bounds}"
    if isinstance(inner, mi.StructType) and (m := _LENGTH.match(what)):
        required = sum(f.required for f in inner.fields)
        # msgspec counts a message's type among the elements when there are too few, not when too many.
        got = int(m.group(1)) - (inner.tag is not None and "at least" in what)
        return f"expected {required} to {len(inner.fields)} fields, got {got}"
    return what[:1].lower() + what[1:]


def _refusal(e: Exception, root: type[Any] | None) -> ProtocolError:
    """A msgspec error as a one-line ProtocolError naming the field."""
    if isinstance(e, RecursionError):
        return ProtocolError("undecodable payload: nested too deeply")
    if isinstance(e, UnicodeDecodeError):
        return ProtocolError("undecodable payload: a string is not UTF-8")
    if not isinstance(e, msgspec.ValidationError):
        return ProtocolError(f"undecodable payload: {e}")
    what, _, path = str(e).partition(" - at `")
    label, info = _locate(root, path.rstrip("`") or "$")
    if m := _MISSING.match(what):
        return ProtocolError(f"undecodable payload: {label}.{m.group(1)}: missing")
    return ProtocolError(f"undecodable payload: {label}: {_problem(what, info)}")


# --------------------------------------------------------------------------------------------- framing
def encode(msg: Message, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """One message as one frame. LocalProtocolError (a ValueError) past max_frame: split the batch instead."""
    buf = bytearray(HEADER_SIZE)
    if type(msg) is Refused and not msg.code:
        _ENCODER.encode_into((Refused.TYPE, msg.reason), buf, HEADER_SIZE)     # the version-2 shape
    else:
        _ENCODER.encode_into(msg, buf, HEADER_SIZE)
    n = len(buf) - HEADER_SIZE
    if n > max_frame:
        raise LocalProtocolError(f"{type(msg).__name__} frame of {n} bytes exceeds the limit of {max_frame}")
    _HEADER.pack_into(buf, 0, n)
    return bytes(buf)


def decode_payload(payload: bytes) -> Message:
    """One frame's payload as a checked message; ProtocolError naming the field if it is not one."""
    try:
        msg = _DECODER.decode(payload)
    except _DECODE_ERRORS as e:
        raise _refusal(e, _peek_type(payload)) from None
    msg._after_decode()
    return msg


class FrameDecoder:
    """Accumulates bytes and yields complete messages.

    A length above `max_frame` is refused as soon as the 4 header bytes are in, before any of the body is read
    or any buffer of that size exists. `max_frame` may be changed between frames (the master raises it once the
    peer has proved the secret). After `authenticate`, every frame must be followed by its tag, checked before
    the payload is decoded. After a ProtocolError the decoder is unusable: close the connection.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame in progress
        self._broken = False
        self._tags: _FrameTags | None = None
        self._tail = 0                 # bytes after each frame: its tag, once authenticated

    def authenticate(self, key: bytes, direction: bytes) -> None:
        """From the next frame on, each must carry the tag of the peer's direction (see SessionKeys). Frames
        already buffered and not yet returned are checked too: the switch happens between two messages."""
        if self._tags is not None:
            raise LocalProtocolError("the decoder already checks tags")
        self._tags = _FrameTags(key, direction)
        self._tail = TAG_SIZE

    def feed(self, data: bytes) -> None:
        if self._broken:
            raise ProtocolError("decoder already failed")
        self._buf += data
        if self._need is None and len(self._buf) >= HEADER_SIZE:
            self._check_header()

    def _check_header(self) -> None:
        (n,) = _HEADER.unpack_from(self._buf)
        if n > self.max_frame:
            self._broken = True
            self._buf = bytearray()
            raise FrameTooLarge(f"frame of {n} bytes exceeds the limit of {self.max_frame}")
        self._need = n

    def next_message(self) -> Message | None:
        """The next complete message, or None until more bytes are fed."""
        if self._broken:
            raise ProtocolError("decoder already failed")
        if self._need is None:
            if len(self._buf) < HEADER_SIZE:
                return None
            self._check_header()
        n = self._need
        assert n is not None
        end = HEADER_SIZE + n
        if len(self._buf) < end + self._tail:
            return None
        if self._tags is not None:
            with memoryview(self._buf) as view:
                ok = hmac.compare_digest(self._tags.next(view[:end]), view[end:end + TAG_SIZE])
            if not ok:
                self._broken = True
                self._buf = bytearray()
                raise ProtocolError(f"frame {self._tags.seq - 1} of the session: wrong tag (altered, injected, "
                                    "replayed or out of order)")
        payload = bytes(self._buf[HEADER_SIZE:end])
        del self._buf[:end + self._tail]
        self._need = None
        try:
            return decode_payload(payload)
        except ProtocolError:
            self._broken = True
            raise

    def messages(self) -> list[Message]:
        out = []
        while (m := self.next_message()) is not None:
            out.append(m)
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


# --------------------------------------------------------------------------------------------- authentication
def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def _transcript(hello: Hello, master_nonce: bytes, rules: tuple[str, ...]) -> bytes:
    # Each variable-length part with its length first, so no two transcripts read alike.
    parts = [hello.worker_id.encode(), *(r.encode() for r in rules)]
    return (struct.pack(">QQQ", hello.version, hello.capacity, len(rules)) + hello.nonce + master_nonce
            + b"".join(struct.pack(">I", len(b)) + b for b in parts))


def worker_proof(secret: bytes, hello: Hello, master_nonce: bytes, rules: tuple[str, ...] = ()) -> bytes:
    return hmac.new(secret, b"crawler-worker\0" + _transcript(hello, master_nonce, rules), hashlib.sha256).digest()


def master_proof(secret: bytes, hello: Hello, master_nonce: bytes, rules: tuple[str, ...] = (),
                 settings: bytes = b"") -> bytes:
    """settings: the Welcome's own (Welcome.settings()): a Welcome altered on the way fails the proof."""
    return hmac.new(secret, b"crawler-master\0" + _transcript(hello, master_nonce, rules)
                    + struct.pack(">Q", len(settings)) + settings, hashlib.sha256).digest()


def check_proof(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


# --------------------------------------------------------------------------------------------- session frames
TO_WORKER = b"master->worker"
TO_MASTER = b"worker->master"


class SessionKeys:
    """One connection's frame keys, one per direction, from the secret and the handshake's transcript (both
    fresh nonces): a frame tagged on one connection, or in the other direction, fails on any other."""

    def __init__(self, secret: bytes, hello: Hello, master_nonce: bytes, rules: tuple[str, ...],
                 sending: bytes) -> None:
        t = _transcript(hello, master_nonce, rules)
        self.send_direction = sending
        self.recv_direction = TO_MASTER if sending == TO_WORKER else TO_WORKER
        self.send_key = self._key(secret, self.send_direction, t)
        self.recv_key = self._key(secret, self.recv_direction, t)

    @staticmethod
    def _key(secret: bytes, direction: bytes, transcript: bytes) -> bytes:
        return hmac.new(secret, b"crawler-frames\0" + direction + b"\0" + transcript, hashlib.sha256).digest()

    def sealer(self) -> FrameSealer:
        return FrameSealer(self.send_key, self.send_direction)

    def authenticate(self, decoder: FrameDecoder) -> None:
        decoder.authenticate(self.recv_key, self.recv_direction)


class _FrameTags:
    """The tags of one direction's frames, in order: keyed BLAKE2b over direction | sequence | frame. The
    sequence is each side's own count, never sent, so nothing a peer says can move it."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        self._base = hashlib.blake2b(direction + b"\0", key=key, digest_size=TAG_SIZE)
        self.seq = 0

    def next(self, frame: bytes | memoryview) -> bytes:
        h = self._base.copy()
        h.update(self.seq.to_bytes(8, "big"))
        h.update(frame)
        self.seq += 1
        return h.digest()


class FrameSealer:
    """Tags what one side sends in the session: each frame followed by its tag, one tag per frame however many
    messages a caller batches."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        self._tags = _FrameTags(key, direction)

    def seal(self, frames: bytes) -> bytes:
        """Whole frames (encode's output, one or several joined), each followed by its tag. LocalProtocolError
        if `frames` does not end on a frame boundary (our bug: nothing was tagged)."""
        view = memoryview(frames)
        size = len(view)
        if size >= HEADER_SIZE and _HEADER.unpack_from(view)[0] + HEADER_SIZE == size:
            return frames + self._tags.next(frames)          # the usual case: one frame
        bounds, i = [], 0
        while i < size:   # every bound first: a refused call tags nothing
            end = i + HEADER_SIZE + (_HEADER.unpack_from(view, i)[0] if size - i >= HEADER_SIZE else size)
            if end > size:
                raise LocalProtocolError("seal: bytes that are not whole frames")
            bounds.append((i, end))
            i = end
        out: list[bytes | memoryview] = []
        for start, end in bounds:
            out += (view[start:end], self._tags.next(view[start:end]))
        return b"".join(out)


# --------------------------------------------------------------------------------------------- connection state
class State(enum.Enum):
    SEND_HELLO = "send hello"              # worker: nothing sent yet
    AWAIT_HELLO = "await hello"            # master: connection accepted
    AWAIT_CHALLENGE = "await challenge"    # worker: Hello sent
    AWAIT_AUTH = "await auth"              # master: Challenge sent
    AUTHENTICATED = "authenticated"        # master: the worker proved the secret; Welcome or Refused is next
    AWAIT_WELCOME = "await welcome"        # worker: Auth sent
    OPEN = "open"                          # both: the session
    CLOSED = "closed"                      # refused or failed: nothing more is legal


# What the peer may send in each state. Anything else is a ProtocolError and closes the connection.
MASTER_RECEIVES: Mapping[State, tuple[type[Message], ...]] = {
    State.AWAIT_HELLO: (Hello,),
    State.AWAIT_AUTH: (Auth,),
    State.AUTHENTICATED: (),               # the worker waits for the Welcome
    State.OPEN: (Report, Credit, Heartbeat, Fetched, Fault, DownloadAsk, DownloadDone, DownloadReport,
                 EvidenceRecords, SiteWait),
    State.CLOSED: (),
}
WORKER_RECEIVES: Mapping[State, tuple[type[Message], ...]] = {
    State.SEND_HELLO: (),
    State.AWAIT_CHALLENGE: (Challenge, Refused),
    State.AWAIT_WELCOME: (Welcome, Refused),
    State.OPEN: (Assign, Heartbeat, Shutdown, DownloadGrant, DownloadWork, FragmentRules, EvidenceAsk),
    State.CLOSED: (),
}


class _Handshake:
    RECEIVES: ClassVar[Mapping[State, tuple[type[Message], ...]]]
    state: State

    def receive(self, msg: Message) -> Message:
        """A message from the peer, checked against the current state. ProtocolError if it is not legal now."""
        if not isinstance(msg, self.RECEIVES[self.state]):
            state, self.state = self.state, State.CLOSED
            raise ProtocolError(f"unexpected {type(msg).__name__} in state {state.value}")
        return msg

    def _step(self, expected: State, what: str) -> None:
        if self.state is not expected:
            raise LocalProtocolError(f"{what} in state {self.state.value}")


class MasterHandshake(_Handshake):
    """The master's side of one connection.

        hs = MasterHandshake(secret)
        send(hs.receive_hello(msg))          # the Challenge; HandshakeFailed(reply=Refused) on a bad version
        hs.receive_auth(msg)                 # HandshakeFailed(reply=Refused) on a wrong MAC
        send(hs.welcome(...)) or send(hs.refuse(reason))     # the master's policy (unknown id ...)
        msg = hs.receive(msg)                # each session message, checked against MASTER_RECEIVES
    """

    RECEIVES = MASTER_RECEIVES

    def __init__(self, secret: bytes, *, nonce: bytes | None = None) -> None:
        self.secret = secret
        self.nonce = nonce or new_nonce()
        self.state = State.AWAIT_HELLO
        self.hello: Hello | None = None
        self.keep_fragment: tuple[str, ...] = ()    # the worker's fragment rules, once its Auth checked out

    @property
    def recv_limit(self) -> int | None:
        """The frame limit for what the peer sends now; None once open (the connection's own limit)."""
        if self.state is State.OPEN:
            return None
        return AUTH_MAX_FRAME if self.state is State.AWAIT_AUTH else PRE_AUTH_MAX_FRAME

    def receive_hello(self, msg: Message) -> Challenge:
        self._step(State.AWAIT_HELLO, "receive_hello")
        hello = self.receive(msg)
        assert isinstance(hello, Hello)
        if hello.version != PROTOCOL_VERSION:
            self.state = State.CLOSED
            reason = f"protocol version {hello.version} not supported (this master speaks {PROTOCOL_VERSION})"
            raise HandshakeFailed(f"worker {hello.worker_id!r} speaks protocol version {hello.version}",
                                  Refused(reason))
        self.hello = hello
        self.state = State.AWAIT_AUTH
        return Challenge(self.nonce)

    def receive_auth(self, msg: Message) -> Hello:
        """The worker's MAC checked: returns its Hello (the id and capacity are now authenticated)."""
        self._step(State.AWAIT_AUTH, "receive_auth")
        auth = self.receive(msg)
        assert isinstance(auth, Auth) and self.hello is not None
        if not check_proof(worker_proof(self.secret, self.hello, self.nonce, auth.keep_fragment), auth.mac):
            self.state = State.CLOSED
            raise HandshakeFailed(f"worker {self.hello.worker_id!r} failed authentication",
                                  Refused("authentication failed", AUTH_FAILED))
        self.keep_fragment = auth.keep_fragment
        self.state = State.AUTHENTICATED
        return self.hello

    def welcome(self, heartbeat_interval: float, keep_fragment: tuple[str, ...] = (),
                max_frame: int = DEFAULT_MAX_FRAME, max_depth: int | None = None,
                allowed_origins: tuple[str, ...] = (), allowed_networks: tuple[str, ...] = (),
                sort_query: bool = False, drop_params: tuple[str, ...] = (), proxies: tuple[str, ...] = (),
                sites: tuple[SiteWire, ...] = ()) -> Welcome:
        self._step(State.AUTHENTICATED, "welcome")
        assert self.hello is not None
        self.state = State.OPEN
        unsigned = Welcome(bytes(MAC_SIZE), heartbeat_interval, keep_fragment, max_frame, max_depth,
                           allowed_origins, allowed_networks, sort_query, drop_params, proxies, sites)
        proof = master_proof(self.secret, self.hello, self.nonce, self.keep_fragment, unsigned.settings())
        return msgspec.structs.replace(unsigned, proof=proof)

    def refuse(self, reason: str, code: str = "") -> Refused:
        """Refuse an authenticated worker (unknown id, duplicate ...). Unauthenticated peers learn nothing more
        than HandshakeFailed.reply tells them."""
        self._step(State.AUTHENTICATED, "refuse")
        self.state = State.CLOSED
        return Refused(reason, code)

    def session_keys(self) -> SessionKeys:
        """The frame keys of this connection, once the Welcome went out: every frame after it carries a tag."""
        self._step(State.OPEN, "session_keys")
        assert self.hello is not None
        return SessionKeys(self.secret, self.hello, self.nonce, self.keep_fragment, TO_WORKER)


class WorkerHandshake(_Handshake):
    """The worker's side of one connection.

        hs = WorkerHandshake(secret, worker_id, capacity)
        send(hs.hello())
        send(hs.receive_challenge(msg))      # the Auth; PeerRefused if the master refused
        welcome = hs.receive_welcome(msg)    # ProtocolError if the master's proof is wrong; PeerRefused
        msg = hs.receive(msg)                # each session message, checked against WORKER_RECEIVES
    """

    RECEIVES = WORKER_RECEIVES

    def __init__(self, secret: bytes, worker_id: str, capacity: int, *, keep_fragment: tuple[str, ...] = (),
                 nonce: bytes | None = None) -> None:
        self.secret = secret
        self._hello = Hello(worker_id, PROTOCOL_VERSION, capacity, nonce or new_nonce())
        self.keep_fragment = keep_fragment   # this worker's resolvers' fragment rules, told the master in Auth
        self.state = State.SEND_HELLO
        self._master_nonce = b""

    @property
    def recv_limit(self) -> int | None:
        return None if self.state is State.OPEN else HANDSHAKE_MAX_FRAME

    def hello(self) -> Hello:
        self._step(State.SEND_HELLO, "hello")
        self.state = State.AWAIT_CHALLENGE
        return self._hello

    def _refused(self, msg: Message) -> None:
        if isinstance(msg, Refused):
            self.state = State.CLOSED
            raise PeerRefused(msg.reason, msg.code)

    def receive_challenge(self, msg: Message) -> Auth:
        self._step(State.AWAIT_CHALLENGE, "receive_challenge")
        self._refused(self.receive(msg))
        assert isinstance(msg, Challenge)
        self._master_nonce = msg.nonce
        self.state = State.AWAIT_WELCOME
        return Auth(worker_proof(self.secret, self._hello, msg.nonce, self.keep_fragment), self.keep_fragment)

    def receive_welcome(self, msg: Message) -> Welcome:
        self._step(State.AWAIT_WELCOME, "receive_welcome")
        self._refused(self.receive(msg))
        assert isinstance(msg, Welcome)
        if not check_proof(master_proof(self.secret, self._hello, self._master_nonce, self.keep_fragment,
                                        msg.settings()), msg.proof):
            self.state = State.CLOSED
            raise HandshakeFailed("the master could not prove it knows the shared secret")
        self.state = State.OPEN
        return msg

    def session_keys(self) -> SessionKeys:
        """The frame keys of this connection, once the Welcome checked out: every frame after it carries a tag."""
        self._step(State.OPEN, "session_keys")
        return SessionKeys(self.secret, self._hello, self._master_nonce, self.keep_fragment, TO_MASTER)
