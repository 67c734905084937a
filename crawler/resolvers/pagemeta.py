"""What a page says about the audio it embeds: title, artist, album and the rest, layered by confidence.

Field by field, the first layer that has a value wins, and the item records which layer it was (meta_source):
1. structured data at the element: its own data-title/data-artist/... (title also from its title attribute),
   then the nearest ancestor with data-* fields or a schema.org MusicRecording itemscope ("data", "microdata");
   for URLs inside scripts and JSON blocks, the holding object's sibling keys ("script", "json");
2. elements whose class, id or itemprop names the field (<span class="artist">), in the nearest enclosing
   element that holds exactly one value for it, short of the whole page ("class");
3. the page's structured data: a JSON-LD MusicRecording ("jsonld"), music:musician / og:description /
   og:image ("og"), meta name=artist/description ("meta");
4. named elements of the page as a whole, when the page holds exactly one value for the field ("class");
5. the link's own text, unless it is a generic label ("Download", "下载", "320kbps": is_generic_link_text) ("link");
6. on a page about one song (one audio item or link to audio), its one <h1> heading ("heading");
7. og:title ("og"), then the page's <title> ("page-title").
A list page has one value per song in each song's row (layer 2), so its page-wide layers never reach across rows.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

from selectolax.lexbor import LexborHTMLParser, LexborNode

from crawler.web.html import css, css_first
from crawler.web.memo import Memo

FIELDS = ("title", "artist", "album", "description", "cover", "duration", "bitrate")
Meta = dict[str, Any]


class Found:
    """Metadata gathered layer by layer: per field the first value, and the layer it came from."""

    __slots__ = ("meta", "sources")

    def __init__(self) -> None:
        self.meta: Meta = {}
        self.sources: dict[str, str] = {}

    def add(self, more: Mapping[str, Any], source: str) -> Found:
        for key, value in more.items():
            if key not in self.meta:
                self.meta[key] = value
                self.sources[key] = source
        return self

    def fill(self, other: Found) -> Found:
        """Fields of other that this lacks, with other's sources."""
        for key, value in other.meta.items():
            if key not in self.meta:
                self.meta[key] = value
                self.sources[key] = other.sources.get(key, "page")
        return self

    def copy(self) -> Found:
        out = Found()
        out.meta, out.sources = dict(self.meta), dict(self.sources)
        return out

    def __bool__(self) -> bool:
        return bool(self.meta)

_DATA_FIELDS = {
    "data-title": "title", "data-artist": "artist", "data-album": "album",
    "data-description": "description", "data-cover": "cover", "data-duration": "duration",
    "data-bitrate": "bitrate",
}
_DATA_ATTRS = frozenset(_DATA_FIELDS)
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
_CLOCK = re.compile(r"\d{1,3}(:\d{1,2}){1,2}")
_BITRATE = re.compile(r"\s*(\d{1,5})(?!\d)")
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
    known = _DURATIONS.get(value)
    if known is None:
        known = _DURATIONS.keep(value, _duration_text(value) or 0.0)
    return known or None


# Durations by their text: a site spells a few hundred distinct ones ("3:30", "PT3M30S") over all its songs. 0.0 is
# kept for a text that is none (a Memo keeps no None).
_DURATIONS: Memo[str, float] = Memo(10_000)


def _duration_text(value: str) -> float | None:
    """parse_duration of a string."""
    text = value.strip()[:64]
    if text[:1] not in ("P", "p"):      # an ISO 8601 duration is never a number: no exception raised for it
        try:
            seconds = float(text)
            return seconds if 0 < seconds < _MAX_SECONDS else None
        except ValueError:
            pass
    if _CLOCK.fullmatch(text):
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
        m = _BITRATE.match(value)
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return None


_TEXT_FIELDS = ("title", "artist", "album", "description", "cover")


