"""URL resolution (RFC 3986 5.4 read the WHATWG way), normalisation, and the discard rules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawler.web import urls
from crawler.web.urls import (
    DISCARD_DENIED,
    DISCARD_GENERATED,
    DISCARD_QUERY,
    DISCARD_SCHEME,
    DISCARD_SCOPE,
    DISCARD_TOO_DEEP,
    DISCARD_TOO_LONG,
    InvalidURL,
    NormalizeOptions,
    UrlPolicy,
    host_of,
    host_port,
    host_url_of,
    normalize,
    normalize_many,
    resolve,
    resolve_link,
)

RFC_BASE = "http://a/b/c/d;p?q"

# RFC 3986 section 5.4.1, normal examples.
NORMAL = [
    ("g:h", "g:h"), ("g", "http://a/b/c/g"), ("./g", "http://a/b/c/g"), ("g/", "http://a/b/c/g/"),
    ("/g", "http://a/g"), ("//g", "http://g/"), ("?y", "http://a/b/c/d;p?y"), ("g?y", "http://a/b/c/g?y"),
    ("#s", "http://a/b/c/d;p?q#s"), ("g#s", "http://a/b/c/g#s"), ("g?y#s", "http://a/b/c/g?y#s"),
    (";x", "http://a/b/c/;x"), ("g;x", "http://a/b/c/g;x"), ("g;x?y#s", "http://a/b/c/g;x?y#s"),
    ("", "http://a/b/c/d;p?q"), (".", "http://a/b/c/"), ("./", "http://a/b/c/"), ("..", "http://a/b/"),
    ("../", "http://a/b/"), ("../g", "http://a/b/g"), ("../..", "http://a/"), ("../../", "http://a/"),
    ("../../g", "http://a/g"),
]

# RFC 3986 section 5.4.2, abnormal examples; the last one as browsers read it (the RFC's non-strict reading).
ABNORMAL = [
    ("../../../g", "http://a/g"), ("../../../../g", "http://a/g"),
    ("/./g", "http://a/g"), ("/../g", "http://a/g"), ("g.", "http://a/b/c/g."), (".g", "http://a/b/c/.g"),
    ("g..", "http://a/b/c/g.."), ("..g", "http://a/b/c/..g"),
    ("./../g", "http://a/b/g"), ("./g/.", "http://a/b/c/g/"), ("g/./h", "http://a/b/c/g/h"),
    ("g/../h", "http://a/b/c/h"), ("g;x=1/./y", "http://a/b/c/g;x=1/y"), ("g;x=1/../y", "http://a/b/c/y"),
    ("g?y/./x", "http://a/b/c/g?y/./x"), ("g?y/../x", "http://a/b/c/g?y/../x"),
    ("g#s/./x", "http://a/b/c/g#s/./x"), ("g#s/../x", "http://a/b/c/g#s/../x"),
    ("http:g", "http://a/b/c/g"),
]


@pytest.mark.parametrize(("ref", "expected"), NORMAL + ABNORMAL)
def test_resolve_rfc3986_examples(ref: str, expected: str) -> None:
    assert resolve(RFC_BASE, ref) == expected


@settings(derandomize=True, max_examples=500)
@given(st.lists(st.sampled_from(["a", "b.c", ".", "..", "", "..x", ".y", "%2E"]), max_size=8))
def test_segment_dot_removal_matches_the_rfc_algorithm(segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    assert urls.remove_dot_segments(path) == urls._remove_dot_segments_rfc(path)


def test_resolve_edges() -> None:
    assert resolve("http://a", "g") == "http://a/g"             # merge with an empty base path
    assert resolve("http://a/b#frag", "") == "http://a/b"       # the base's fragment never carries over
    assert resolve("http://a/b/c", "  ../d\n") == "http://a/d"  # attribute whitespace
    assert resolve("http://a/b", "HTTPS://X/./y") == "https://x/y"  # the WHATWG serialization, nothing more
    assert resolve("http://a/b", "HTTP://U@X:80/%7e?q#f") == "http://U@x/%7e?q#f"
    assert resolve("foo:a/b/c", "../d/./e") == "foo:a/d/e"    # rootless base: the literal algorithm
    assert resolve("foo:a/b/c", "foo:g") == "foo:g"
    assert resolve("foo:a/b/c", "foo:g", strict=False) == "foo:a/b/g"
    with pytest.raises(InvalidURL):
        resolve("/relative/base", "g")


PAGE = "http://site.example/music/list/page.html?p=2"


@pytest.mark.parametrize(("ref", "expected"), [
    ("audio\\a.mp3", "http://site.example/music/list/audio/a.mp3"),     # every browser reads "\\" as "/"
    ("..\\page.html", "http://site.example/music/page.html"),
    ("\\d\\final", "http://site.example/d/final"),
    ("\\\\cdn.example\\a.mp3", "http://cdn.example/a.mp3"),
    ("http:", None), ("http:#f", None), ("", None), ("#f", None),        # this page: nothing to follow
    ("http:?q=2", "http://site.example/music/list/page.html?q=2"),
    ("HTTP:x.html", "http://site.example/music/list/x.html"),
    ("https:x.html", "https://x.html/"),                                  # another scheme: its host
    ("/a/%2e%2E/b", "http://site.example/b"),
    ("/a b", "http://site.example/a%20b"),
    ("http://u@site.example./x", "http://u@site.example./x"),            # normalize() drops both
])
def test_resolve_link_is_resolve(ref: str, expected: str | None) -> None:
    assert resolve_link(PAGE, ref) == expected
    if expected is not None:
        assert resolve(PAGE, ref) == expected
    # The cache is keyed by the page's directory: a sibling page asking the same must get its own answer.
    sibling = "http://site.example/music/list/other.html"
    got = resolve_link(sibling, ref)
    assert got is None if expected is None else got == resolve(sibling, ref)


def test_redirect_location_is_read_as_a_browser_reads_it() -> None:
    # The worker joins a Location with resolve(): the same answer as a link.
    assert resolve("http://site.example/a/b", "/d\\final") == "http://site.example/d/final"
    location = resolve("http://site.example/a/b", "//x@Other.example.:80\\p")
    assert location == "http://x@other.example./p" and normalize(location) == "http://other.example/p"


@pytest.mark.parametrize(("raw", "expected"), [
    ("HTTP://Example.COM", "http://example.com/"),
    ("http://example.com:80/a", "http://example.com/a"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("https://example.com:0443/a", "https://example.com/a"),
    ("http://example.com:8080/a", "http://example.com:8080/a"),
    ("http://example.com:/a", "http://example.com/a"),
    ("http://example.com/%7Euser/%61b%2f%3a", "http://example.com/~user/ab%2F%3A"),
    ("http://example.com/a/./b/../c/%2E%2E/d", "http://example.com/a/d"),
    ("http://example.com/a?", "http://example.com/a"),
    ("http://example.com/a#top", "http://example.com/a"),
    ("http://example.com/歌曲 1.mp3?q=周杰伦", "http://example.com/%E6%AD%8C%E6%9B%B2%201.mp3?q=%E5%91%A8%E6%9D%B0%E4%BC%A6"),
    ("http://example.com/100%", "http://example.com/100%25"),
    ("http://example.com/a%zzb", "http://example.com/a%25zzb"),
    ("http://münchen.DE/", "http://xn--mnchen-3ya.de/"),
    ("http://xn--MNCHEN-3ya.de/", "http://xn--mnchen-3ya.de/"),
    ("http://[2001:DB8:0:0::1]:80/", "http://[2001:db8::1]/"),
    ("http://User:P%61ss@Example.com/", "http://example.com/"),     # user info names no other resource
    ("http://example.com./a", "http://example.com/a"),              # nor does the root's dot
    ("http://0x7F.1/", "http://127.0.0.1/"),                        # the WHATWG IPv4 parser
    ("http:g", "http://g/"), ("http:///a", "http://a/"),             # special-scheme slashes, as browsers
    ("http://h/?'", "http://h/?%27"),
    ("  http://example.com/a\tb\n  ", "http://example.com/ab"),
    ("http://example.com/a\\b", "http://example.com/a/b"),
    ("http:\\\\example.com\\a\\..\\b", "http://example.com/b"),
    ("http://example.com/?b=2&a=1&a=0", "http://example.com/?b=2&a=1&a=0"),
    ("mailto:Someone@Example.com", "mailto:Someone@Example.com"),
    ("foo:/.//x", "foo:/.//x"),
])
def test_normalize_examples(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize("raw", [
    "example.com/a", "/a/b", "http://", "http:", "http://u@/a", "http://example.com:99999/",
    "http://256.0.0.1/", "http://./", "http://xn--/",
    "http://example.com:8o/", "http://[::1/", "http://[zz::1]/", "http://exa mple.com/", "http://a<b/",
    "http://%FF.com/",
])
def test_normalize_rejects(raw: str) -> None:
    with pytest.raises(InvalidURL):
        normalize(raw)


def test_options_sort_and_drop() -> None:
    opts = NormalizeOptions(sort_query=True, drop_params=frozenset({"utm_source", "utm_medium"}))
    got = normalize("http://x.com/p?z=1&utm_source=mail&a=2&utm%5Fmedium=x&a=1&&m", opts)
    assert got == "http://x.com/p?a=2&a=1&m&z=1"  # stable: the two a's keep their order
    assert normalize("http://x.com/p?utm_source=a", opts) == "http://x.com/p"
    assert normalize("http://x.com/p?b=1&a=2") == "http://x.com/p?b=1&a=2"  # default keeps the order


KUGOU = NormalizeOptions(keep_fragment=(r"^https?://(www\.)?kugou\.com/song/",))


def test_kugou_song_keeps_fragment() -> None:
    song = "https://www.kugou.com/song/#hash=5F3E2A&album_id=966846"
    assert normalize(song, KUGOU) == song
    assert normalize("HTTPS://WWW.KUGOU.COM:443/song/#hash=5F3E2A&album_id=966846", KUGOU) == song
    assert normalize(song) == "https://www.kugou.com/song/"
    assert normalize("https://www.kugou.com/yy/html/rank.html#top", KUGOU) == "https://www.kugou.com/yy/html/rank.html"
    assert normalize_many([song], KUGOU) == [song]


def test_normalize_many_marks_invalid() -> None:
    got = normalize_many(["http://a.com/x", "nonsense", "HTTP://B.com", "http://[::1"])
    assert got == ["http://a.com/x", None, "http://b.com/", None]


def test_host_of() -> None:
    assert host_of("http://u:p@example.com:8080/a") == "example.com"
    assert host_of("https://[2001:db8::1]/") == "[2001:db8::1]"
    assert host_of("http://Example.com/") == "example.com"
    assert host_of("http://Example.com./") == "example.com"
    assert host_of("mailto:x@y") == "" and host_of("/relative") == ""


def test_host_port_is_what_a_connection_goes_to() -> None:
    assert host_port("https://u@Example.COM./a") == ("example.com", 443)
    assert host_port("http://[::1]:8080/") == ("::1", 8080) and host_port("http://h:/") == ("h", 80)
    assert host_port("ftp://h/") is None and host_port("http://h:99999/") is None and host_port("http:///x") is None


def test_host_url_of_is_the_origin() -> None:
    assert host_url_of("https://u@h.example:8443/a?b#c") == "https://h.example:8443"
    assert host_url_of("http://h.example?x") == "http://h.example"
    assert host_url_of("HTTP://a:b@H.Example.:80") == "http://h.example"
    assert host_url_of("https://h.example:443/") == "https://h.example"
    assert host_url_of("http://0x7f.1:8080/") == "http://127.0.0.1:8080"
    assert host_url_of("ftp://u@h/a") == "ftp://u@h"    # not a web URL: as written
    with pytest.raises(InvalidURL):
        host_url_of("/relative")


# -- properties ----------------------------------------------------------------------------------------

_HOSTS = st.sampled_from(["example.com", "Example.COM", "a.b-c.org", "127.0.0.1", "[::1]", "xn--mnchen-3ya.de",
                          "münchen.de", "例子.测试", "%65xample.com", "user@host.net", "host.net.",
                          "0x7F.1", "010.1.1.1", "1.2.3", "255.255.255.255", "256.1.1.1", "a.09", "xn--n3h.net"])
_CHARS = st.sampled_from(list("aZ09-._~!$&'()*+,;=:@/%?# é中\\[]|")
                         + ["%2e", "%2E", "%2F", "%7e", "%7E", "%5F", "%41", "%e4%b8%ad", "..", "./", "../", "%zz"])
_PIECE = st.lists(_CHARS, max_size=20).map("".join)


@st.composite
def raw_urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "hTtPs", "ftp", "foo"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080", ":", ":0080", ":0", ":7", ":65535", ":65536", ":99999",
                                 ":080", ":4430", ":8O"]))
    return f"{scheme}://{draw(_HOSTS)}{port}{draw(_PIECE)}"


_OPTIONS = st.sampled_from([urls.DEFAULT, NormalizeOptions(sort_query=True),
                            NormalizeOptions(drop_params=frozenset({"a", "utm_source"}), sort_query=True), KUGOU,
                            NormalizeOptions(keep_fragment=(r"example",))])


@settings(derandomize=True, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(raw_urls(), _OPTIONS)
def test_normalize_is_idempotent(raw: str, opts: NormalizeOptions) -> None:
    try:
        once = normalize(raw, opts)
    except InvalidURL:
        return
    assert normalize(once, opts) == once
    assert normalize_many([raw, once], opts) == [once, once]


@settings(derandomize=True, max_examples=300)
@given(raw_urls(), _OPTIONS)
def test_fast_path_agrees_with_full_normalisation(raw: str, opts: NormalizeOptions) -> None:
    try:
        full = urls._normalize_slow(raw, opts)
    except InvalidURL:
        full = None
    try:
        assert normalize(raw, opts) == full
    except InvalidURL:
        assert full is None
    if full is not None:
        assert urls._normalize_slow(full, opts) == full


UNRESERVED = frozenset("abcXYZ019-._~")
_SEGMENT = st.text(alphabet="abcXYZ019-._~!$'()*+,;=:@中é ", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..") and not s.endswith(" "))  # a trailing space ends the URL itself


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, str]:
    """A URL and another spelling of it: case, default port, escapes, dot segments, fragment."""
    https = draw(st.booleans())
    host = draw(st.sampled_from(["example.com", "www.music.cn", "10.0.0.1"]))
    segments = draw(st.lists(_SEGMENT, min_size=0, max_size=4))
    query = draw(st.one_of(st.none(), st.text(alphabet="ab=&1~中", max_size=8)))
    scheme = "https" if https else "http"
    plain = f"{scheme}://{host}/" + "/".join(segments) + (f"?{query}" if query is not None else "")

    def flip_case(s: str) -> str:
        return "".join(c.upper() if draw(st.booleans()) else c for c in s)

    def escape(s: str) -> str:
        # Unreserved characters may be written as escapes, in either hex case.
        return "".join(flip_case(f"%{ord(c):02x}") if c in UNRESERVED and draw(st.booleans()) else c for c in s)

    path_parts = []
    for seg in segments:
        if draw(st.booleans()):
            path_parts.append(".")
        if draw(st.booleans()):
            path_parts += ["junk", ".."]
        path_parts.append(escape(seg))
    port = draw(st.sampled_from(["", ":443" if https else ":80"]))
    other = (f"{flip_case(scheme)}://{flip_case(host)}{port}/" + "/".join(path_parts)
             + (f"?{escape(query)}" if query is not None else "")
             + draw(st.sampled_from(["", "#", "#frag", "#a/../b"])))
    return plain, other


@settings(derandomize=True, max_examples=300)
@given(spellings())
def test_equivalent_spellings_give_one_key(pair: tuple[str, str]) -> None:
    plain, other = pair
    assert normalize(other) == normalize(plain)


# -- policy --------------------------------------------------------------------------------------------

def test_policy_reasons() -> None:
    p = UrlPolicy(allowed_hosts=frozenset({"*.music.cn", "radio.org"}), deny_patterns=(r"/logout",))
    assert p.check("http://www.music.cn/song/1.html", 2) is None
    assert p.check("http://music.cn/", 0) is None
    assert p.check("https://radio.org/a", 5) is None
    assert p.check("ftp://www.music.cn/a.mp3", 1) == DISCARD_SCHEME
    assert p.check("javascript:void(0)", 1) == DISCARD_SCHEME
    assert p.check("http://www.music.cn/" + "a" * 300, 1) == DISCARD_TOO_LONG
    assert p.check("http://sub.radio.org/a", 1) == DISCARD_SCOPE
    assert p.check("http://evilmusic.cn/a", 1) == DISCARD_SCOPE
    assert p.check("http://www.music.cn/logout", 1) == DISCARD_DENIED
    assert p.check("http://www.music.cn/a", 6) == DISCARD_TOO_DEEP
    many = "&".join(f"p{i}=1" for i in range(11))
    assert p.check(f"http://www.music.cn/a?{many}", 1) == DISCARD_QUERY
    assert p.check("http://www.music.cn/a?" + "&".join(f"p{i}=1" for i in range(10)), 1) is None
    assert p.check("http://www.music.cn/a?a=1" + "&" * 20 + "b=2", 1) is None  # empty parts are not params
    assert p.check("http://www.music.cn/list_1_0_0_0_2.html", 1) == DISCARD_GENERATED


def test_policy_allow_patterns_and_dot_form() -> None:
    p = UrlPolicy(allowed_hosts=frozenset({".Example.com"}), allow_patterns=(r"/song/", r"/album/"))
    assert p.check("http://example.com/song/1", 0) is None
    assert p.check("http://a.b.example.com/album/1", 0) is None
    assert p.check("http://example.com/news/1", 0) == DISCARD_SCOPE


def test_policy_rules_can_be_switched_off() -> None:
    p = UrlPolicy(max_length=None, max_depth=None, max_query_params=None, max_separator_ratio=None,
                  schemes=("http", "https", "ftp"))
    many = "&".join(f"p{i}=1" for i in range(50))
    assert p.check("ftp://x.com/" + "a_b_c_d_" * 40 + f"?{many}", 99) is None


@pytest.mark.parametrize(("path", "generated"), [
    ("/list_1_0_0_0_2.html", True),
    ("/a=1&b=2&c=3", True),
    ("/%E5%88%97%E8%A1%A8%E3%80%81%E3%80%81%E3%80%81%E3%80%81.html", True),  # 列表、、、、
    ("/the-long-song.mp3", False),
    ("/a_b.html", False),                     # one separator is a name, not soup
    ("/2024-05-01_news.html", False),
    ("/dir_1_2_3_4/plain.html", False),       # only the file name counts
    ("/", False),
])
def test_generated_names(path: str, generated: bool) -> None:
    assert UrlPolicy().is_generated_name(path) is generated
    reason = UrlPolicy().check("http://x.com" + path, 1)
    assert (reason == DISCARD_GENERATED) is generated


def test_scope_includes_the_port() -> None:
    p = UrlPolicy(allowed_hosts=frozenset({"site.example", "127.0.0.1:8080", "*.cdn.example:*"}))
    assert p.check("http://site.example/a", 0) is None
    assert p.check("https://site.example/a", 0) is None
    assert p.check("http://site.example:8081/a", 0) == DISCARD_SCOPE     # the host's other ports are not its site
    assert p.check("http://127.0.0.1:8080/a", 0) is None
    assert p.check("http://127.0.0.1:6379/a", 0) == DISCARD_SCOPE
    assert p.check("http://127.0.0.1/a", 0) == DISCARD_SCOPE
    assert p.check("http://a.cdn.example:9000/x", 0) is None
    assert p.check("http://user@127.0.0.1:8080/a", 0) is None
