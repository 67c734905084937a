"""URL policy: resolving links, one canonical key per resource, and the paper's discard rules.

http(s) URLs are read as the WHATWG URL standard reads them, as browsers do (``\\`` is ``/``, ``http:g``
against an http page is relative, ``%2e`` is a dot segment, numeric hosts are IPv4 addresses): ``resolve``,
``resolve_link`` and ``normalize`` share that one parser, so a link, a redirect's Location and a seed give one
answer (tests/test_url_conformance.py runs the standard's own tests). Other schemes follow RFC 3986 section 5.2.
``normalize`` then applies RFC 3986 section 6.2.2 so that the spellings of one resource give one key for the
Bloom filter: lower-case scheme and host, IDNA hosts, default port dropped, empty path as ``/``, canonical
percent-encoding, dot segments removed, an empty ``?`` dropped, user info and a host's trailing dot dropped (they
name no other resource), and the fragment dropped unless a resolver declared it meaningful. ``host_url_of`` is
the origin: the key of politeness and robots.txt.

``UrlPolicy.check`` is run by the master on every normalised link; its reasons are the keys of the
discard counters in the master's statistics.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import unquote, unquote_to_bytes

import idna

from crawler.web.memo import Memo

__all__ = [
    "AUDIO_REF_HOPS", "DEFAULT", "DISCARD_DENIED", "DISCARD_GENERATED", "DISCARD_QUERY", "DISCARD_SCHEME",
    "DISCARD_SCOPE", "DISCARD_TOO_DEEP", "DISCARD_TOO_LONG", "InvalidURL", "NormalizeOptions", "UrlPolicy",
    "host_of", "host_port", "host_url_of", "normalize", "normalize_many", "remove_dot_segments", "resolve", "resolve_link",
]


class InvalidURL(ValueError):
    """The text is not a URL this crawler can fetch or key (no scheme, no host, bad port ...)."""


# -- parsing and resolution (RFC 3986 sections 3, 5) ------------------------------------------------------

# Appendix B, with the scheme restricted to its grammar so that "1a:b" reads as a path, not a scheme.
_URI_RE = re.compile(r"(?:([A-Za-z][A-Za-z0-9+.\-]*):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?",
                     re.DOTALL)
# Surrounding C0 controls and spaces are not part of a link in a page (WHATWG URL "strip"), and
# tabs and newlines inside one come from wrapped HTML attributes.
_STRIP = "".join(map(chr, range(0x21)))
_TAB_NL = str.maketrans("", "", "\t\n\r")


def _split(ref: str) -> tuple[str | None, str | None, str, str | None, str | None]:
    m = _URI_RE.fullmatch(ref)
    assert m is not None  # every group is optional: the pattern matches any string
    return m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)


def _join(scheme: str | None, authority: str | None, path: str, query: str | None,
          fragment: str | None) -> str:
    # RFC 3986 5.3, component recomposition
    out = []
    if scheme is not None:
        out.append(scheme + ":")
    if authority is not None:
        out.append("//" + authority)
    out.append(path)
    if query is not None:
        out.append("?" + query)
    if fragment is not None:
        out.append("#" + fragment)
    return "".join(out)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: the result of its step-by-step algorithm, computed by segments where that is the same.

    For an absolute path the algorithm is a stack of segments; a relative one (only met by resolving against
    a rootless base such as ``foo:a/b``) goes through the literal algorithm, whose edge cases the abnormal
    examples of 5.4.2 depend on. A property test holds the two together.
    """
    if "." not in path:
        return path
    if not path.startswith("/"):
        return _remove_dot_segments_rfc(path)
    segments = path.split("/")
    out: list[str] = []
    for seg in segments[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _remove_dot_segments_rfc(path: str) -> str:
    out: list[str] = []
    inp = path
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith(("./", "/./")):
            inp = inp[2:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = inp[3:]
            if out:
                out.pop()
        elif inp == "/..":
            inp = "/"
            if out:
                out.pop()
        elif inp in (".", ".."):
            inp = ""
        else:
            end = inp.find("/", 1 if inp.startswith("/") else 0)
            if end < 0:
                end = len(inp)
            out.append(inp[:end])
            inp = inp[end:]
    return "".join(out)


# -- the WHATWG URL parser, for http(s) (https://url.spec.whatwg.org/#concept-basic-url-parser) -------------
#
# Links on pages are read by browsers, so a link means what the WHATWG URL standard makes of it: "\" is "/",
# any run of slashes after "http:" starts the host, "http:g" against an http page is relative, "%2e" is a dot
# segment, numeric hosts are IPv4 addresses. Written with string operations on whole components rather than
# the standard's character loop: the states collapse into a handful of cases once the scheme is known.

_WEB_DEFAULT_PORTS = {"http": "80", "https": "443"}
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_AUTHORITY_END = re.compile(r"[/\\?#]")
_SLASHES = re.compile(r"[/\\]*")
_SLASH_SPLIT = re.compile(r"[/\\]")
# The standard's percent-encode sets (path, special query, fragment, userinfo), as "what must be escaped".
_ENC_PATH = re.compile(r"[\x00-\x20\"#<>?`{}\x7f-\U0010ffff]+")
_ENC_QUERY = re.compile(r"[\x00-\x20\"#<>'\x7f-\U0010ffff]+")
_ENC_FRAGMENT = re.compile(r"[\x00-\x20\"<>`\x7f-\U0010ffff]+")
_ENC_USERINFO = re.compile(r"[\x00-\x20\"#<>?`{}/:;=@\[\\\]^|\x7f-\U0010ffff]+")
_SINGLE_DOT = frozenset({".", "%2e", "%2E"})
_DOUBLE_DOT = frozenset({"..", ".%2e", ".%2E", "%2e.", "%2E.", "%2e%2e", "%2E%2E", "%2e%2E", "%2E%2e"})
_IPV4_PART = re.compile(r"0[xX][0-9A-Fa-f]*|0[0-7]+|[1-9][0-9]*|0")
_NUMBER_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_IPV6_CHARS = re.compile(r"[0-9A-Fa-f:.]+")


def _utf8_escape(m: re.Match[str]) -> str:
    s = m.group()
    try:
        data = s.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate: the standard's input is Unicode scalar values (U+FFFD)
        data = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
    return "".join(f"%{b:02X}" for b in data)


def _ipv4(host: str) -> str | None:
    """The WHATWG IPv4 parser (decimal, octal and hex parts, 1 to 4 of them); None when it fails."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        # any part past 12 digits is over 2**32: refused before int() sees a page's worth of digits
        if not _IPV4_PART.fullmatch(part) or len(part.lstrip("0xX")) > 12:
            return None
        if part[:2] in ("0x", "0X"):
            numbers.append(int(part[2:], 16) if len(part) > 2 else 0)
        elif len(part) > 1 and part[0] == "0":
            numbers.append(int(part, 8))
        else:
            numbers.append(int(part))
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    address = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        address += n * 256 ** (3 - i)
    return ".".join(str((address >> shift) & 255) for shift in (24, 16, 8, 0))


def _ends_in_number(host: str) -> bool:
    last = host[:-1] if host.endswith(".") and len(host) > 1 else host
    last = last[last.rfind(".") + 1:]
    return bool(last) and _NUMBER_LABEL.fullmatch(last) is not None


def _web_host(raw: str) -> str | None:
    """The WHATWG host parser for a special scheme: a domain (IDNA, lower case), an IPv4 address or a
    bracketed IPv6 address, serialized; None when the host is not valid."""
    if raw.startswith("["):
        inner = raw[1:-1]
        if not raw.endswith("]") or not _IPV6_CHARS.fullmatch(inner):
            return None
        try:
            return "[" + ipaddress.IPv6Address(inner).compressed + "]"
        except ValueError:
            return None
    if "%" in raw:
        raw = unquote_to_bytes(raw).decode("utf-8", "replace")
    if raw.isascii():
        host = raw.lower()
        if "xn--" in host:
            for label in host.split("."):
                if label.startswith("xn--"):
                    try:
                        idna.decode(label)
                    except (UnicodeError, ValueError):
                        try:
                            label.encode("ascii").decode("idna")   # IDNA 2003, as for a Unicode host below
                        except (UnicodeError, ValueError):
                            return None
    else:
        try:
            host = idna.encode(raw, uts46=True).decode("ascii")
        except (UnicodeError, ValueError):
            try:
                # IDNA 2003 accepts some names IDNA 2008 refuses (symbols, emoji) that still resolve.
                host = raw.encode("idna").decode("ascii").lower()
            except (UnicodeError, ValueError):
                return None
    if not host or _BAD_HOST.search(host):
        return None
    if _ends_in_number(host):
        return _ipv4(host)
    return host


class _WebURL(NamedTuple):
    """A parsed http(s) URL, every part already serialized as the standard serializes it."""

    scheme: str
    userinfo: str           # "user:pass" or "user" or ""
    host: str
    port: str               # "" for the scheme's default
    path: str               # starts with "/"
    query: str | None
    fragment: str | None

    def href(self) -> str:
        out = [self.scheme, "://"]
        if self.userinfo:
            out += (self.userinfo, "@")
        out.append(self.host)
        if self.port:
            out += (":", self.port)
        out.append(self.path)
        if self.query is not None:
            out += ("?", self.query)
        if self.fragment is not None:
            out += ("#", self.fragment)
        return "".join(out)


def _path_segments(text: str, segments: list[str]) -> str:
    """The standard's path state over ``text`` (slashes of either kind), appended to ``segments``."""
    pieces = _SLASH_SPLIT.split(text)
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        if piece in _DOUBLE_DOT or (len(piece) in (4, 6) and piece.lower() in _DOUBLE_DOT):
            if segments:
                segments.pop()
            if i == last:
                segments.append("")
        elif piece in _SINGLE_DOT:
            if i == last:
                segments.append("")
        else:
            segments.append(_ENC_PATH.sub(_utf8_escape, piece))
    return "/" + "/".join(segments)


def _split_rest(text: str) -> tuple[str, str | None, str | None]:
    """path, query, fragment of what follows the host (or of a relative reference)."""
    fragment = query = None
    hash_at = text.find("#")
    if hash_at >= 0:
        text, fragment = text[:hash_at], _ENC_FRAGMENT.sub(_utf8_escape, text[hash_at + 1:])
    q = text.find("?")
    if q >= 0:
        text, query = text[:q], _ENC_QUERY.sub(_utf8_escape, text[q + 1:])
    return text, query, fragment


def _web_authority(scheme: str, text: str) -> _WebURL | None:
    """``text`` from the host on (leading slashes skipped already): authority, path, query, fragment."""
    m = _AUTHORITY_END.search(text)
    end = m.start() if m is not None else len(text)
    authority, rest = text[:end], text[end:]
    userinfo = ""
    at = authority.rfind("@")
    if at >= 0:
        user, _, password = authority[:at].partition(":")
        user = _ENC_USERINFO.sub(_utf8_escape, user)
        password = _ENC_USERINFO.sub(_utf8_escape, password)
        userinfo = user + ":" + password if password else user
        authority = authority[at + 1:]
        if not authority:
            return None
    close = authority.rfind("]")
    colon = authority.find(":", close + 1 if authority.startswith("[") and close > 0 else 0)
    port = ""
    if colon >= 0:
        authority, port = authority[:colon], authority[colon + 1:]
        if port:
            if not (port.isdigit() and port.isascii()) or len(port.lstrip("0")) > 5 or int(port) > 65535:
                return None
            port = str(int(port))
            if port == _WEB_DEFAULT_PORTS[scheme]:
                port = ""
    if not authority:
        return None
    host = _web_host(authority)
    if host is None:
        return None
    path, query, fragment = _split_rest(rest)
    if path[:1] in ("/", "\\"):
        path = path[1:]
    return _WebURL(scheme, userinfo, host, port, _path_segments(path, []), query, fragment)


def _parse_web(text: str, base: _WebURL | None) -> _WebURL | None:
    """The standard's basic URL parser for input whose scheme (or, when it has none, whose base's scheme) is
    http or https. ``text`` has been stripped of surrounding C0 controls and spaces and of tabs and newlines.
    None is the standard's failure."""
    m = _SCHEME_RE.match(text)
    if m is not None:
        scheme = m.group(1).lower()
        rest = text[m.end():]
        if base is None or base.scheme != scheme:
            # special authority slashes: any run of "/" and "\" (none too) leads to the host
            return _web_authority(scheme, rest[_SLASHES.match(rest).end():])  # type: ignore[union-attr]
        text = rest        # "http:g" against an http base is the relative "g"
    elif base is None:
        return None
    if text[:1] in ("/", "\\"):
        if text[1:2] in ("/", "\\"):
            return _web_authority(base.scheme, text[_SLASHES.match(text).end():])  # type: ignore[union-attr]
        path, query, fragment = _split_rest(text[1:])
        return base._replace(path=_path_segments(path, []), query=query, fragment=fragment)
    path, query, fragment = _split_rest(text)
    if not path:
        if query is None:
            query = base.query
        return base._replace(query=query, fragment=fragment)
    segments = base.path[1:].split("/")
    segments.pop()
    return base._replace(path=_path_segments(path, segments), query=query, fragment=fragment)


def _web_text(text: str) -> str:
    """What the standard parses: surrounding C0 controls and spaces removed, tabs and newlines anywhere."""
    text = text.strip(_STRIP)
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.translate(_TAB_NL)
    return text


def _is_web_scheme(text: str) -> bool | None:
    """True for an http(s) scheme, False for another one, None for no scheme at all."""
    m = _SCHEME_RE.match(text)
    if m is None:
        return None
    return m.group(1).lower() in _WEB_DEFAULT_PORTS


def resolve(base: str, ref: str, *, strict: bool = True) -> str:
    """Resolve ``ref`` against the absolute URL ``base``; no normalisation beyond the parser's. The crawler's
    one join: links, redirects' Location, playlists' entries.

    When the result is http(s) (``ref`` names http(s), or it names no scheme and ``base`` is http(s)) this is
    the WHATWG URL standard's parser, as browsers read a page (``\\`` is ``/``, ``http:g`` is relative), and
    the result is the standard's serialization, fragment included; a URL the standard refuses raises
    ``InvalidURL``. Otherwise RFC 3986 section 5.2 to the letter, where ``strict=False`` is its
    backward-compatible reading (5.2.2): a reference with the base's own scheme and no authority is relative.
    """
    text = _web_text(ref)
    web = _is_web_scheme(text)
    if web is None or web:
        base_text = _web_text(base)
        base_web = _is_web_scheme(base_text)
        if web or base_web:
            parsed_base = None
            if base_web:
                parsed_base = _parse_web(base_text, None)
                if parsed_base is None:
                    raise InvalidURL(f"base is not a valid URL: {base!r}")
            url = _parse_web(text, parsed_base)
            if url is None:
                raise InvalidURL(f"not a valid URL: {ref!r} against {base!r}")
            return url.href()
    b_scheme, b_auth, b_path, b_query, _ = _split(base.strip(_STRIP))
    if b_scheme is None:
        raise InvalidURL(f"base is not an absolute URI: {base!r}")
    r_scheme, r_auth, r_path, r_query, r_frag = _split(ref.strip(_STRIP))
    if not strict and r_scheme is not None and r_scheme.lower() == b_scheme.lower():
        r_scheme = None
    if r_scheme is not None:
        return _join(r_scheme, r_auth, remove_dot_segments(r_path), r_query, r_frag)
    if r_auth is not None:
        return _join(b_scheme, r_auth, remove_dot_segments(r_path), r_query, r_frag)
    if r_path == "":
        path = b_path
        query = r_query if r_query is not None else b_query
    else:
        if r_path.startswith("/"):
            path = remove_dot_segments(r_path)
        else:
            # 5.2.3 merge
            if b_auth is not None and b_path == "":
                merged = "/" + r_path
            else:
                merged = b_path[:b_path.rfind("/") + 1] + r_path
            path = remove_dot_segments(merged)
        query = r_query
    return _join(b_scheme, b_auth, path, query, r_frag)

_SKIPPED_SCHEMES = ("javascript:", "mailto:", "tel:", "data:", "about:", "blob:")
# What a followed link must resolve to: http(s) with a host (an IP literal closed), then a port at most.
_FOLLOWABLE = re.compile(r"https?://(?:[^@/?#]*@)?(?:\[[^\]/?#]+\]|[^:/?#@\[\]]+)(?::\d*)?(?:[/?#]|\Z)",
                         re.IGNORECASE)
# What keeps a root-relative reference from being copied unchanged by the standard's parser (besides "//", a
# host when leading, and "/.", a dot segment): an escape ("%2e" is a dot too), "\\", a character it escapes, a
# fragment.
_unsafe_root_ref = re.compile(r"[^A-Za-z0-9\-._~!$&()*+,;=:@/?]").search


def resolve_link(base: str, ref: str) -> str | None:
    """A reference as a page writes it, made absolute against the page's ``base``; None when it is not an
    http(s) URL worth following (a script, a mail address, this page or a fragment of it, no host, invalid).

    Otherwise ``resolve(base, ref)``, the same string. A site's navigation repeats on every page, so results
    are cached by the base's directory (all a reference other than "", "?query" and "#fragment" depends on),
    and root-relative references are joined to the base's origin without parsing.
    """
    if "\t" in ref or "\n" in ref or "\r" in ref:
        ref = ref.translate(_TAB_NL)
    if ref and (ref[0] <= " " or ref[-1] <= " "):
        ref = ref.strip(_STRIP)
    if ref[:1] != "/":
        if ref[4:5] == ":" or ref[5:6] == ":":
            # "http:x" against an http page is the relative "x" (WHATWG): the same cases below, the same cache
            scheme = ref[:ref.index(":") + 1].lower()
            if scheme in ("http:", "https:") and base[:len(scheme)].lower() == scheme:
                ref = ref[len(scheme):]
        if not ref or ref[0] == "#":
            return None
        if ref[0] == "?":
            return _resolve_link(base, ref)
    elif "//" not in ref and "/." not in ref and not _unsafe_root_ref(ref):
        # Root-relative, nothing to resolve: the base's origin plus the reference (most links of a site).
        end = base.find("/", base.find("//") + 2)
        origin = _link_origin(base if end < 0 else base[:end])
        if origin is not None:
            return origin + ref
    if "\\" in base:
        return _resolve_link(base, ref)
    path_base = base.split("#", 1)[0].split("?", 1)[0]
    cut = path_base.rfind("/")
    if cut < path_base.find("//") + 2:          # no path at all: "http://host"
        return _resolve_link_cached(path_base + "/", ref)
    return _resolve_link_cached(path_base[:cut + 1], ref)


def link_joiner(base: str) -> Callable[[str], str | None]:
    """resolve_link with its base fixed, for the many references of one page: the same answers. The base's origin
    is found once, and whether a reference is plainly root-relative (joined as origin + reference) is remembered
    by the reference, as a site's navigation repeats on every page: such a link costs a dict lookup and a
    concatenation instead of resolve_link's checks."""
    end = base.find("/", base.find("//") + 2)
    try:
        origin = _link_origin(base if end < 0 else base[:end])
    except Exception:     # whatever resolve_link meets with this base, it meets on its own
        origin = None
    if origin is None:
        return functools.partial(resolve_link, base)
    plain = _PLAIN_ROOT_REFS

    def join(ref: str) -> str | None:
        known = plain.get(ref)
        if known is None:
            known = plain.keep(ref, _plain_root_ref(ref))
        return origin + ref if known else resolve_link(base, ref)
    return join


def _plain_root_ref(ref: str) -> bool:
    """Whether resolve_link joins ref to the base's origin unchanged (its fast path)."""
    return ref[:1] == "/" and "//" not in ref and "/." not in ref and not _unsafe_root_ref(ref)


_PLAIN_ROOT_REFS: Memo[str, bool] = Memo(10_000)


@functools.lru_cache(maxsize=1024)
def _link_origin(prefix: str) -> str | None:
    """scheme://[userinfo@]host[:port] of a base's prefix up to its path, as the parser serializes it; None
    when the prefix is more than that (a query or fragment without a path) or not an http(s) URL."""
    if "?" in prefix or "#" in prefix or _is_web_scheme(prefix) is not True:
        return None
    url = _parse_web(_web_text(prefix), None)
    if url is None or url.path != "/":
        return None
    return url.href()[:-1]


def _resolve_link(base: str, ref: str) -> str | None:
    if ref[:11].lower().startswith(_SKIPPED_SCHEMES):
        return None
    try:
        url = resolve(base, ref, strict=False)
    except InvalidURL:
        return None
    return url if _FOLLOWABLE.match(url) else None


_resolve_link_cached = functools.lru_cache(maxsize=50_000)(_resolve_link)


# -- normalisation (RFC 3986 6.2.2 and 6.2.3) --------------------------------------------------------------

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SUB_DELIMS = "!$&'()*+,;="
_PCHAR = re.escape("".join(sorted(_UNRESERVED)) + _SUB_DELIMS + ":@")
# One regex per component: a %XX escape, or a character the component may not hold (a lone "%" included).
_PATH_FIX = re.compile(rf"%[0-9A-Fa-f]{{2}}|[^{_PCHAR}/]")
_QUERY_FIX = re.compile(rf"%[0-9A-Fa-f]{{2}}|[^{_PCHAR}/?]")
_USERINFO_FIX = re.compile(rf"%[0-9A-Fa-f]{{2}}|[^{re.escape(''.join(sorted(_UNRESERVED)) + _SUB_DELIMS)}:]")
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443", "ftp": "21"}
_WEB_SCHEMES = frozenset({"http", "https"})
# WHATWG forbidden host code points, after percent-decoding the host.
_BAD_HOST = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")


def _fix_escape(m: re.Match[str]) -> str:
    s = m.group()
    if len(s) == 3:
        ch = chr(int(s[1:], 16))
        return ch if ch in _UNRESERVED else s.upper()
    return "".join(f"%{b:02X}" for b in s.encode("utf-8", "surrogatepass"))


def _canon(text: str, fixer: re.Pattern[str]) -> str:
    return fixer.sub(_fix_escape, text)


@dataclass(frozen=True)
class NormalizeOptions:
    """How far normalisation goes beyond RFC 3986.

    ``sort_query`` orders parameters by name (stable, so repeated names keep their order: some servers read
    them as lists). ``drop_params`` names tracking parameters to remove (``utm_source`` ...), matched after
    percent-encoding is made canonical. ``keep_fragment`` holds regexes searched in the normalised URL
    without its fragment; a match keeps the fragment (sites that name the resource there, such as Kugou
    song pages, ``#hash=...&album_id=...``).
    """

    sort_query: bool = False
    drop_params: frozenset[str] = field(default_factory=frozenset)
    keep_fragment: tuple[str, ...] = ()


DEFAULT = NormalizeOptions()


@functools.lru_cache(maxsize=64)
def _fragment_keeper(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{p})" for p in patterns))


def _normalize_host(host: str, url: str) -> str:
    if host.startswith("["):
        if not host.endswith("]"):
            raise InvalidURL(f"unterminated IP literal in {url!r}")
        literal = host[1:-1]
        if literal[:1] in "vV":
            return "[" + literal.lower() + "]"
        try:
            return "[" + ipaddress.IPv6Address(literal).compressed + "]"
        except ValueError:
            raise InvalidURL(f"bad IPv6 literal in {url!r}") from None
    if "%" in host:
        try:
            host = unquote(host, errors="strict")
        except UnicodeDecodeError:
            raise InvalidURL(f"host escapes are not UTF-8 in {url!r}") from None
    if host.isascii():
        host = host.lower()
    else:
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (UnicodeError, ValueError):
            try:
                # IDNA 2003 accepts some names IDNA 2008 refuses (symbols, emoji) that still resolve.
                host = host.encode("idna").decode("ascii").lower()
            except (UnicodeError, ValueError):
                raise InvalidURL(f"host is not a valid IDN in {url!r}") from None
    if _BAD_HOST.search(host):
        raise InvalidURL(f"forbidden character in host of {url!r}")
    return host


def _normalize_authority(scheme: str, authority: str, url: str) -> str:
    userinfo, at, hostport = authority.rpartition("@")
    if hostport.startswith("["):
        close = hostport.find("]")
        host, port = (hostport, "") if close < 0 else (hostport[:close + 1], hostport[close + 1:])
        if port and not port.startswith(":"):
            raise InvalidURL(f"junk after IP literal in {url!r}")
        port = port[1:]
    else:
        host, _, port = hostport.partition(":")
    host = _normalize_host(host, url)
    if scheme in _WEB_SCHEMES and not host:
        raise InvalidURL(f"no host in {url!r}")
    if port:
        if not port.isdigit() or not port.isascii() or int(port) > 65535:
            raise InvalidURL(f"bad port {port!r} in {url!r}")
        port = str(int(port))
        if _DEFAULT_PORTS.get(scheme) == port:
            port = ""
    out = host + ":" + port if port else host
    if at:
        out = _canon(userinfo, _USERINFO_FIX) + "@" + out
    return out


def _rewrite_query(query: str, opts: NormalizeOptions) -> str:
    params = [p for p in query.split("&") if p]
    if opts.drop_params:
        params = [p for p in params if p.partition("=")[0] not in opts.drop_params]
    if opts.sort_query:
        params.sort(key=lambda p: p.partition("=")[0])
    return "&".join(params)


def _web_key_host(host: str, url: str) -> str:
    """The host as keys hold it: a domain's trailing dots dropped (``host.`` is ``host`` to DNS: one site, one
    key, one politeness slot)."""
    if host.endswith("."):
        host = host.rstrip(".")
        if not host:
            raise InvalidURL(f"no host in {url!r}")
    return host


def _normalize_slow(url: str, opts: NormalizeOptions) -> str:
    text = _web_text(url)
    if _is_web_scheme(text):
        # The standard's parser first, so that a key is what a browser would fetch; user info is dropped (it
        # names no other resource, and would give one site many politeness slots).
        web = _parse_web(text, None)
        if web is None:
            raise InvalidURL(f"not a valid http(s) URL: {url!r}")
        scheme, path, query, fragment = web.scheme, web.path, web.query, web.fragment
        host = _web_key_host(web.host, url)
        authority: str | None = host + ":" + web.port if web.port else host
        path = remove_dot_segments(_canon(path, _PATH_FIX))
    else:
        raw_scheme, authority, path, query, fragment = _split(text)
        if raw_scheme is None:
            raise InvalidURL(f"not an absolute URL: {url!r}")
        scheme = raw_scheme.lower()
        if authority is not None:
            authority = _normalize_authority(scheme, authority, url)
        # Escapes first, so that "%2E%2E" is seen as the ".." it spells (RFC 3986 6.2.2.3).
        path = remove_dot_segments(_canon(path, _PATH_FIX))
        if authority is None and path.startswith("//"):
            # Without this the key would re-parse with "//..." as an authority (RFC 3986 5.3, last note).
            path = "/." + path
    if query is not None:
        query = _canon(query, _QUERY_FIX)
        if query and (opts.sort_query or opts.drop_params):
            query = _rewrite_query(query, opts)
        if not query:
            query = None
    head = _join(scheme, authority, path, query, None)
    if fragment:
        keeper = _fragment_keeper(opts.keep_fragment)
        if keeper is not None and keeper.search(head):
            fragment = _canon(fragment, _QUERY_FIX)
            if fragment:
                return head + "#" + fragment
    return head


# A URL this matches is already normal: a host as _FAST_HOST says, no user, a port only if it is not the
# scheme's default and is spelled without leading zeros (1 to 65535), a path and optional query made only of
# characters that need no escape, and escapes that must stay escapes. Possessive quantifiers keep a near miss
# from backtracking. A "/." anywhere sends the URL down the slow path (dot segments), which is rare enough to
# not be worth a sharper test. Ports matter: an address with one (a site on :8080, every loopback test site) was
# 18 times slower on the slow path, and the master and the worker both normalise every new link.
_P = r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]"
_Q = r"[A-Za-z0-9\-._~!$&()*+,;=:@/?]"
_PCT = r"%(?:[01][0-9A-F]|2[0-9A-CF]|3[A-F]|40|5[B-E]|60|7[BCDF]|[89A-F][0-9A-F])"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# The host is one the standard's parser keeps as it is and a key keeps too: a dotted-quad IPv4 address (0 to
# 255, no leading zero: one would make it octal), or a domain whose last label starts with a letter (so is not
# a number) and without a trailing dot. Punycode ("xn--") has to be checked: the callers send it down the slow
# path. Written to fail on a domain's first letter and never to backtrack inside an address.
_OCTET = r"(?:1[0-9]{0,2}+|2(?:[0-4][0-9]?+|5[0-5]?+|[6-9])?+|[3-9][0-9]?+|0)"
_FAST_HOST = rf"(?:(?:{_OCTET}\.){{3}}{_OCTET}|(?:[a-z0-9\-]++\.)*+[a-z][a-z0-9\-]*+)"
_ORIGIN = rf"(?:http://{_FAST_HOST}(?::(?!80/){_PORT})?|https://{_FAST_HOST}(?::(?!443/){_PORT})?)"
_FAST = re.compile(rf"{_ORIGIN}/(?:{_P}++|{_PCT})*+(?:\?(?:{_Q}++|{_PCT})++)?+")
_FAST_NO_QUERY = re.compile(rf"{_ORIGIN}/(?:{_P}++|{_PCT})*+")


def normalize(url: str, opts: NormalizeOptions = DEFAULT) -> str:
    """The canonical key of ``url``; raises ``InvalidURL`` when there is none."""
    fast = _FAST if not (opts.sort_query or opts.drop_params) else _FAST_NO_QUERY
    if fast.fullmatch(url) and "/." not in url and "xn--" not in url:
        return url
    return _normalize_slow(url, opts)


def normalize_many(urls: Iterable[str], opts: NormalizeOptions = DEFAULT) -> list[str | None]:
    """``normalize`` over a batch, with None in place of the invalid ones."""
    fast = (_FAST if not (opts.sort_query or opts.drop_params) else _FAST_NO_QUERY).fullmatch
    out: list[str | None] = []
    append = out.append
    for url in urls:
        if fast(url) and "/." not in url and "xn--" not in url:
            append(url)
            continue
        try:
            append(_normalize_slow(url, opts))
        except (InvalidURL, UnicodeError):
            append(None)
    return out


# -- hosts and origins --------------------------------------------------------------------------------------

# The authority's grammar, written once for every parser here: user info skipped, the host (an IP literal with
# its brackets) in one group, the port in the next, anything else up to the path ignored.
_AUTHORITY = r"//(?:[^@/?#]*@)?(\[[^\]/?#]*\]|[^:/?#]*)(?::(\d*))?[^/?#]*"
_SCHEME_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):" + _AUTHORITY)
_DEFAULT_PORT_NUMBERS = {"http": 80, "https": 443}