def normalise(meta: Mapping[str, Any]) -> Meta:
    """Typed, cleaned fields; anything that does not parse is dropped, never raised."""
    out: Meta = {}
    if not meta:
        return out     # most elements and ancestors asked have no data at all
    get = meta.get
    for key in _TEXT_FIELDS:
        value = get(key)
        if value is not None:
            text = clean_text(value)
            if text:
                out[key] = text
    value = get("duration")
    if value is not None:
        duration = parse_duration(value)
        if duration:
            out["duration"] = duration
    value = get("bitrate")
    if value is not None:
        bitrate = parse_bitrate(value)
        if bitrate:
            out["bitrate"] = bitrate
    return out


def _normal_value(field_name: str, value: Any) -> Any:
    """normalise's value of one field (None when it drops it), without a dict in and out."""
    if field_name == "duration":
        return parse_duration(value) or None
    if field_name == "bitrate":
        return parse_bitrate(value) or None
    return clean_text(value)


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
    # Per field, the first key whose value normalises; normalised once, in normalise's field order (that of
    # _JSON_KEYS), which is what normalise of the raw values gave.
    out: Meta = {}
    for field_name, keys in _JSON_KEYS.items():
        for key in keys:
            if key in lower:
                value = lower[key]
                if field_name in ("artist", "album"):
                    value = _name_of(value)
                elif field_name == "cover":
                    value = value if isinstance(value, str) else _first_url(value)
                normal = _normal_value(field_name, value)
                if normal is not None:
                    out[field_name] = normal
                    break
    return out


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


MetaTags = dict[tuple[str, str], str | None]


def meta_tags(tree: LexborHTMLParser) -> MetaTags:
    """The page's <meta> tags by ("property" | "name", value): the first of each, as a selector would find it.
    One pass over the tags instead of a selector run per field (most pages have none of the fields)."""
    return meta_tags_of(css(tree, META_TAGS))


# The <meta> tags meta_tags reads, and the <script> tags of JSON-LD: a caller that walks the page's elements anyway
# (the generic resolver) picks them out as it goes (is_meta_tag, is_json_ld) and hands them over (PageContext.seen).
META_TAGS = "meta[property], meta[name]"
_JSON_LD = 'script[type="application/ld+json"]'


def is_meta_tag(attrs: Mapping[str, str | None]) -> bool:
    """Whether a <meta> element with these attributes is one META_TAGS selects."""
    return "property" in attrs or "name" in attrs


def is_json_ld(attrs: Mapping[str, str | None]) -> bool:
    """Whether a <script> element with these attributes is one _JSON_LD selects (lexbor compares the type's value
    without regard to ASCII case; no other character's lower case is one of its ASCII letters)."""
    kind = attrs.get("type")
    return kind is not None and kind.lower() == "application/ld+json"


def meta_tags_of(nodes: list[LexborNode]) -> MetaTags:
    """meta_tags of the page's META_TAGS elements, in document order."""
    out: MetaTags = {}
    for node in nodes:
        attrs = node.attributes
        content = attrs.get("content")
        prop = attrs.get("property")
        if prop is not None:
            out.setdefault(("property", prop), content)
        name = attrs.get("name")
        if name is not None:
            out.setdefault(("name", name), content)
    return out


def _meta_content(tags: MetaTags, attr: str, value: str) -> str | None:
    return clean_text(tags.get((attr, value)))


# Words in a class, id or itemprop that name a field; checked in this order, so "album-artist" is an artist
# and "album-title" an album.
_NAME_WORDS = (
    ("artist", ("artist", "singer", "author", "performer", "musician")),
    ("album", ("album",)),
    ("duration", ("duration",)),
    ("title", ("title", "songname", "song-name", "song_name", "trackname", "track-name", "track_name")),
)
_NAMED_SELECTOR = ", ".join(f'[{attr}*="{word}" i]' for _, words in _NAME_WORDS for word in words
                            for attr in ("class", "id", "itemprop"))
