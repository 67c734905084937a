"""The master/worker wire protocol, sans-IO: bytes in, messages out; messages in, bytes out.

A frame is a 4-byte unsigned big-endian length followed by that many bytes of msgpack: an array whose first
element is the message type code and the rest the message's fields in order. No sockets, no asyncio here: the
daemons own a thin stream shell (crawler/connection.py) around `FrameDecoder`, `encode` and a handshake object.

Errors, split as h11 splits them: anything the peer sends that breaks the protocol raises `ProtocolError` (the
connection shell closes that one connection). Misusing this module from our own code (encoding a message past
the frame limit, a handshake step out of order) raises `LocalProtocolError`, never a ProtocolError, so a bug of
ours is never blamed on the peer.

Every peer is hostile until it has proved the secret. The master's decoder takes frames of at most
PRE_AUTH_MAX_FRAME bytes until then (refused from the 4-byte header alone), and msgpack decoding is bounded in
string, byte string, array and map lengths (DECODE_LIMITS); ext types are refused. Every field is then checked
for its type and range: integers within signed 64 bits and their field's range, floats finite, strings capped
(MAX_URL, MAX_TEXT, MAX_NAME), so no value reaches the store or the catalogue that SQLite or strict JSON refuse.

Handshake (version 4: the worker proves the secret first; the secret never crosses the wire):
    worker -> Hello(worker_id, version, capacity, nonce_w)
    master -> Challenge(nonce_m)                              (or Refused: protocol version not supported)
    worker -> Auth(mac = HMAC(secret, "crawler-worker" | T))
    master -> Welcome(proof = HMAC(secret, "crawler-master" | T), settings...)   or Refused(reason, code)
where T = version | capacity | nonce_w | nonce_m | worker_id binds the whole Hello and both fresh nonces. The
master computes no HMAC over anything before the worker's MAC checks out, so an unauthenticated peer gets no
oracle to test guesses of the secret offline; a replayed Hello/Auth fails against a fresh nonce_m, and a replayed
Welcome against a fresh nonce_w. `MasterHandshake` and `WorkerHandshake` hold one connection's state and the
table of messages legal in each state (MASTER_RECEIVES, WORKER_RECEIVES), for the handshake and the session.

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
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import msgpack

from crawler.items import AUDIO_FIELD_KINDS, FAILED, OK, AudioItem

# 2: Welcome carries max_depth; 3: Result carries the links cut at the depth limit, Welcome the private
# addresses the crawl may reach; Fetched, Task.after; 4: the worker proves the secret first, the master in its
# Welcome, and every value is range-checked; 5: Result may end with sitemap dates of its links; 6: Fault (a
# worker's local fault), Refused carries a code; 7: Result may end with the page's validators, a worker's
# Heartbeat names the leases it still works on (they are renewed), Result may end with the page's audio
# references (followed past the depth limit); DownloadAsk, DownloadGrant, DownloadDone: audio downloads under
# the master's politeness, one per address in the cluster; 8: a page reports before its downloads end (its items
# "pending"), each download's outcome comes in a DownloadReport, and the master hands the pending downloads of a
# node that died to another in a DownloadWork
PROTOCOL_VERSION = 8
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
# The largest frame the master reads before the peer proved the secret: a Hello with a 128-character id fits.
PRE_AUTH_MAX_FRAME = 640
# The largest frame the worker reads before the master proved the secret (a Welcome carries URL patterns).
HANDSHAKE_MAX_FRAME = 64 * 1024
NONCE_SIZE = 32
MAC_SIZE = 32
_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size

# Range checks for values on the wire.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_WORKER_ID = 128            # characters
MAX_URL = 16 * 1024            # characters in any URL field (task, result, link, audio address)
MAX_TEXT = 64 * 1024           # characters in free text (titles, descriptions, error messages)
MAX_NAME = 1024                # characters in short names (status, content type, resolver, header names)
MAX_CAPACITY = 1_000_000       # tasks a worker may hold, and credit it may grant at once
MAX_DEPTH = (1 << 31) - 1
MAX_COUNT = (1 << 31) - 1      # counts the worker reports (links cut at the depth limit)
MAX_EXTRA_DEPTH = 16           # nesting inside an audio item's free-form `extra` map
# msgpack decoding limits: no single container or string may be larger, whatever the frame size.
DECODE_LIMITS: Mapping[str, int] = {
    "max_str_len": MAX_TEXT,
    "max_bin_len": 1024,        # only nonces and MACs are bytes
    "max_array_len": 1_000_000,
    "max_map_len": 1024,
    "max_ext_len": 0,           # no ext types at all (msgpack's timestamps included)
}


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


# --------------------------------------------------------------------------------------------- field checks
def _str(v: Any, name: str, cap: int = MAX_TEXT) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{name}: expected a string, got {type(v).__name__}")
    if len(v) > cap:
        raise ProtocolError(f"{name}: {len(v)} characters, more than {cap}")
    return v


def _opt_str(v: Any, name: str, cap: int = MAX_TEXT) -> str | None:
    return None if v is None else _str(v, name, cap)


def _int(v: Any, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"{name}: expected an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ProtocolError(f"{name}: {v} is outside {lo}..{hi}")
    return v


def _opt_int(v: Any, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    return None if v is None else _int(v, name, lo, hi)


def _nonneg(v: Any, name: str, hi: int = INT64_MAX) -> int:
    return _int(v, name, 0, hi)


def _float(v: Any, name: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError(f"{name}: expected a number, got {type(v).__name__}")
    if isinstance(v, int):
        _int(v, name)
    f = float(v)
    # NaN fails every comparison, so it is caught here with the infinities: none may reach strict JSON.
    if not (math.isfinite(f) and lo <= f <= hi):
        raise ProtocolError(f"{name}: {f!r} is not a finite number in {lo}..{hi}")
    return f


def _opt_seconds(v: Any, name: str) -> float | None:
    return None if v is None else _float(v, name, 0.0, 1e12)


def _bytes(v: Any, name: str, size: int) -> bytes:
    if not isinstance(v, bytes):
        raise ProtocolError(f"{name}: expected bytes, got {type(v).__name__}")
    if len(v) != size:
        raise ProtocolError(f"{name}: expected {size} bytes, got {len(v)}")
    return v


def _list(v: Any, name: str) -> list[Any]:
    if not isinstance(v, list):
        raise ProtocolError(f"{name}: expected a list, got {type(v).__name__}")
    return v


def _str_tuple(v: Any, name: str, cap: int) -> tuple[str, ...]:
    items = _list(v, name)
    for s in items:
        if not isinstance(s, str):
            raise ProtocolError(f"{name}: expected a list of strings")
        if len(s) > cap:
            raise ProtocolError(f"{name}: an entry of {len(s)} characters, more than {cap}")
    return tuple(items)


def _json_value(v: Any, name: str, depth: int = 0) -> None:
    """Free-form data (an audio item's `extra`) must be what strict JSON and SQLite can hold."""
    if v is None or isinstance(v, (bool, str)):
        return
    if isinstance(v, int):
        _int(v, name)
    elif isinstance(v, float):
        _float(v, name)
    elif depth >= MAX_EXTRA_DEPTH:
        raise ProtocolError(f"{name}: nested deeper than {MAX_EXTRA_DEPTH}")
    elif isinstance(v, list):
        for x in v:
            _json_value(x, name, depth + 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise ProtocolError(f"{name}: map keys must be strings")
            _json_value(x, name, depth + 1)
    else:
        raise ProtocolError(f"{name}: {type(v).__name__} is not allowed here")


# --------------------------------------------------------------------------------------------- messages
class Message:
    TYPE: ClassVar[int]

    def fields(self) -> list[Any]:  # pragma: no cover - every message overrides
        raise NotImplementedError

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:  # pragma: no cover
        raise NotImplementedError


def _arity(f: list[Any], n: int, cls: type) -> None:
    if len(f) != n:
        raise ProtocolError(f"{cls.__name__}: expected {n} fields, got {len(f)}")


@dataclass(frozen=True, slots=True)
class Hello(Message):
    TYPE: ClassVar[int] = 1
    worker_id: str
    version: int
    capacity: int
    nonce: bytes

    def fields(self) -> list[Any]:
        return [self.worker_id, self.version, self.capacity, self.nonce]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 4, cls)
        wid = _str(f[0], "worker_id", MAX_WORKER_ID)
        if not wid:
            raise ProtocolError(f"worker_id: must be 1 to {MAX_WORKER_ID} characters")
        return cls(wid, _nonneg(f[1], "version", 1 << 31), _nonneg(f[2], "capacity", MAX_CAPACITY),
                   _bytes(f[3], "nonce", NONCE_SIZE))


@dataclass(frozen=True, slots=True)
class Challenge(Message):
    """The master's fresh nonce. It carries no proof: the master proves the secret only in its Welcome."""

    TYPE: ClassVar[int] = 2
    nonce: bytes

    def fields(self) -> list[Any]:
        return [self.nonce]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        return cls(_bytes(f[0], "nonce", NONCE_SIZE))


@dataclass(frozen=True, slots=True)
class Auth(Message):
    TYPE: ClassVar[int] = 3
    mac: bytes

    def fields(self) -> list[Any]:
        return [self.mac]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        return cls(_bytes(f[0], "mac", MAC_SIZE))


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """The master accepts the worker, proves it knows the secret, and tells it the settings the crawl shares."""

    TYPE: ClassVar[int] = 4
    proof: bytes                          # HMAC(secret, "crawler-master" | transcript): see master_proof()
    heartbeat_interval: float
    keep_fragment: tuple[str, ...] = ()   # URL patterns whose fragment is meaningful (normalise alike)
    max_frame: int = DEFAULT_MAX_FRAME    # the master refuses larger frames: the worker splits its reports
    # Links of a page at this depth would be too deep: the worker neither extracts nor reports them. (Reported
    # anyway, the master would drop them, and the worker's link cache would then hold back the same links found
    # later on a shallower page.) None: no limit.
    max_depth: int | None = None
    # Addresses outside the public internet the crawl may reach (crawler/targets.py): the seeds' "host:port"
    # and the configured networks ("10.0.0.0/8"). Everything else private is refused after DNS.
    allowed_origins: tuple[str, ...] = ()
    allowed_networks: tuple[str, ...] = ()

    def fields(self) -> list[Any]:
        return [self.proof, self.heartbeat_interval, list(self.keep_fragment), self.max_frame, self.max_depth,
                list(self.allowed_origins), list(self.allowed_networks)]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 7, cls)
        max_frame = _int(f[3], "max_frame", 0, 0xFFFFFFFF)
        if max_frame < 1024:
            raise ProtocolError("max_frame: too small to carry a report")
        max_depth = None if f[4] is None else _nonneg(f[4], "max_depth", MAX_DEPTH)
        return cls(_bytes(f[0], "proof", MAC_SIZE), _float(f[1], "heartbeat_interval", 0.001, 86400.0),
                   _str_tuple(f[2], "keep_fragment", MAX_URL), max_frame, max_depth,
                   _str_tuple(f[5], "allowed_origins", MAX_NAME), _str_tuple(f[6], "allowed_networks", MAX_NAME))