def host_of(url: str) -> str:
    """The lower-case host of a URL (IP literals keep their brackets, a domain loses its trailing dots, as
    keys do); '' when it has none."""
    m = _SCHEME_AUTHORITY.match(url)
    return m.group(2).lower().rstrip(".") if m is not None else ""


def host_port(url: str) -> tuple[str, int] | None:
    """(host, port) an http(s) URL connects to: the host lower case, without an IP literal's brackets or a
    trailing dot, the port made explicit; None for anything else."""
    m = _SCHEME_AUTHORITY.match(url)
    if m is None:
        return None
    default = _DEFAULT_PORT_NUMBERS.get(m.group(1).lower())
    host = m.group(2).lower().strip("[]").rstrip(".")
    port = int(m.group(3)) if m.group(3) else default
    if default is None or not host or port is None or port > 65535:
        return None
    return host, port


def host_url_of(url: str) -> str:
    """The origin of an http(s) URL, scheme://host[:port]: the key politeness and robots.txt rules are kept
    under. The WHATWG origin, except that a domain's trailing dots are dropped as keys drop them: no user
    info, host lower case (IDNA, IPv4 in dotted form), default port dropped, so ``http://a@host/``,
    ``http://b@host/`` and ``http://host./`` share one slot. A normalised URL (as every queued one is) is
    answered by one regex match: this runs for every URL the master queues. Another scheme, or a URL the
    parser refuses, gives its text up to the path as written."""
    m = _ORIGIN_KEY.match(url)
    if m is not None and "xn--" not in m.group():
        return m.group()
    start = url.find("://")
    if start < 0:
        raise InvalidURL(f"not an absolute URL: {url!r}")
    text = _web_text(url)
    if _is_web_scheme(text):
        web = _parse_web(text, None)
        if web is not None:
            host = web.host.rstrip(".") or web.host
            return f"{web.scheme}://{host}:{web.port}" if web.port else f"{web.scheme}://{host}"
    end = len(url)
    for sep in "/?#":
        i = url.find(sep, start + 3)
        if 0 <= i < end:
            end = i
    return url[:end]