_NOT_NAMED_TAGS = frozenset({"html", "head", "body", "title", "meta", "link", "script", "style", "noscript",
                             "template", "img", "input", "select", "option", "textarea", "svg", "audio",
                             "video", "source", "iframe", "object", "embed"})
_LABEL = re.compile(r"^(?:artist|singer|album|title|song|track|duration|length|time|歌手|专辑|歌名|时长)\s*[:：]\s*",
                    re.IGNORECASE)
_BY = re.compile(r"^by\s+", re.IGNORECASE)
# Text longer than this under a "title" class is a paragraph, not a name.
_MAX_NAMED_TEXT = 300
# Bounds on the work for one page: named elements read, ancestors walked from each.
_MAX_NAMED = 2000
_MAX_ANCESTORS = 64
# Generic link text: the labels sites put on a download or play link instead of the song's name, in the
# languages the crawl meets. A text is generic when every word of it is one of these, a number, a bitrate or a
# size, or an audio format: "Download", "下载MP3", "Télécharger (320 kbps)", "Click here", "Скачать mp3".
# Words are runs of letters and digits after NFKC and case folding; a run of CJK or kana is split greedily into
# the longest words of this set (so "点击下载" is 点击 + 下载). Linear in the text: each position is tried
# against at most _MAX_CJK_WORD lengths.
GENERIC_WORDS = frozenset({
    # English
    "download", "downloads", "dl", "listen", "play", "playing", "stream", "streaming", "get", "save", "open",
    "click", "tap", "here", "now", "it", "this", "the", "a", "an", "to", "in", "on", "for", "free", "online",
    "audio", "song", "track", "file", "music", "link", "mirror", "direct", "full", "version", "preview",
    "sample", "hq", "hd", "high", "low", "normal", "standard", "quality", "lossless", "format", "size",
    "button", "go", "start", "more", "original", "kbps", "kbit", "kb", "mb", "bit", "rate", "bitrate", "s",
    "playlist", "player", "via", "or", "and", "of", "your", "me", "as",
    # Chinese (simplified and traditional)
    "下载", "下載", "播放", "试听", "試聽", "在线", "在線", "点击", "點擊", "点此", "點此", "此处", "此處", "这里",
    "這裡", "立即", "马上", "馬上", "免费", "免費", "收听", "收聽", "聆听", "聆聽", "音乐", "音樂", "歌曲", "链接",
    "鏈接", "連結", "地址", "高品质", "高品質", "高音质", "高音質", "无损", "無損", "标准", "標準", "普通", "品质",
    "品質", "音质", "音質", "本地", "文件", "全曲", "完整", "版", "听", "聽", "歌", "曲", "去", "请", "請",
    # Spanish
    "descargar", "descarga", "descargas", "bajar", "escuchar", "escucha", "reproducir", "aquí", "aqui", "haz",
    "clic", "pulsa", "gratis", "canción", "cancion", "archivo", "enlace", "ahora", "el", "la", "los", "las",
    "en", "línea", "linea", "música", "musica", "de", "del", "y", "o", "esta", "este",
    # French
    "télécharger", "telecharger", "téléchargement", "telechargement", "écouter", "ecouter", "écoute",
    "ecoute", "ligne", "lire", "jouer", "cliquez", "cliquer", "ici", "le", "les", "un", "une", "fichier", "gratuit",
    "gratuitement", "maintenant", "lien", "morceau", "musique", "chanson", "du", "des", "et", "ou", "ce",
    # German
    "herunterladen", "runterladen", "laden", "anhören", "anhoren", "abspielen", "hören", "horen", "hier",
    "klicken", "klick", "jetzt", "datei", "kostenlos", "musik", "lied", "titel", "der", "die",
    "das", "den", "und", "oder", "zum", "als",
    # Portuguese
    "baixar", "baixe", "ouvir", "ouça", "ouca", "tocar", "reproduzir", "clique", "agora", "arquivo",
    "grátis", "canção", "cancao", "faixa", "do", "da", "no", "na", "um", "uma", "e",
    # Russian
    "скачать", "скачайте", "загрузить", "слушать", "послушать", "слушайте", "играть", "воспроизвести",
    "нажмите", "здесь", "тут", "сейчас", "бесплатно", "файл", "музыка", "музыку", "песня", "песню", "трек",
    "онлайн", "ссылка", "в", "и", "или", "на", "по",
    # Japanese
    "ダウンロード", "再生", "試聴", "視聴", "聴く", "きく", "ここ", "こちら", "クリック", "無料", "音楽", "楽曲",
    "今すぐ", "する", "して", "を", "で", "から", "は", "の", "フル", "ストリーミング", "リンク",
})
_FORMAT_WORDS = frozenset(ext for ext in ("mp3", "m4a", "aac", "ogg", "oga", "opus", "flac", "wav", "wma", "ape",
                                           "alac", "aiff", "amr", "mid", "midi", "m3u", "m3u8", "pls", "zip", "rar"))