@dataclass(frozen=True, slots=True)
class _Reason(Message):
    """A message that only says why (Refused, Shutdown)."""

    reason: str

    def fields(self) -> list[Any]:
        return [self.reason]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        return cls(_str(f[0], "reason", MAX_NAME))


# Refused.code values: why, in a form the worker can act on (the reason is for people).
AUTH_FAILED = "auth"
UNKNOWN_ID = "unknown_id"
DUPLICATE_ID = "duplicate_id"


@dataclass(frozen=True, slots=True)
class Refused(Message):
    TYPE: ClassVar[int] = 5
    reason: str
    code: str = ""

    def fields(self) -> list[Any]:
        # Without a code the frame keeps its version-2 shape, so a worker of another protocol version can
        # still read why it was refused.
        return [self.reason, self.code] if self.code else [self.reason]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        if len(f) not in (1, 2):
            raise ProtocolError(f"Refused: expected 1 or 2 fields, got {len(f)}")
        return cls(_str(f[0], "reason", MAX_NAME), _str(f[1], "code", MAX_NAME) if len(f) == 2 else "")


@dataclass(frozen=True, slots=True)
class Task:
    lease: int
    url: str
    depth: int
    parent: str | None = None
    # Start only when the page request of this earlier lease (sent to the same worker) ends, and not at all if
    # it was answered 429/503: the master hands out a host's next request ahead of the slot freeing, so the
    # host's concurrency limit is used to the full without a round trip to the master between requests.
    after: int | None = None
    # The page's validators from its last full answer, (ETag, Last-Modified), for a conditional fetch: a 304
    # then costs no body and no parse.
    validators: tuple[str | None, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Assign(Message):
    TYPE: ClassVar[int] = 6
    tasks: tuple[Task, ...]

    def fields(self) -> list[Any]:
        # Validators are an optional trailing pair: a task without them encodes as before.
        return [[[t.lease, t.url, t.depth, t.parent, t.after] if t.validators is None else
                 [t.lease, t.url, t.depth, t.parent, t.after, t.validators[0], t.validators[1]]
                 for t in self.tasks]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        tasks = []
        for raw in _list(f[0], "tasks"):
            t = _list(raw, "task")
            if len(t) not in (5, 7):
                raise ProtocolError("task: expected 5 or 7 fields")
            after = None if t[4] is None else _nonneg(t[4], "after")
            validators = None
            if len(t) == 7:
                validators = (_opt_str(t[5], "etag", MAX_NAME), _opt_str(t[6], "last_modified", MAX_NAME))
            tasks.append(Task(_nonneg(t[0], "lease"), _str(t[1], "url", MAX_URL), _nonneg(t[2], "depth", MAX_DEPTH),
                              _opt_str(t[3], "parent", MAX_URL), after, validators))
        return cls(tuple(tasks))


# Result.status values
DONE = "done"          # fetched (any HTTP status the crawl treats as final, 404 included)
ERROR = "error"        # permanent failure (bad URL, refused by robots, too large ...)
RETRY = "retry"        # transient failure (timeout, connection reset, 5xx): the master may try again
# A page answered with one of these reports its Location as its one link: the same resource under another
# address, which the master queues at the redirecting URL's own depth.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class Result:
    lease: int
    url: str
    status: str
    http_status: int | None = None
    final_url: str | None = None
    content_type: str | None = None
    size: int | None = None
    error: str | None = None
    links: tuple[str, ...] = ()
    audio: tuple[AudioItem, ...] = ()
    # Links the page has but the worker did not follow because the page is at the crawl's depth limit: the
    # master counts them as discarded for depth without receiving them.
    cut: int = 0
    # When some of the links' pages last changed, as a sitemap says: (link, epoch seconds).
    lastmod: tuple[tuple[str, float], ...] = ()
    # What the page's answer says for its next visit: (ETag, Last-Modified, 64-bit digest of a 2xx body).
    validators: tuple[str | None, str | None, int | None] | None = None
    # Addresses that resolve this page's audio (a playlist, a stream, an API answer): part of the page, so the
    # master queues them even past the depth limit (see crawler/urls.py AUDIO_REF_HOPS). Normalised, like links.
    refs: tuple[str, ...] = ()

    def to_wire(self) -> list[Any]:
        out = [self.lease, self.url, self.status, self.http_status, self.final_url, self.content_type,
               self.size, self.error, list(self.links), [a.to_wire() for a in self.audio], self.cut]
        # Optional trailing fields, each present when a later one is: without them, as before.
        if self.lastmod or self.validators is not None or self.refs:
            out.append([[u, t] for u, t in self.lastmod])
        if self.validators is not None or self.refs:
            out.append(list(self.validators) if self.validators is not None else None)
        if self.refs:
            out.append(list(self.refs))
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> Result:
        f = _check_result(raw)
        return cls(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8],
                   tuple(AudioItem.from_wire(a) for a in f[9]), f[10], f[11], f[12], f[13])


def check_result(r: Result) -> None:
    """The master's checks on one result, for the worker to run before sending it: a value the master would
    refuse (a hostile page's 100 KiB title, a NaN duration) must not cost the connection, and with it every
    result in flight, each time the page is crawled again."""
    _check_result(r.to_wire())


def _check_result(raw: Any) -> list[Any]:
    r = _list(raw, "result")
    if len(r) not in (11, 12, 13, 14):
        raise ProtocolError("result: expected 11 to 14 fields")
    validators = None
    if len(r) >= 13 and r[12] is not None:
        v = _list(r[12], "validators")
        if len(v) != 3:
            raise ProtocolError("validators: expected [etag, last_modified, digest]")
        validators = (_opt_str(v[0], "etag", MAX_NAME), _opt_str(v[1], "last_modified", MAX_NAME),
                      _opt_int(v[2], "digest", -(1 << 63), (1 << 63) - 1))
    lastmod = []
    for pair in _list(r[11], "lastmod") if len(r) >= 12 else ():
        if not isinstance(pair, list) or len(pair) != 2:
            raise ProtocolError("lastmod: expected [url, time] pairs")
        lastmod.append((_str(pair[0], "lastmod.url", MAX_URL), _float(pair[1], "lastmod.time")))
    status = _str(r[2], "status", MAX_NAME)
    if status not in (DONE, ERROR, RETRY):
        raise ProtocolError(f"status: unknown value {status!r}")
    return [_nonneg(r[0], "lease"), _str(r[1], "url", MAX_URL), status, _opt_int(r[3], "http_status", 0, 999),
            _opt_str(r[4], "final_url", MAX_URL), _opt_str(r[5], "content_type", MAX_NAME),
            _opt_int(r[6], "size", 0), _opt_str(r[7], "error"), _str_tuple(r[8], "links", MAX_URL),
            [_check_audio(a) for a in _list(r[9], "audio")], _nonneg(r[10], "cut", MAX_COUNT), tuple(lastmod),
            validators, _str_tuple(r[13], "refs", MAX_URL) if len(r) == 14 else ()]


# How each field of an audio map is checked. Numbers and maps follow the item's own field list; every text
# field must be in one of the three text classes below, which the assertion after them holds to, so a field
# added to AudioItem cannot reach the wire unchecked.
_AUDIO_URL = ("cover",)
_AUDIO_TEXT = ("title", "artist", "album", "description", "reason", "lyrics")
_AUDIO_NAME = ("source_id", "sha256", "content_type", "path", "codec", "published")
_AUDIO_NUM = tuple(k for k, kind in AUDIO_FIELD_KINDS.items() if kind == "number")
_AUDIO_MAP = tuple(k for k, kind in AUDIO_FIELD_KINDS.items() if kind == "map")
_AUDIO_OTHER = ("url", "page", "status", "resolver", "identity")
assert set(AUDIO_FIELD_KINDS) == {*_AUDIO_URL, *_AUDIO_TEXT, *_AUDIO_NAME, *_AUDIO_NUM, *_AUDIO_MAP,
                                   *_AUDIO_OTHER}, "an AudioItem field has no wire check"


# (key, label, cap) of every optional text field, labels built once: the checks run for every item reported.
_AUDIO_OPT_STR = tuple((k, f"audio.{k}", cap) for keys, cap in ((_AUDIO_URL, MAX_URL), (_AUDIO_TEXT, MAX_TEXT),
                                                                 (_AUDIO_NAME, MAX_NAME)) for k in keys)
_AUDIO_NUM_LABELS = tuple((k, f"audio.{k}") for k in _AUDIO_NUM)
_INT64_MAX_F = float(INT64_MAX)


def _check_audio(a: Any) -> dict[str, Any]:
    # Unknown keys are ignored (a newer worker may send more); known ones must have their type and range.
    if not isinstance(a, dict):
        raise ProtocolError("audio: expected a map")
    _str(a.get("url"), "audio.url", MAX_URL)
    _str(a.get("page"), "audio.page", MAX_URL)
    for k, label, cap in _AUDIO_OPT_STR:
        v = a.get(k)
        if v is not None and (type(v) is not str or len(v) > cap):
            _str(v, label, cap)     # raises, saying what is wrong
    for k, label in _AUDIO_NUM_LABELS:
        v = a.get(k)
        if v is not None and (type(v) is not float or not 0.0 <= v <= _INT64_MAX_F):
            _float(v, label, 0.0, _INT64_MAX_F)
    for k in ("status", "resolver"):
        if k in a:
            _str(a[k], f"audio.{k}", MAX_NAME)
    for k in _AUDIO_MAP:   # extra, meta_source, file_tags
        if a.get(k) is not None:
            if not isinstance(a[k], dict):
                raise ProtocolError(f"audio.{k}: expected a map")
            _json_value(a[k], f"audio.{k}")
    ident = a.get("identity")
    if ident is not None:
        if not isinstance(ident, dict):
            raise ProtocolError("audio.identity: expected a map")
        _opt_str(ident.get("user_agent"), "audio.identity.user_agent", MAX_NAME)
        for k in ("headers", "cookies"):
            for pair in _list(ident.get(k) or [], f"audio.identity.{k}"):
                if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                    raise ProtocolError(f"audio.identity.{k}: expected pairs of strings")
                _str(pair[0], f"audio.identity.{k}", MAX_NAME)
                _str(pair[1], f"audio.identity.{k}", MAX_TEXT)
    return a


@dataclass(frozen=True, slots=True)
class Report(Message):
    TYPE: ClassVar[int] = 7
    results: tuple[Result, ...]

    def fields(self) -> list[Any]:
        return [[r.to_wire() for r in self.results]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        return cls(tuple(Result.from_wire(r) for r in _list(f[0], "results")))


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """Both ways, every heartbeat interval. A worker's names the leases it still works on (a page being parsed,
    a long playlist resolved; never a download, which its page does not wait for): the master renews them, so
    only a dead or silent worker loses its leases."""

    TYPE: ClassVar[int] = 8
    sent_at: float
    leases: tuple[int, ...] = ()

    def fields(self) -> list[Any]:
        return [self.sent_at, list(self.leases)]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 2, cls)
        return cls(_float(f[0], "sent_at"), tuple(_nonneg(x, "lease") for x in _list(f[1], "leases")))


@dataclass(frozen=True, slots=True)
class Credit(Message):
    """The worker may take `n` more tasks (flow control: the master never exceeds the credit granted)."""

    TYPE: ClassVar[int] = 9
    n: int

    def fields(self) -> list[Any]:
        return [self.n]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        n = _int(f[0], "n")
        if not 0 <= n <= MAX_CAPACITY:
            raise ProtocolError("n: credit out of range")
        return cls(n)


@dataclass(frozen=True, slots=True)
class Shutdown(_Reason):
    TYPE: ClassVar[int] = 10


@dataclass(frozen=True, slots=True)
class PageFetch:
    """One page request ended (its answer read, or failed): what the host said and how fast."""

    lease: int
    http_status: int | None = None     # None: no answer (network error, timeout)
    retry_after: float | None = None   # seconds, from a Retry-After header (a date already turned into seconds)
    latency: float | None = None       # seconds from sending the request to having the page


@dataclass(frozen=True, slots=True)
class Fetched(Message):
    """Sent by a worker the moment page requests end, ahead of their results (which wait for parsing and
    resolving, and are batched): the master frees the host's politeness slot at once, and a
    429/503 slows the host for every worker before anyone else is sent there."""

    TYPE: ClassVar[int] = 20
    fetches: tuple[PageFetch, ...]

    def fields(self) -> list[Any]:
        return [[[f.lease, f.http_status, f.retry_after, f.latency] for f in self.fetches]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "fetches"):
            x = _list(raw, "fetch")
            if len(x) != 4:
                raise ProtocolError("fetch: expected 4 fields")
            status = _opt_int(x[1], "http_status", 100, 999)
            out.append(PageFetch(_nonneg(x[0], "lease"), status, _opt_seconds(x[2], "retry_after"),
                                 _opt_seconds(x[3], "latency")))
        return cls(tuple(out))


@dataclass(frozen=True, slots=True)
class Fault(Message):
    """The worker cannot store what it fetches (disk full, read-only, no permission): it hands back these
    leases, unfinished, and takes no work until its next Credit. Not the URLs' fault: no attempt is counted."""

    TYPE: ClassVar[int] = 11
    reason: str
    leases: tuple[int, ...] = ()

    def fields(self) -> list[Any]:
        return [self.reason, list(self.leases)]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 2, cls)
        return cls(_str(f[0], "reason", MAX_NAME), tuple(_nonneg(x, "lease") for x in _list(f[1], "leases")))


