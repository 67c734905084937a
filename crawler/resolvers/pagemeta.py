"""What a page says about the audio it embeds: title, artist, album and the rest.

The convention (the demo site and the tests follow it exactly), field by field, first hit wins:
1. the referencing element's own data-title/data-artist/data-album (title also from its title attribute);
2. the nearest ancestor carrying data-* fields, or a schema.org MusicRecording itemscope;
3. the page: a JSON-LD MusicRecording, then og:title / music:musician / meta name=artist, then <title>.
For URLs inside scripts and JSON blocks the holding object's sibling keys take the place of 1 and 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from selectolax.lexbor import LexborHTMLParser, LexborNode

from crawler.html import css, css_first

FIELDS = ("title", "artist", "album", "description", "cover", "duration", "bitrate")
Meta = dict[str, Any]

_DATA_FIELDS = {
    "data-title": "title", "data-artist": "artist", "data-album": "album",
    "data-description": "description", "data-cover": "cover", "data-duration": "duration",
    "data-bitrate": "bitrate",
}
# Sibling keys of a URL inside JSON or a script literal, lower case, most specific first.
_JSON_KEYS = {
    "title": ("title", "name", "song_name", "songname"),
    "artist": ("artist", "singer", "author_name", "singername", "byartist", "author"),
    "album": ("album", "album_name", "albumname", "inalbum"),
    "description": ("description",),
    "cover": ("cover", "image", "img"),
    "duration": ("duration",),
    "bitrate": ("bitrate",),
}
_ISO_DURATION = re.compile(r"^P(?:(\d+(?:\.\d+)?)D)?T?(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?$")
_MAX_TEXT = 1000
# Anything longer than a week is a parsing accident (or infinity), not a recording.
_MAX_SECONDS = 7 * 86400


def clean_text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    return text[:_MAX_TEXT] or None


def parse_duration(value: Any) -> float | None:
    """Seconds from a number, a numeric string, "mm:ss", or an ISO 8601 duration (PT3M20S)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if 0 < value < _MAX_SECONDS else None
    if not isinstance(value, str):
        return None
    text = value.strip()[:64]
    try:
        seconds = float(text)
        return seconds if 0 < seconds < _MAX_SECONDS else None
    except ValueError:
        pass
    if re.fullmatch(r"\d{1,3}(:\d{1,2}){1,2}", text):
        total = 0.0
        for part in text.split(":"):
            total = total * 60 + int(part)
        return total or None
    m = _ISO_DURATION.match(text.upper())
    if m and any(m.groups()):
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        total = d * 86400 + h * 3600 + mi * 60 + s
        return total if 0 < total < _MAX_SECONDS else None
    return None


def parse_bitrate(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value) if 0 < value < 100_000 else None
    if isinstance(value, str):
        m = re.match(r"\s*(\d{1,5})(?!\d)", value)
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return None


def normalise(meta: Mapping[str, Any]) -> Meta:
    """Typed, cleaned fields; anything that does not parse is dropped, never raised."""
    out: Meta = {}
    for key in ("title", "artist", "album", "description", "cover"):
        text = clean_text(meta.get(key))
        if text:
            out[key] = text
    duration = parse_duration(meta.get("duration"))
    if duration:
        out["duration"] = duration
    bitrate = parse_bitrate(meta.get("bitrate"))
    if bitrate:
        out["bitrate"] = bitrate
    return out


def fill(first: Meta, *more: Meta) -> Meta:
    """Per field, the first source that has it."""
    out = dict(first)
    for source in more:
        for key, value in source.items():
            out.setdefault(key, value)
    return out


def _name_of(value: Any) -> Any:
    """A schema.org thing given as a string, an object with "name", or a list of those."""
    if isinstance(value, Mapping):
        return value.get("name")
    if isinstance(value, list):
        names = [n for n in (_name_of(v) for v in value) if isinstance(n, str) and n.strip()]
        return ", ".join(names) if names else None
    return value