# A bitrate, a sample rate or a size: "320kbps", "128k", "44khz", "3mb", "24bit", a decimal ("3.5 MB"), or a
# bare common bitrate ("MP3 320"). Other bare numbers are not labels: "Track 3" names a song as well as its page does.
_AMOUNT_WORD = re.compile(r"\d+(?:[.,]\d+)?(?:k|kb|kbps|kbit|kbits|khz|hz|mb|mib|m|bit|bits)|\d+[.,]\d+"
                          r"|64|96|128|160|192|256|320")
# A word: a number with its decimals and unit ("3.5mb"), or a run of letters and digits.
_WORD = re.compile(r"\d+(?:[.,]\d+)?[^\W\d_]*|\w+")
# CJK ideographs, kana: scripts written without spaces between words.
_NO_SPACES = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+")
_MAX_CJK_WORD = max(len(w) for w in GENERIC_WORDS if _NO_SPACES.fullmatch(w))
_MAX_LABEL = 120   # a longer text names something


def _generic_word(word: str) -> bool:
    return word in GENERIC_WORDS or word in _FORMAT_WORDS or _AMOUNT_WORD.fullmatch(word) is not None


def _generic_run(run: str) -> bool:
    """A run of CJK or kana made only of generic words, split greedily, longest first."""
    i, n = 0, len(run)
    while i < n:
        for length in range(min(_MAX_CJK_WORD, n - i), 0, -1):
            if run[i:i + length] in GENERIC_WORDS:
                i += length
                break
        else:
            return False
    return True


def is_generic_link_text(text: str) -> bool:
    """Whether a link's text is a label ("Download", "下载", "320kbps", "Click here") rather than a name: the one
    definition the crawl uses, for link texts and for headings alike. Remembered by the text: a site's links say
    "Download" or "Listen" on every page."""
    if len(text) > _MAX_LABEL:
        return False
    known = _GENERIC_TEXTS.get(text)
    if known is None:
        known = _GENERIC_TEXTS.keep(text, _is_generic_text(text))
    return known


_GENERIC_TEXTS: Memo[str, bool] = Memo(10_000)


def _is_generic_text(text: str) -> bool:
    folded = unicodedata.normalize("NFKC", text).casefold()
    for word in _WORD.findall(folded):
        # Split where a script written without spaces meets another ("下载mp3", "mp3下载").
        pos = 0
        for m in _NO_SPACES.finditer(word):
            if (m.start() > pos and not _generic_word(word[pos:m.start()])) or not _generic_run(m.group()):
                return False
            pos = m.end()
        if pos < len(word) and not _generic_word(word[pos:]):
            return False
    return True