_ORIGIN_KEY = re.compile(rf"(?:http://{_FAST_HOST}(?::(?!80(?![0-9])){_PORT})?"
                         rf"|https://{_FAST_HOST}(?::(?!443(?![0-9])){_PORT})?)(?=[/?#]|\Z)")


# -- discard rules (paper, section 3.2) --------------------------------------------------------------------

DISCARD_TOO_LONG = "too_long"
DISCARD_TOO_DEEP = "depth"
# How far past the depth limit a page's audio references (a playlist, a stream, the playlist a playlist names)
# are followed: resolving a page's audio is part of the page, but a site's chain of playlists must end.
AUDIO_REF_HOPS = 3
DISCARD_GENERATED = "generated_name"
DISCARD_QUERY = "too_many_params"
DISCARD_SCHEME = "scheme"
DISCARD_SCOPE = "out_of_scope"
DISCARD_DENIED = "denied"

# scheme, host and port (when there is an authority), path, query
_PARTS_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):(?:" + _AUTHORITY + r")?([^?#]*)(?:\?([^#]*))?")


@dataclass(frozen=True)
class UrlPolicy:
    """Which normalised URLs the crawl keeps. A limit of None switches its rule off.

    - ``max_length``: characters in the normalised URL (the paper: 256).
    - ``max_depth``: link distance from the seed (the paper: 5); a seed has depth 0.
    - ``max_query_params``: non-empty ``&``-separated query parts.
    - generated pages: the file name (last path segment, percent-decoded, without its extension) holds at
      least ``min_separators`` characters of ``separators`` and they make up more than
      ``max_separator_ratio`` of it. ``list_1_0_0_0_2.html`` (4 of 12) is generated; ``the-long-song.mp3``
      (2 of 13) and ``a_b.html`` (1 separator) are not. 0.3 with 3 separators rejects the ID-soup names
      of generated listings while keeping hyphenated slugs and dates.
    - ``separators``: ``_ 、 = - & , ; ~`` (the ideographic comma ``、`` is common in Chinese generated names).
    - scope: ``schemes``; ``allowed_hosts`` (empty = any; ``*.example.com`` or ``.example.com`` allows the
      domain and every subdomain; the port is part of the scope: ``example.com`` is the scheme's default port
      only, ``example.com:8080`` that port, ``example.com:*`` any); ``allow_patterns`` (regexes searched in the URL; if any are given one must
      match); ``deny_patterns`` (a match discards).

    Checks run cheapest first, and the first failing rule is the reason reported.
    """

    max_length: int | None = 256
    max_depth: int | None = 5
    max_query_params: int | None = 10
    max_separator_ratio: float | None = 0.3
    min_separators: int = 3
    separators: str = "_、=-&,;~"
    schemes: tuple[str, ...] = ("http", "https")
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    allow_patterns: tuple[str, ...] = ()
    deny_patterns: tuple[str, ...] = ()
    # Derived in __post_init__: compiled once per policy, and the policy is built once per master.
    _exact_hosts: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _host_suffixes: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False, default=())
    _allow: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False, default=())
    _deny: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False, default=())
    _schemes: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _separator_re: re.Pattern[str] = field(init=False, repr=False, compare=False, default=re.compile("(?!)"))

    def __post_init__(self) -> None:
        exact: set[str] = set()
        suffixes: list[tuple[str, str]] = []
        for h in self.allowed_hosts:
            h = h.lower()
            port = ""
            if h.rfind(":") > h.rfind("]"):
                h, port = h.rsplit(":", 1)
            if h.startswith("*."):
                h = h[1:]
            if h.startswith("."):
                exact.add(f"{h[1:]}:{port}" if port else h[1:])
                suffixes.append((h, port))
            else:
                exact.add(f"{h}:{port}" if port else h)
        object.__setattr__(self, "_exact_hosts", frozenset(exact))
        object.__setattr__(self, "_host_suffixes", tuple(suffixes))
        object.__setattr__(self, "_allow", tuple(re.compile(p) for p in self.allow_patterns))
        object.__setattr__(self, "_deny", tuple(re.compile(p) for p in self.deny_patterns))
        object.__setattr__(self, "_schemes", frozenset(s.lower() for s in self.schemes))
        object.__setattr__(self, "_separator_re",
                           re.compile("[" + re.escape(self.separators) + "]" if self.separators else "(?!)"))

    def host_allowed(self, host: str, port: str = "") -> bool:
        """Whether host (and port: '' for the scheme's default) is in scope."""
        if not self.allowed_hosts:
            return True
        host = host.lower()
        exact = self._exact_hosts
        if (f"{host}:{port}" if port else host) in exact or (port and f"{host}:*" in exact):
            return True
        return any(host.endswith(suffix) and (p == port or p == "*") for suffix, p in self._host_suffixes)

    def is_generated_name(self, path: str) -> bool:
        """Whether the last segment of ``path`` looks like a dynamically generated page name."""
        if self.max_separator_ratio is None:
            return False
        name = path[path.rfind("/") + 1:]
        if "%" in name:
            name = unquote(name)
        dot = name.rfind(".")
        if dot > 0:
            name = name[:dot]
        if not name:
            return False
        count = len(self._separator_re.findall(name))
        return count >= self.min_separators and count / len(name) > self.max_separator_ratio

    def check(self, url: str, depth: int) -> str | None:
        """None to keep the normalised ``url`` found at ``depth``, else the reason to discard it."""
        m = _PARTS_RE.match(url)
        if m is None or m.group(1).lower() not in self._schemes:
            return DISCARD_SCHEME
        if self.max_length is not None and len(url) > self.max_length:
            return DISCARD_TOO_LONG
        if self.allowed_hosts and not self.host_allowed(m.group(2) or "", m.group(3) or ""):
            return DISCARD_SCOPE
        if self._allow and not any(p.search(url) for p in self._allow):
            return DISCARD_SCOPE
        if any(p.search(url) for p in self._deny):
            return DISCARD_DENIED
        if self.max_depth is not None and depth > self.max_depth:
            return DISCARD_TOO_DEEP
        query = m.group(5)
        # The "&" count bounds the parameter count from above; only a query over the limit is split.
        if (self.max_query_params is not None and query and query.count("&") >= self.max_query_params
                and sum(1 for p in query.split("&") if p) > self.max_query_params):
            return DISCARD_QUERY
        if self.is_generated_name(m.group(4)):
            return DISCARD_GENERATED
        return None