def json_object_meta(obj: Mapping[str, Any]) -> Meta:
    """Fields from the sibling keys of a JSON (or script literal) object."""
    lower = {str(k).lower(): v for k, v in obj.items()}
    raw: Meta = {}
    for field_name, keys in _JSON_KEYS.items():
        for key in keys:
            if key in lower:
                value = lower[key]
                if field_name in ("artist", "album"):
                    value = _name_of(value)
                elif field_name == "cover":
                    value = value if isinstance(value, str) else _first_url(value)
                if normalise({field_name: value}):
                    raw[field_name] = value
                    break
    return normalise(raw)


def _first_url(value: Any) -> str | None:
    if isinstance(value, Mapping):
        url = value.get("url") or value.get("contentUrl")
        return url if isinstance(url, str) else None
    if isinstance(value, list) and value:
        return _first_url(value[0]) if not isinstance(value[0], str) else value[0]
    return None


def _is_music_recording(value: Any) -> bool:
    kind = value.get("@type") if isinstance(value, Mapping) else None
    if isinstance(kind, list):
        return any(isinstance(k, str) and k.endswith("MusicRecording") for k in kind)
    return isinstance(kind, str) and kind.endswith("MusicRecording")


def _walk_json(value: Any, depth: int = 0) -> Iterator[Mapping[str, Any]]:
    if depth > 32:
        return
    if isinstance(value, Mapping):
        yield value
        for v in value.values():
            yield from _walk_json(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_json(v, depth + 1)


def load_json_block(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _meta_content(tree: LexborHTMLParser, selector: str) -> str | None:
    node = css_first(tree, selector)
    return clean_text(node.attributes.get("content")) if node is not None else None


def page_meta(tree: LexborHTMLParser) -> Meta:
    """Level 3 of the convention: what the page as a whole says."""
    recording: Meta = {}
    for script in css(tree, 'script[type="application/ld+json"]'):
        for obj in _walk_json(load_json_block(script.text() or "")):
            if _is_music_recording(obj):
                recording = json_object_meta(obj)
                break
        if recording:
            break
    title_node = css_first(tree, "title")
    head: Meta = normalise({
        "title": _meta_content(tree, 'meta[property="og:title"]')
        or (title_node.text() if title_node is not None else None),
        "artist": _meta_content(tree, 'meta[property="music:musician"]')
        or _meta_content(tree, 'meta[name="artist"]'),
        "description": _meta_content(tree, 'meta[property="og:description"]')
        or _meta_content(tree, 'meta[name="description"]'),
        "cover": _meta_content(tree, 'meta[property="og:image"]'),
    })
    return fill(recording, head)


def _own_data(node: LexborNode, with_title_attr: bool) -> Meta:
    attrs = node.attributes
    raw = {field_name: attrs.get(attr) for attr, field_name in _DATA_FIELDS.items() if attrs.get(attr)}
    if with_title_attr and not raw.get("title") and attrs.get("title"):
        raw["title"] = attrs.get("title")
    return normalise(raw)


def _itemprop(scope: LexborNode, prop: str) -> str | None:
    node = css_first(scope, f'[itemprop="{prop}"]')
    if node is None:
        return None
    content = node.attributes.get("content")
    if content:
        return clean_text(content)
    inner = css_first(node, '[itemprop="name"]') if prop != "name" else None
    return clean_text((inner or node).text(deep=True))


def _microdata(node: LexborNode) -> Meta:
    attrs = node.attributes
    if "itemscope" not in attrs or "musicrecording" not in (attrs.get("itemtype") or "").lower():
        return {}
    return normalise({"title": _itemprop(node, "name"), "artist": _itemprop(node, "byArtist"),
                      "album": _itemprop(node, "inAlbum"), "description": _itemprop(node, "description"),
                      "duration": _itemprop(node, "duration")})


def element_meta(node: LexborNode) -> Meta:
    """Levels 1 and 2 of the convention for an element referencing audio."""
    meta = _own_data(node, with_title_attr=True)
    meta = fill(meta, _microdata(node))
    current = node.parent
    while current is not None and current.tag not in ("body", "html", "head"):
        meta = fill(meta, _own_data(current, with_title_attr=False), _microdata(current))
        current = current.parent
    return meta