def _field_of_name(attrs: Mapping[str, str | None]) -> str | None:
    for attr in ("itemprop", "class", "id"):
        value = attrs.get(attr)
        if not value:
            continue
        tokens = value.lower().split()
        for field_name, words in _NAME_WORDS:
            if any(word in token for token in tokens for word in words):
                if field_name == "title" and any(t.startswith("sub") for t in tokens):
                    continue   # a subtitle names something else
                return field_name
    return None


def _named_value(node: LexborNode, field_name: str) -> Any:
    content = node.attributes.get("content") if node.tag == "meta" else None
    text = clean_text(content or node.text(deep=True, separator=" "))
    if not text or len(text) > _MAX_NAMED_TEXT:
        return None
    text = _LABEL.sub("", text)
    if field_name == "artist":
        text = _BY.sub("", text)
    return normalise({field_name: text}).get(field_name)


# Named elements are looked for only in pages whose markup names a field somewhere: one scan of the bytes
# instead of a selector run over every element, for the many pages that have none.
_NAME_WORDS_B = re.compile(b"|".join(re.escape(w.encode()) for _, words in _NAME_WORDS for w in words))
_NAMING_ATTRS = (b"class=", b"id=", b"itemprop=")


def _may_name_fields(body: bytes, lower: bytes | None = None) -> bool:
    """Whether some class, id or itemprop value in the markup contains a field's name. A scan of the bytes
    with str.find over the few such attributes a page has, so a page without any costs microseconds, not a
    selector run over every element. (class = "x", with spaces, is not seen: a rare spelling.) lower: the body in
    lower case, when the caller has it."""
    if lower is None:
        lower = body.lower()
    search = _NAME_WORDS_B.search
    for attr in _NAMING_ATTRS:
        at = lower.find(attr)
        while at >= 0:
            start = at + len(attr)
            quote = lower[start:start + 1]
            if quote == b'"' or quote == b"'":
                start += 1
                end = lower.find(quote, start, start + 300)
            else:
                end = lower.find(b">", start, start + 300)
            if end < 0:
                end = start + 300
            if search(lower, start, end):
                return True
            at = lower.find(attr, end)
    return False


class NamedIndex:
    """Which values named elements hold, per enclosing element: built once per page, on first use.

    For every element that has named elements inside it, the distinct values per field. An audio element
    takes a field from its nearest ancestor (itself included) holding exactly one value; an ancestor holding
    several is the list around it, past which the field is not looked for.
    """

    def __init__(self, tree: LexborHTMLParser | None) -> None:
        self._by_scope: dict[int, dict[str, set[Any]]] = {}
        self.body_id: int | None = None
        if tree is None:
            return   # the empty index
        body = css_first(tree, "body")
        if body is not None:
            self.body_id = body.mem_id
        named: list[tuple[LexborNode, str]] = []
        for node in css(tree, _NAMED_SELECTOR)[:_MAX_NAMED]:
            if node.tag in _NOT_NAMED_TAGS:
                continue
            field_name = _field_of_name(node.attributes)
            if field_name is not None:
                named.append((node, field_name))
        # An element named "track" that holds a named "artist" is the row, not a value: skip containers.
        containers: set[int] = set()
        for node, _ in named:
            parent, steps = node.parent, 0
            while parent is not None and steps < _MAX_ANCESTORS:
                containers.add(parent.mem_id)
                parent, steps = parent.parent, steps + 1
        for node, field_name in named:
            if node.mem_id in containers:
                continue
            value = _named_value(node, field_name)
            if value is None:
                continue
            current: LexborNode | None = node
            steps = 0
            while current is not None and steps < _MAX_ANCESTORS and current.tag != "html":
                self._by_scope.setdefault(current.mem_id, {}).setdefault(field_name, set()).add(value)
                current, steps = current.parent, steps + 1

    def local(self, node: LexborNode) -> Meta:
        """Fields from the nearest enclosing element with one value each, short of the whole page."""
        out: Meta = {}
        if not self._by_scope:
            return out
        settled: set[str] = set()
        current: LexborNode | None = node
        steps = 0
        while current is not None and steps < _MAX_ANCESTORS and current.tag not in ("body", "html"):
            found = self._by_scope.get(current.mem_id)
            if found:
                for field_name, values in found.items():
                    if field_name not in settled:
                        settled.add(field_name)
                        if len(values) == 1:
                            out[field_name] = next(iter(values))
            current, steps = current.parent, steps + 1
        return out

    def page_wide(self) -> Meta:
        found = self._by_scope.get(self.body_id) if self.body_id is not None else None
        return {k: next(iter(v)) for k, v in found.items() if len(v) == 1} if found else {}