@dataclass(frozen=True, slots=True)
class DownloadAsk(Message):
    """The worker wants to download these audio addresses: (ticket, url), the ticket its own number for the
    download. The master answers each with a Grant, when the address's host may take one more download."""

    TYPE: ClassVar[int] = 21
    asks: tuple[tuple[int, str], ...]

    def fields(self) -> list[Any]:
        return [[[t, u] for t, u in self.asks]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "asks"):
            x = _list(raw, "ask")
            if len(x) != 2:
                raise ProtocolError("ask: expected 2 fields")
            out.append((_nonneg(x[0], "ticket"), _str(x[1], "ask.url", MAX_URL)))
        return cls(tuple(out))


GRANT_GO = "go"        # download it now (a slot of its host is the worker's until its DownloadDone)
GRANT_COPY = "copy"    # already downloaded by `node`: record that place, fetch nothing


@dataclass(frozen=True, slots=True)
class Grant:
    ticket: int
    verdict: str
    node: str | None = None       # copy: the node that holds the file
    sha256: str | None = None
    size: int | None = None
    path: str | None = None       # copy: where the file is in that node's data dir


@dataclass(frozen=True, slots=True)
class DownloadGrant(Message):
    TYPE: ClassVar[int] = 22
    grants: tuple[Grant, ...]

    def fields(self) -> list[Any]:
        return [[[g.ticket, g.verdict, g.node, g.sha256, g.size, g.path] for g in self.grants]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "grants"):
            x = _list(raw, "grant")
            if len(x) != 6:
                raise ProtocolError("grant: expected 6 fields")
            verdict = _str(x[1], "verdict", MAX_NAME)
            if verdict not in (GRANT_GO, GRANT_COPY):
                raise ProtocolError(f"verdict: unknown value {verdict!r}")
            out.append(Grant(_nonneg(x[0], "ticket"), verdict, _opt_str(x[2], "grant.node", MAX_WORKER_ID),
                             _opt_str(x[3], "grant.sha256", MAX_NAME), _opt_int(x[4], "grant.size", 0),
                             _opt_str(x[5], "grant.path", MAX_NAME)))
        return cls(tuple(out))


