"""The records that cross module and process boundaries: audio items and client identities.

They are frozen records (msgspec Structs: an audio item, its client identity, a link's names)
whose field types carry the limits every copy of them must keep (string lengths, number ranges, map sizes, as
msgspec.Meta): this is their one definition. protocol.py decodes them from the wire with those limits checked by
msgspec, the master's store makes its columns from the same fields (AUDIO_FIELD_KINDS), and
``to_wire``/``from_wire`` turn them into plain dicts for the catalogue's JSON lines.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from crawler.identify import MAX_FINGERPRINT_BYTES

# Caps on what a record may carry, enforced when it is decoded from a peer (protocol.py): strict JSON and
# SQLite take every value that passes.
INT64_MAX = (1 << 63) - 1
MAX_URL = 16 * 1024            # characters in any URL field (task, result, link, audio address)
MAX_TEXT = 64 * 1024           # characters in free text (titles, descriptions, error messages)
MAX_NAME = 1024                # characters in short names (status, content type, resolver, header names)
MAX_MAP = 1024                 # entries in a map (an audio item's extra, file_tags, meta_source)
MAX_ITEMS = 1_000_000          # entries in a list (links, headers, leases ...); the frame size binds first

Url = Annotated[str, Meta(max_length=MAX_URL)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Name = Annotated[str, Meta(max_length=MAX_NAME)]
# An audio item's numbers: an integer or a float, finite and in 0..2**63-1 (a page may say "128.0" kbit/s).
Amount = Annotated[int, Meta(ge=0, le=INT64_MAX)] | Annotated[float, Meta(ge=0.0, le=float(INT64_MAX))]
Seconds = Annotated[float, Meta(ge=0.0, le=float(INT64_MAX))]
# Free-form maps: their nested values are checked after decoding (protocol.check_json_value).
JsonMap = Annotated[dict[Text, Any], Meta(max_length=MAX_MAP)]
Pairs = Annotated[tuple[tuple[Name, Text], ...], Meta(max_length=MAX_MAP)]
# An audio file's acoustic fingerprint (crawler.identify): opaque bytes, cut at MAX_FINGERPRINT_BYTES.
Fingerprint = Annotated[bytes, Meta(max_length=MAX_FINGERPRINT_BYTES)]

# Status of an audio item.
OK = "ok"                     # real address known (and, once downloaded, stored)
UNAVAILABLE = "unavailable"   # the site lists it but will not serve it (paid, region-blocked)
FAILED = "failed"             # resolving or downloading failed; `reason` says why
# Found, and its download is under way at a node: the page reported without waiting for it, and the download's
# own outcome (protocol.DownloadReport) turns the item into ok or failed.
PENDING = "pending"
# The extra keys of a live stream's recording (crawler/worker/recording.py makes them, the master keeps each
# window): whether the row is one, the wall-clock time of its first byte, a station's titles with their offsets.
LIVE = "live"
RECORDED_AT = "recorded_at"
PLAYED = "played"


def says_live(extra: object) -> bool:
    """Whether an item's extra (or a catalogue row's) says it is a recording of a live stream."""
    return isinstance(extra, Mapping) and extra.get(LIVE) is True


class RequestIdentity(msgspec.Struct, frozen=True):
    """The client identity a download must reuse: some sites bind a link to the User-Agent and cookies."""

    user_agent: Name | None = None
    headers: Pairs = ()
    cookies: Pairs = ()
    # The proxy (its label) the address was resolved through: the download goes out there too while that proxy
    # applies and is healthy, as a signed address may be bound to the address it was asked from.
    exit: Name | None = None

    def request_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.user_agent:
            out["User-Agent"] = self.user_agent
        if self.cookies:
            out["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies)
        return out

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"user_agent": self.user_agent, "headers": [list(h) for h in self.headers],
                               "cookies": [list(c) for c in self.cookies]}
        if self.exit is not None:
            out["exit"] = self.exit
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RequestIdentity:
        return cls(user_agent=d.get("user_agent"),
                   headers=tuple((str(k), str(v)) for k, v in d.get("headers") or ()),
                   cookies=tuple((str(k), str(v)) for k, v in d.get("cookies") or ()),
                   exit=None if d.get("exit") is None else str(d["exit"]))


class AudioItem(msgspec.Struct, frozen=True):
    """One piece of audio found on the web: where it really is, where it was seen, and what it is.

    A Struct, not a dataclass: a frozen dataclass sets each of its fields through object.__setattr__, about 5 us
    an item and 10 a replace() (0.3 and 0.4 as a Struct), a download replaces its item a few times, and msgspec
    decodes a Struct faster. It encodes the same, as a map of all its fields, compares alike, and is as
    unhashable (its dict fields). Its identity is a Struct for the same reasons."""

    url: Url                          # the real audio address ("" when unavailable)
    page: Url                         # the page it was found on
    title: Text | None = None
    artist: Text | None = None
    album: Text | None = None
    duration: Seconds | None = None   # seconds
    bitrate: Amount | None = None     # kbit/s
    description: Text | None = None
    cover: Url | None = None
    status: Name = OK
    reason: Text | None = None        # why unavailable / failed
    resolver: Name = "generic"
    source_id: Name | None = None     # the site's own id (Kugou hash, ...) for re-resolving
    identity: RequestIdentity | None = None
    # Filled in by the downloader once the bytes are on disk.
    sha256: Name | None = None
    size: Annotated[int, Meta(ge=0, le=INT64_MAX)] | None = None     # bytes
    content_type: Name | None = None
    path: Name | None = None          # relative to the worker's data dir
    codec: Name | None = None         # from the downloaded file (mp3, vorbis, opus, flac, aac ...)
    published: Name | None = None     # ISO 8601, when the source dates it (a feed's pubDate)
    lyrics: Text | None = None        # when the site publishes them (Kugou's play data)
    # Where each metadata field came from ({"title": "jsonld", "artist": "class", "album": "file"}).
    meta_source: Annotated[dict[Name, Name], Meta(max_length=MAX_MAP)] = msgspec.field(default_factory=dict)
    # What the downloaded file's own tags say where they disagree with the page (the page's value is kept).
    file_tags: JsonMap = msgspec.field(default_factory=dict)
    extra: JsonMap = msgspec.field(default_factory=dict)
    # The stored file's acoustic fingerprint, from the worker's fingerprint pool (crawler/worker/fingerprints.py);
    # None when not (yet) made: a frame of an older peer has none. Not a catalogue column: the master keeps it
    # apart, for matching.
    fingerprint: Fingerprint | None = None

    def replace(self, **changes: Any) -> AudioItem:
        """A copy with ``changes`` (field names; an unknown name is a TypeError)."""
        return msgspec.structs.replace(self, **changes)

    def to_wire(self) -> dict[str, Any]:
        # Every field in its order (AUDIO_FIELD_KINDS' order), by msgspec in C: 0.8 us against 2.1 for a dict
        # comprehension of getattr() over the names, once per item a report carries.
        d = msgspec.structs.asdict(self)
        d["identity"] = self.identity.to_wire() if self.identity else None
        if self.fingerprint is not None:   # JSON has no bytes: hex, as any peer's item must survive json.dumps
            d["fingerprint"] = self.fingerprint.hex()
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AudioItem:
        kw = {k: v for k, v in d.items() if k in AUDIO_FIELD_KINDS}
        if kw.get("identity") is not None:
            kw["identity"] = RequestIdentity.from_wire(kw["identity"])
        if isinstance(kw.get("fingerprint"), str):
            kw["fingerprint"] = bytes.fromhex(kw["fingerprint"])
        return cls(**kw)

    def with_meta(self, meta: dict[str, Any], sources: dict[str, str]) -> AudioItem:
        """Fill the fields this item lacks from ``meta``, recording where each came from."""
        changes = self._filled(meta, sources)
        return self.replace(**changes) if changes else self

    def with_file_tags(self, tags: dict[str, Any]) -> AudioItem:
        """Values read from the audio file itself: they fill what the page did not say, and where the page
        said something else, the file's value is kept beside it in ``file_tags``. One replace, once a stored
        file."""
        changes = self._filled(tags, dict.fromkeys(tags, "file"))
        disagree = {k: v for k, v in tags.items() if k in META_FIELDS and k not in changes
                    and (own := getattr(self, k)) is not None and not _same(own, v)}
        if disagree:
            changes["file_tags"] = {**self.file_tags, **disagree}
        return self.replace(**changes) if changes else self

    def _filled(self, meta: dict[str, Any], sources: dict[str, str]) -> dict[str, Any]:
        """The changes that fill the fields this item lacks from ``meta``, with their ``meta_source``; {} for
        none."""
        changes: dict[str, Any] = {k: v for k, v in meta.items() if k in META_FIELDS and getattr(self, k) is None}
        if changes:
            source = dict(self.meta_source)
            for k in changes:
                if k in sources:
                    source[k] = sources[k]
            changes["meta_source"] = source
        return changes

    def catalogue_row(self) -> dict[str, Any]:
        """What the catalogue records: everything but the client identity (cookies are secrets)."""
        d = self.to_wire()
        d.pop("identity", None)
        d.pop("fingerprint", None)
        return d


class LinkMeta(msgspec.Struct, frozen=True):
    """What a page says about one of its links that may lead to audio without saying so (a playlist, a stream
    named like a page): the song's names, and the page's layer each came from (meta_source, as an item's). It
    travels with the link to the link's own task (protocol.Result.link_meta, Task.link_meta), so the audio found
    there is named without fetching the page again. A Struct, as an item is (it was a frozen dataclass, which
    encodes the same): made for such links on every page, and decoded from every report and task that has one."""

    title: Name | None = None
    artist: Name | None = None
    album: Name | None = None
    meta_source: Annotated[dict[Name, Name], Meta(max_length=3)] = msgspec.field(default_factory=dict)


LINK_META_FIELDS = ("title", "artist", "album")


def _same(page_value: Any, file_value: Any) -> bool:
    if isinstance(page_value, (int, float)) and isinstance(file_value, (int, float)):
        # A page rounds durations to seconds and bitrates to the nominal rate.
        return abs(page_value - file_value) <= max(2.0, 0.05 * abs(page_value))
    return " ".join(str(page_value).split()).casefold() == " ".join(str(file_value).split()).casefold()


# What an audio item carries on the wire and in the catalogue, from its field types: protocol.py checks the
# free-form maps, and the master's store makes its columns, from these kinds. "text" and "number" are scalars or
# null, "map" a msgpack map (a JSON object in the store), "identity" the client identity (never stored), "bytes"
# opaque binary (the fingerprint: kept apart from the catalogue's columns).
def _kind(hint: Any) -> str:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    kinds = {a if isinstance(a, type) else typing.get_origin(a) for a in args} - {type(None)}
    if kinds == {RequestIdentity}:
        return "identity"
    if kinds == {dict}:
        return "map"
    if kinds == {bytes}:
        return "bytes"
    if kinds <= {int, float}:
        return "number"
    assert kinds == {str}, f"an AudioItem field of type {hint} has no kind"
    return "text"


_ITEM_FIELDS: tuple[str, ...] = AudioItem.__struct_fields__
_HINTS = typing.get_type_hints(AudioItem)
AUDIO_FIELD_KINDS: dict[str, str] = {name: _kind(_HINTS[name]) for name in _ITEM_FIELDS}
# The descriptive fields page, feed and file metadata fill, and meta_source speaks about.
META_FIELDS = frozenset({"title", "artist", "album", "duration", "bitrate", "description", "cover", "codec",
                         "published", "lyrics"})