_NO_NAMES = NamedIndex(None)


_FILE_NAME_END = re.compile(r"\.[a-z0-9]{2,4}$", re.IGNORECASE)


def link_text(node: LexborNode) -> Meta:
    """Layer 5: the text of an a/area element, unless it is a generic "Download" or a file name."""
    if node.tag not in ("a", "area"):
        return {}
    text = clean_text(node.text(deep=True, separator=" ") if node.tag == "a" else node.attributes.get("alt"))
    if not text or len(text) < 2 or len(text) > _MAX_NAMED_TEXT or is_generic_link_text(text):
        return {}
    if "/" in text or _FILE_NAME_END.search(text):
        return {}   # a URL or a file name, not a name
    return {"title": text}


class PageContext:
    """What a page says as a whole (layers 3, 4, 6 and 7), computed once per page and only when it has audio."""

    def __init__(self, tree: LexborHTMLParser, body: bytes | None = None, lower: bytes | None = None) -> None:
        """body: the page's bytes (a page whose markup names no field skips the named elements' selector);
        lower: the same in lower case, when the caller has it."""
        self.tree = tree
        self._body = body
        self._lower = lower
        self._named: NamedIndex | None = None
        self._metas: MetaTags | None = None
        self._high: Found | None = None
        self._low: Found | None = None
        self._heading: Meta | None = None
        self._json_ld: list[LexborNode] | None = None

    @property
    def named(self) -> NamedIndex:
        if self._named is None:
            maybe = self._body is None or _may_name_fields(self._body, self._lower)
            self._named = NamedIndex(self.tree) if maybe else _NO_NAMES
        return self._named

    @property
    def metas(self) -> MetaTags:
        if self._metas is None:
            self._metas = meta_tags(self.tree)
        return self._metas

    def high(self) -> Found:
        """Layers 3 and 4: the page's structured data, then its named elements when unambiguous."""
        if self._high is None:
            self._high = _high_layers(self.tree, self.metas, self.named, self._json_ld)
        return self._high

    def seen(self, json_ld: list[LexborNode], metas: list[LexborNode]) -> None:
        """The page's JSON-LD scripts and META_TAGS elements, in document order, as a walk of every element that
        may name audio found them: not looked for again."""
        self._json_ld = json_ld
        if self._metas is None:
            self._metas = meta_tags_of(metas)

    def low(self) -> Found:
        """Layer 7: og:title, else <title>; asked only by items that have no title by then."""
        if self._low is None:
            self._low = Found()
            og_title = _meta_content(self.metas, "property", "og:title")
            if og_title:
                self._low.add({"title": og_title}, "og")
            else:
                title_node = css_first(self.tree, "title")
                text = clean_text(title_node.text()) if title_node is not None else None
                if text:
                    self._low.add({"title": text}, "page-title")
        return self._low

    def heading(self) -> Meta:
        """Layer 6: the page's one <h1>, when it names something (not a label such as "Download")."""
        if self._heading is None:
            self._heading = {}
            found = css(self.tree, "h1")
            if len(found) == 1:
                text = clean_text(found[0].text(deep=True, separator=" "))
                if text and len(text) <= _MAX_NAMED_TEXT and not is_generic_link_text(text):
                    self._heading = {"title": text}
        return self._heading

    def item_meta(self, local: Found, link: LexborNode | None = None, *, one_song: bool = False) -> Found:
        """All layers for one item: its local ones, then the page's, the link text, the heading of a page about
        one song (one_song: the page has one audio item or link to audio), og:title, <title>."""
        out = local.copy().fill(self.high())
        if link is not None:
            out.add(link_text(link), "link")
        if one_song and "title" not in out.meta:
            out.add(self.heading(), "heading")
        return out if "title" in out.meta else out.fill(self.low())