@dataclass(frozen=True, slots=True)
class DownloadEnd:
    ticket: int
    sha256: str | None = None     # set: the file is stored (then size and path too); None: it failed
    size: int | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class DownloadDone(Message):
    """Downloads the master granted ended: their hosts' slots are free, and the stored ones can be copied."""

    TYPE: ClassVar[int] = 23
    ends: tuple[DownloadEnd, ...]

    def fields(self) -> list[Any]:
        return [[[e.ticket, e.sha256, e.size, e.path] for e in self.ends]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "ends"):
            x = _list(raw, "end")
            if len(x) != 4:
                raise ProtocolError("end: expected 4 fields")
            out.append(DownloadEnd(_nonneg(x[0], "ticket"), _opt_str(x[1], "end.sha256", MAX_NAME),
                                   _opt_int(x[2], "end.size", 0), _opt_str(x[3], "end.path", MAX_NAME)))
        return cls(tuple(out))


def _audio_items(v: Any, name: str) -> tuple[AudioItem, ...]:
    return tuple(AudioItem.from_wire(_check_audio(a)) for a in _list(v, name))


@dataclass(frozen=True, slots=True)
class DownloadReport(Message):
    """Downloads a worker's pages reported as pending (or the master handed it in a DownloadWork) ended: each
    the item as reported (its page and the address it was reported under, `url`, which name the pending
    download) and the item as it ended (status ok or failed; sha256, size, path, the file's tags, the reason).
    Sent by the worker as its downloads end, apart from the page reports, which never wait for them."""

    TYPE: ClassVar[int] = 24
    outcomes: tuple[tuple[str, AudioItem], ...]    # (the address the item was pending under, the item as it ended)

    def fields(self) -> list[Any]:
        return [[[u, a.to_wire()] for u, a in self.outcomes]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "outcomes"):
            x = _list(raw, "outcome")
            if len(x) != 2:
                raise ProtocolError("outcome: expected [url, item]")
            url = _str(x[0], "outcome.url", MAX_URL)
            item = AudioItem.from_wire(_check_audio(x[1]))
            if item.status not in (OK, FAILED):
                raise ProtocolError(f"outcome.status: {item.status!r} is not an outcome")
            out.append((url, item))
        return cls(tuple(out))


