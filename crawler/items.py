"""The records that cross module and process boundaries: audio items and client identities.

They are plain frozen dataclasses with a ``to_wire``/``from_wire`` pair, so protocol.py can carry them
as msgpack maps without knowing their fields, and the catalogue can write them as JSON lines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Status of an audio item.
OK = "ok"                     # real address known (and, once downloaded, stored)
UNAVAILABLE = "unavailable"   # the site lists it but will not serve it (paid, region-blocked)
FAILED = "failed"             # resolving or downloading failed; `reason` says why
# Found, and its download is under way at a node: the page reported without waiting for it, and the download's
# own outcome (protocol.DownloadReport) turns the item into ok or failed.
PENDING = "pending"


@dataclass(frozen=True, slots=True)
class RequestIdentity:
    """The client identity a download must reuse: some sites bind a link to the User-Agent and cookies."""

    user_agent: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    cookies: tuple[tuple[str, str], ...] = ()

    def request_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.user_agent:
            out["User-Agent"] = self.user_agent
        if self.cookies:
            out["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies)
        return out

    def to_wire(self) -> dict[str, Any]:
        return {"user_agent": self.user_agent, "headers": [list(h) for h in self.headers],
                "cookies": [list(c) for c in self.cookies]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RequestIdentity:
        return cls(user_agent=d.get("user_agent"),
                   headers=tuple((str(k), str(v)) for k, v in d.get("headers") or ()),
                   cookies=tuple((str(k), str(v)) for k, v in d.get("cookies") or ()))


@dataclass(frozen=True, slots=True)
class AudioItem:
    """One piece of audio found on the web: where it really is, where it was seen, and what it is."""

    url: str                          # the real audio address ("" when unavailable)
    page: str                         # the page it was found on
    title: str | None = None
    artist: str | None = None
    album: str | None = None
    duration: float | None = None     # seconds
    bitrate: int | None = None        # kbit/s
    description: str | None = None
    cover: str | None = None
    status: str = OK
    reason: str | None = None         # why unavailable / failed
    resolver: str = "generic"
    source_id: str | None = None      # the site's own id (Kugou hash, ...) for re-resolving
    identity: RequestIdentity | None = None
    # Filled in by the downloader once the bytes are on disk.
    sha256: str | None = None
    size: int | None = None
    content_type: str | None = None
    path: str | None = None           # relative to the worker's data dir
    codec: str | None = None          # from the downloaded file (mp3, vorbis, opus, flac, aac ...)
    published: str | None = None      # ISO 8601, when the source dates it (a feed's pubDate)
    lyrics: str | None = None         # when the site publishes them (Kugou's play data)
    # Where each metadata field came from ({"title": "jsonld", "artist": "class", "album": "file"}).
    meta_source: dict[str, str] = field(default_factory=dict)
    # What the downloaded file's own tags say where they disagree with the page (the page's value is kept).
    file_tags: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> AudioItem:
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> dict[str, Any]:
        # The field names once, from AUDIO_FIELD_KINDS: dataclasses.fields() per item was a hot spot.
        d = {name: getattr(self, name) for name in AUDIO_FIELD_KINDS}
        d["identity"] = self.identity.to_wire() if self.identity else None
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AudioItem:
        kw = {k: v for k, v in d.items() if k in AUDIO_FIELD_KINDS}
        if kw.get("identity") is not None:
            kw["identity"] = RequestIdentity.from_wire(kw["identity"])
        return cls(**kw)

    def with_meta(self, meta: dict[str, Any], sources: dict[str, str]) -> AudioItem:
        """Fill the fields this item lacks from ``meta``, recording where each came from."""
        changes: dict[str, Any] = {k: v for k, v in meta.items() if k in META_FIELDS and getattr(self, k) is None}
        if not changes:
            return self
        source = dict(self.meta_source)
        for k in changes:
            if k in sources:
                source[k] = sources[k]
        return dataclasses.replace(self, meta_source=source, **changes)

    def with_file_tags(self, tags: dict[str, Any]) -> AudioItem:
        """Values read from the audio file itself: they fill what the page did not say, and where the page
        said something else, the file's value is kept beside it in ``file_tags``."""
        item = self.with_meta(tags, dict.fromkeys(tags, "file"))
        disagree = {k: v for k, v in tags.items()
                    if k in META_FIELDS and getattr(self, k) is not None and not _same(getattr(self, k), v)}
        if disagree:
            item = dataclasses.replace(item, file_tags={**item.file_tags, **disagree})
        return item

    def catalogue_row(self) -> dict[str, Any]:
        """What the catalogue records: everything but the client identity (cookies are secrets)."""
        d = self.to_wire()
        d.pop("identity", None)
        return d


def _same(page_value: Any, file_value: Any) -> bool:
    if isinstance(page_value, (int, float)) and isinstance(file_value, (int, float)):
        # A page rounds durations to seconds and bitrates to the nominal rate.
        return abs(page_value - file_value) <= max(2.0, 0.05 * abs(page_value))
    return " ".join(str(page_value).split()).casefold() == " ".join(str(file_value).split()).casefold()


# The one definition of what an audio item carries on the wire and in the catalogue: protocol.py validates,
# and the master's store makes its columns, from these kinds. "text" and "number" are scalars or null, "map"
# a msgpack map (a JSON object in the store), "identity" the client identity (never stored).
def _kind(hint: str) -> str:
    if hint.startswith("RequestIdentity"):
        return "identity"
    if hint.startswith("dict"):
        return "map"
    if hint.startswith(("float", "int")):
        return "number"
    return "text"


AUDIO_FIELD_KINDS: dict[str, str] = {f.name: _kind(str(f.type)) for f in dataclasses.fields(AudioItem)}
# The descriptive fields page, feed and file metadata fill, and meta_source speaks about.
META_FIELDS = frozenset({"title", "artist", "album", "duration", "bitrate", "description", "cover", "codec",
                         "published", "lyrics"})