def _high_layers(tree: LexborHTMLParser, metas: MetaTags, named: NamedIndex,
                 json_ld: list[LexborNode] | None = None) -> Found:
    high = Found()
    for script in css(tree, _JSON_LD) if json_ld is None else json_ld:
        for obj in _walk_json(load_json_block(script.text() or "")):
            if _is_music_recording(obj):
                high.add(json_object_meta(obj), "jsonld")
                break
        if high:
            break
    # Each query only for a field still missing: most pages answer from their first source.
    # (_meta_content already cleans the text.)
    known = high.meta
    if "artist" not in known:
        musician = _meta_content(metas, "property", "music:musician")
        if musician:
            high.add({"artist": musician}, "og")
        else:
            high.add(_present({"artist": _meta_content(metas, "name", "artist")}), "meta")
    if "description" not in known:
        description = _meta_content(metas, "property", "og:description")
        if description:
            high.add({"description": description}, "og")
        else:
            high.add(_present({"description": _meta_content(metas, "name", "description")}), "meta")
    if "cover" not in known:
        high.add(_present({"cover": _meta_content(metas, "property", "og:image")}), "og")
    high.add(named.page_wide(), "class")
    return high


def _present(meta: Meta) -> Meta:
    return {k: v for k, v in meta.items() if v}


def page_meta(tree: LexborHTMLParser) -> Meta:
    """Every page-wide layer, flattened (for callers that want the page's own description of itself)."""
    ctx = PageContext(tree)
    return ctx.high().copy().fill(ctx.low()).meta


def _own_data(attrs: Mapping[str, str | None], with_title_attr: bool) -> Meta:
    # The element's data-* fields found by one set intersection over its few attributes, not a lookup per field
    # (most elements and ancestors asked have none). normalise reads the fields in its own order.
    present = _DATA_ATTRS.intersection(attrs)
    raw: dict[str, str | None] = {}
    if present:
        raw = {_DATA_FIELDS[attr]: value for attr in present if (value := attrs[attr])}
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


def _microdata(node: LexborNode, attrs: Mapping[str, str | None]) -> Meta:
    if "itemscope" not in attrs or "musicrecording" not in (attrs.get("itemtype") or "").lower():
        return {}
    return normalise({"title": _itemprop(node, "name"), "artist": _itemprop(node, "byArtist"),
                      "album": _itemprop(node, "inAlbum"), "description": _itemprop(node, "description"),
                      "duration": _itemprop(node, "duration")})


def element_meta(node: LexborNode) -> Meta:
    """Layer 1 for an element referencing audio, as plain fields (for callers that keep no sources)."""
    return element_found(node).meta


def element_found(node: LexborNode, page: PageContext | None = None) -> Found:
    """Layers 1 and 2 for an element referencing audio, each field with its source."""
    found = Found()
    attrs = node.attributes      # a new dict from lexbor at each ask: asked once an element
    if attrs:
        found.add(_own_data(attrs, with_title_attr=True), "data")
        found.add(_microdata(node, attrs), "microdata")
    current = node.parent
    while current is not None and current.tag not in ("body", "html", "head"):
        attrs = current.attributes
        if attrs:   # most ancestors have no attributes: nothing to read
            found.add(_own_data(attrs, with_title_attr=False), "data")
            found.add(_microdata(current, attrs), "microdata")
        current = current.parent
    if page is not None:
        found.add(page.named.local(node), "class")
    return found