@dataclass(frozen=True, slots=True)
class DownloadWork(Message):
    """The master hands a worker pending downloads as download-only work: those of a node that died (or did
    not come back after the master restarted), or the worker's own again after it rejoined (it ignores those it
    still runs). Each is the item as its page reported it (status pending); its outcome is a DownloadReport."""

    TYPE: ClassVar[int] = 25
    items: tuple[AudioItem, ...]

    def fields(self) -> list[Any]:
        return [[a.to_wire() for a in self.items]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Self:
        _arity(f, 1, cls)
        items = _audio_items(f[0], "items")
        for a in items:
            if not a.url:
                raise ProtocolError("items: a download without an address")
        return cls(items)


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Challenge, Auth, Welcome, Refused, Assign, Report, Heartbeat, Credit, Shutdown,
                               Fetched, Fault, DownloadAsk, DownloadGrant, DownloadDone, DownloadReport,
                               DownloadWork)
}


# --------------------------------------------------------------------------------------------- framing
def encode(msg: Message, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """One message as one frame. LocalProtocolError (a ValueError) past max_frame: split the batch instead."""
    payload: bytes = msgpack.packb([msg.TYPE, *msg.fields()], use_bin_type=True)
    if len(payload) > max_frame:
        raise LocalProtocolError(f"{type(msg).__name__} frame of {len(payload)} bytes exceeds the limit of {max_frame}")
    return _HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Message:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True, **DECODE_LIMITS)
    except Exception as e:  # msgpack raises several unrelated types for garbage and for limits
        raise ProtocolError(f"undecodable payload: {type(e).__name__}") from None
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], int) or isinstance(obj[0], bool):
        raise ProtocolError("payload is not a message array")
    cls = MESSAGE_TYPES.get(obj[0])
    if cls is None:
        raise ProtocolError(f"unknown message type {obj[0]}")
    return cls.from_fields(obj[1:])


