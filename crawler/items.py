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
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> AudioItem:
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["identity"] = self.identity.to_wire() if self.identity else None
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AudioItem:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("identity") is not None:
            kw["identity"] = RequestIdentity.from_wire(kw["identity"])
        return cls(**kw)

    def catalogue_row(self) -> dict[str, Any]:
        """What the catalogue records: everything but the client identity (cookies are secrets)."""
        d = self.to_wire()
        d.pop("identity", None)
        return d
