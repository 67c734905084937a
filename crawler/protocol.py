"""The master/worker wire protocol, sans-IO: bytes in, messages out; messages in, bytes out.

A frame is a 4-byte unsigned big-endian length followed by that many bytes of msgpack: an array whose first
element is the message type code and the rest the message's fields in order. No sockets, no asyncio here: the
daemons own a thin stream shell around `FrameDecoder` and `encode`.

Errors: anything the peer sends that breaks the protocol raises `ProtocolError` (the connection shell closes that
one connection). Misusing this module (encoding a message that is too large, wrong field types from our own code)
raises `ValueError`/`TypeError` instead, so the two are never confused.

Handshake (mutual challenge-response, the secret never crosses the wire):
    worker -> Hello(worker_id, version, capacity, nonce_w)
    master -> Challenge(nonce_m, proof=HMAC(secret, "master" | nonce_w | nonce_m))
    worker -> Auth(mac=HMAC(secret, "worker" | nonce_m | nonce_w | worker_id))     (after checking the proof)
    master -> Welcome(...) or Refused(reason)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from crawler.items import AudioItem

PROTOCOL_VERSION = 3   # 2: Welcome carries max_depth; 3: Result carries the links cut at the depth limit,
                       # Welcome the private addresses the crawl may reach; Fetched, Task.after
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
NONCE_SIZE = 32
_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


class ProtocolError(Exception):
    """The peer broke the protocol: bad frame, bad message, failed authentication."""


class FrameTooLarge(ProtocolError):
    pass


# --------------------------------------------------------------------------------------------- field checks
def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{name}: expected a string, got {type(v).__name__}")
    return v


def _opt_str(v: Any, name: str) -> str | None:
    return None if v is None else _str(v, name)


def _int(v: Any, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"{name}: expected an integer, got {type(v).__name__}")
    return v


def _opt_int(v: Any, name: str) -> int | None:
    return None if v is None else _int(v, name)


def _nonneg(v: Any, name: str) -> int:
    v = _int(v, name)
    if v < 0:
        raise ProtocolError(f"{name}: must not be negative")
    return v


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)


def _opt_seconds(v: Any, name: str) -> float | None:
    if v is None:
        return None
    v = _float(v, name)
    if not 0 <= v < 1e12:   # also refuses NaN and infinities
        raise ProtocolError(f"{name}: expected a finite number of seconds >= 0")
    return v


def _bytes(v: Any, name: str, size: int | None = None) -> bytes:
    if not isinstance(v, bytes):
        raise ProtocolError(f"{name}: expected bytes, got {type(v).__name__}")
    if size is not None and len(v) != size:
        raise ProtocolError(f"{name}: expected {size} bytes, got {len(v)}")
    return v


def _list(v: Any, name: str) -> list:
    if not isinstance(v, list):
        raise ProtocolError(f"{name}: expected a list, got {type(v).__name__}")
    return v


def _str_tuple(v: Any, name: str) -> tuple[str, ...]:
    items = _list(v, name)
    for s in items:
        if not isinstance(s, str):
            raise ProtocolError(f"{name}: expected a list of strings")
    return tuple(items)


# --------------------------------------------------------------------------------------------- messages
class Message:
    TYPE: ClassVar[int]

    def fields(self) -> list[Any]:  # pragma: no cover - every message overrides
        raise NotImplementedError

    @classmethod
    def from_fields(cls, f: list[Any]) -> Message:  # pragma: no cover
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

    def fields(self):
        return [self.worker_id, self.version, self.capacity, self.nonce]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 4, cls)
        wid = _str(f[0], "worker_id")
        if not wid or len(wid) > 128:
            raise ProtocolError("worker_id: must be 1 to 128 characters")
        return cls(wid, _int(f[1], "version"), _nonneg(f[2], "capacity"), _bytes(f[3], "nonce", NONCE_SIZE))


@dataclass(frozen=True, slots=True)
class Challenge(Message):
    TYPE: ClassVar[int] = 2
    nonce: bytes
    proof: bytes

    def fields(self):
        return [self.nonce, self.proof]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 2, cls)
        return cls(_bytes(f[0], "nonce", NONCE_SIZE), _bytes(f[1], "proof", 32))


@dataclass(frozen=True, slots=True)
class Auth(Message):
    TYPE: ClassVar[int] = 3
    mac: bytes

    def fields(self):
        return [self.mac]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        return cls(_bytes(f[0], "mac", 32))


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """The master accepts the worker and tells it the settings the whole crawl shares."""

    TYPE: ClassVar[int] = 4
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

    def fields(self):
        return [self.heartbeat_interval, list(self.keep_fragment), self.max_frame, self.max_depth,
                list(self.allowed_origins), list(self.allowed_networks)]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 6, cls)
        max_frame = _int(f[2], "max_frame")
        if max_frame < 1024:
            raise ProtocolError("max_frame: too small to carry a report")
        max_depth = None if f[3] is None else _nonneg(f[3], "max_depth")
        return cls(_float(f[0], "heartbeat_interval"), _str_tuple(f[1], "keep_fragment"), max_frame, max_depth,
                   _str_tuple(f[4], "allowed_origins"), _str_tuple(f[5], "allowed_networks"))


@dataclass(frozen=True, slots=True)
class _Reason(Message):
    """A message that only says why (Refused, Shutdown)."""

    reason: str

    def fields(self):
        return [self.reason]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        return cls(_str(f[0], "reason"))


@dataclass(frozen=True, slots=True)
class Refused(_Reason):
    TYPE: ClassVar[int] = 5


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


@dataclass(frozen=True, slots=True)
class Assign(Message):
    TYPE: ClassVar[int] = 6
    tasks: tuple[Task, ...]

    def fields(self):
        return [[[t.lease, t.url, t.depth, t.parent, t.after] for t in self.tasks]]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        tasks = []
        for raw in _list(f[0], "tasks"):
            t = _list(raw, "task")
            if len(t) != 5:
                raise ProtocolError("task: expected 5 fields")
            after = None if t[4] is None else _nonneg(t[4], "after")
            tasks.append(Task(_nonneg(t[0], "lease"), _str(t[1], "url"), _nonneg(t[2], "depth"),
                              _opt_str(t[3], "parent"), after))
        return cls(tuple(tasks))


# Result.status values
DONE = "done"          # fetched (any HTTP status the crawl treats as final, 404 included)
ERROR = "error"        # permanent failure (bad URL, refused by robots, too large ...)
RETRY = "retry"        # transient failure (timeout, connection reset, 5xx): the master may try again


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

    def to_wire(self) -> list[Any]:
        return [self.lease, self.url, self.status, self.http_status, self.final_url, self.content_type,
                self.size, self.error, list(self.links), [a.to_wire() for a in self.audio], self.cut]

    @classmethod
    def from_wire(cls, raw: Any) -> Result:
        r = _list(raw, "result")
        if len(r) != 11:
            raise ProtocolError("result: expected 11 fields")
        status = _str(r[2], "status")
        if status not in (DONE, ERROR, RETRY):
            raise ProtocolError(f"status: unknown value {status!r}")
        audio = [_audio_item(a) for a in _list(r[9], "audio")]
        return cls(_nonneg(r[0], "lease"), _str(r[1], "url"), status, _opt_int(r[3], "http_status"),
                   _opt_str(r[4], "final_url"), _opt_str(r[5], "content_type"), _opt_int(r[6], "size"),
                   _opt_str(r[7], "error"), _str_tuple(r[8], "links"), tuple(audio), _nonneg(r[10], "cut"))


_AUDIO_STR = ("title", "artist", "album", "description", "cover", "reason", "source_id", "sha256",
              "content_type", "path")
_AUDIO_NUM = ("duration", "bitrate", "size")


def _audio_item(a: Any) -> AudioItem:
    # Unknown keys are ignored (a newer worker may send more); known ones must have their type.
    if not isinstance(a, dict):
        raise ProtocolError("audio: expected a map")
    _str(a.get("url"), "audio.url")
    _str(a.get("page"), "audio.page")
    for k in _AUDIO_STR:
        _opt_str(a.get(k), f"audio.{k}")
    for k in _AUDIO_NUM:
        if a.get(k) is not None:
            _float(a[k], f"audio.{k}")
    for k in ("status", "resolver"):
        if k in a:
            _str(a[k], f"audio.{k}")
    if a.get("extra") is not None and not isinstance(a["extra"], dict):
        raise ProtocolError("audio.extra: expected a map")
    ident = a.get("identity")
    if ident is not None:
        if not isinstance(ident, dict):
            raise ProtocolError("audio.identity: expected a map")
        _opt_str(ident.get("user_agent"), "audio.identity.user_agent")
        for k in ("headers", "cookies"):
            for pair in _list(ident.get(k) or [], f"audio.identity.{k}"):
                if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                    raise ProtocolError(f"audio.identity.{k}: expected pairs of strings")
    return AudioItem.from_wire(a)


@dataclass(frozen=True, slots=True)
class Report(Message):
    TYPE: ClassVar[int] = 7
    results: tuple[Result, ...]

    def fields(self):
        return [[r.to_wire() for r in self.results]]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        return cls(tuple(Result.from_wire(r) for r in _list(f[0], "results")))


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    TYPE: ClassVar[int] = 8
    sent_at: float

    def fields(self):
        return [self.sent_at]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        return cls(_float(f[0], "sent_at"))


@dataclass(frozen=True, slots=True)
class Credit(Message):
    """The worker may take `n` more tasks (flow control: the master never exceeds the credit granted)."""

    TYPE: ClassVar[int] = 9
    n: int

    def fields(self):
        return [self.n]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        n = _nonneg(f[0], "n")
        if n > 1_000_000:
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
    """Sent by a worker the moment page requests end, ahead of their results (which wait for parsing,
    resolving and downloads, and are batched): the master frees the host's politeness slot at once, and a
    429/503 slows the host for every worker before anyone else is sent there."""

    TYPE: ClassVar[int] = 20
    fetches: tuple[PageFetch, ...]

    def fields(self):
        return [[[f.lease, f.http_status, f.retry_after, f.latency] for f in self.fetches]]

    @classmethod
    def from_fields(cls, f):
        _arity(f, 1, cls)
        out = []
        for raw in _list(f[0], "fetches"):
            x = _list(raw, "fetch")
            if len(x) != 4:
                raise ProtocolError("fetch: expected 4 fields")
            status = _opt_int(x[1], "http_status")
            if status is not None and not 100 <= status <= 999:
                raise ProtocolError("http_status: out of range")
            out.append(PageFetch(_nonneg(x[0], "lease"), status, _opt_seconds(x[2], "retry_after"),
                                 _opt_seconds(x[3], "latency")))
        return cls(tuple(out))


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Challenge, Auth, Welcome, Refused, Assign, Report, Heartbeat, Credit, Shutdown,
                               Fetched)
}


# --------------------------------------------------------------------------------------------- framing
def encode(msg: Message, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """One message as one frame. Raises ValueError if it would exceed max_frame (split the batch instead)."""
    payload = msgpack.packb([msg.TYPE, *msg.fields()], use_bin_type=True)
    if len(payload) > max_frame:
        raise ValueError(f"{type(msg).__name__} frame of {len(payload)} bytes exceeds the limit of {max_frame}")
    return _HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Message:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for garbage
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
    or any buffer of that size exists. After a ProtocolError the decoder is unusable: close the connection.
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


def master_proof(secret: bytes, worker_nonce: bytes, master_nonce: bytes) -> bytes:
    return hmac.new(secret, b"crawler-master\0" + worker_nonce + master_nonce, hashlib.sha256).digest()


def worker_proof(secret: bytes, master_nonce: bytes, worker_nonce: bytes, worker_id: str) -> bytes:
    return hmac.new(secret, b"crawler-worker\0" + master_nonce + worker_nonce + worker_id.encode(),
                    hashlib.sha256).digest()


def check_proof(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)