class FrameDecoder:
    """Accumulates bytes and yields complete messages.

    A length above `max_frame` is refused as soon as the 4 header bytes are in, before any of the body is read
    or any buffer of that size exists. `max_frame` may be changed between frames (the master raises it once the
    peer has proved the secret). After a ProtocolError the decoder is unusable: close the connection.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame in progress
        self._broken = False

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
        if len(self._buf) < HEADER_SIZE + n:
            return None
        payload = bytes(self._buf[HEADER_SIZE:HEADER_SIZE + n])
        del self._buf[:HEADER_SIZE + n]
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


def _transcript(hello: Hello, master_nonce: bytes) -> bytes:
    return (struct.pack(">QQ", hello.version, hello.capacity) + hello.nonce + master_nonce
            + hello.worker_id.encode())


def worker_proof(secret: bytes, hello: Hello, master_nonce: bytes) -> bytes:
    return hmac.new(secret, b"crawler-worker\0" + _transcript(hello, master_nonce), hashlib.sha256).digest()


def master_proof(secret: bytes, hello: Hello, master_nonce: bytes) -> bytes:
    return hmac.new(secret, b"crawler-master\0" + _transcript(hello, master_nonce), hashlib.sha256).digest()


def check_proof(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


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
    State.OPEN: (Report, Credit, Heartbeat, Fetched, Fault, DownloadAsk, DownloadDone, DownloadReport),
    State.CLOSED: (),
}
WORKER_RECEIVES: Mapping[State, tuple[type[Message], ...]] = {
    State.SEND_HELLO: (),
    State.AWAIT_CHALLENGE: (Challenge, Refused),
    State.AWAIT_WELCOME: (Welcome, Refused),
    State.OPEN: (Assign, Heartbeat, Shutdown, DownloadGrant, DownloadWork),
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

    @property
    def recv_limit(self) -> int | None:
        """The frame limit for what the peer sends now; None once open (the connection's own limit)."""
        return None if self.state is State.OPEN else PRE_AUTH_MAX_FRAME

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
        if not check_proof(worker_proof(self.secret, self.hello, self.nonce), auth.mac):
            self.state = State.CLOSED
            raise HandshakeFailed(f"worker {self.hello.worker_id!r} failed authentication",
                                  Refused("authentication failed", AUTH_FAILED))
        self.state = State.AUTHENTICATED
        return self.hello

    def welcome(self, heartbeat_interval: float, keep_fragment: tuple[str, ...] = (),
                max_frame: int = DEFAULT_MAX_FRAME, max_depth: int | None = None,
                allowed_origins: tuple[str, ...] = (), allowed_networks: tuple[str, ...] = ()) -> Welcome:
        self._step(State.AUTHENTICATED, "welcome")
        assert self.hello is not None
        self.state = State.OPEN
        return Welcome(master_proof(self.secret, self.hello, self.nonce), heartbeat_interval, keep_fragment,
                       max_frame, max_depth, allowed_origins, allowed_networks)

    def refuse(self, reason: str, code: str = "") -> Refused:
        """Refuse an authenticated worker (unknown id, duplicate ...). Unauthenticated peers learn nothing more
        than HandshakeFailed.reply tells them."""
        self._step(State.AUTHENTICATED, "refuse")
        self.state = State.CLOSED
        return Refused(reason, code)


class WorkerHandshake(_Handshake):
    """The worker's side of one connection.

        hs = WorkerHandshake(secret, worker_id, capacity)
        send(hs.hello())
        send(hs.receive_challenge(msg))      # the Auth; PeerRefused if the master refused
        welcome = hs.receive_welcome(msg)    # ProtocolError if the master's proof is wrong; PeerRefused
        msg = hs.receive(msg)                # each session message, checked against WORKER_RECEIVES
    """

    RECEIVES = WORKER_RECEIVES

    def __init__(self, secret: bytes, worker_id: str, capacity: int, *, nonce: bytes | None = None) -> None:
        self.secret = secret
        self._hello = Hello(worker_id, PROTOCOL_VERSION, capacity, nonce or new_nonce())
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
        return Auth(worker_proof(self.secret, self._hello, msg.nonce))

    def receive_welcome(self, msg: Message) -> Welcome:
        self._step(State.AWAIT_WELCOME, "receive_welcome")
        self._refused(self.receive(msg))
        assert isinstance(msg, Welcome)
        if not check_proof(master_proof(self.secret, self._hello, self._master_nonce), msg.proof):
            self.state = State.CLOSED
            raise HandshakeFailed("the master could not prove it knows the shared secret")
        self.state = State.OPEN
        return msg
