"""The records made on the fast path are the records the plain per-header code made: byte for byte once
inflated, on varied and hostile input (the record ids aside, which are random; here they are fixed).

The reference below is the earlier implementation, kept as the oracle: a header cleaned one by one, a record
compressed part by part, base32 by table lookups, ids from uuid.UUID.
"""

import base64
import hashlib
import os
import re
import uuid
import zlib
from collections.abc import Sequence
from http import HTTPStatus

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crawler.archive import Exchange
from crawler.archive import records
from crawler.archive.records import Maker, parse_member

# ------------------------------------------------------------------------------------------- the reference
_WIRE_HEADERS = frozenset((b"content-encoding", b"transfer-encoding", b"content-length"))
_STATUS_LINES = {s.value: f"{s.value} {s.phrase}".encode() for s in HTTPStatus}
_CONTROLS = bytes(range(32)) + b"\x7f"
_NAME_DROP = _CONTROLS + b" :"
_CRLF_RUN = re.compile(rb"[\r\n]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_VALUE_CONTROLS = bytes(c for c in range(32) if c != 9) + b"\x7f"
_B32 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = [bytes((_B32[i >> 5], _B32[i & 31])) for i in range(1024)]


def ref_b32(digest: bytes) -> bytes:
    n = int.from_bytes(digest, "big")
    return b"".join([_B32_PAIRS[(n >> shift) & 1023] for shift in range(150, -1, -10)])


def ref_token(s: str) -> bytes:
    return s.encode("ascii", "replace").translate(None, _NAME_DROP)


def ref_name(name: bytes) -> bytes:
    return name.translate(None, _NAME_DROP) or b"X-Empty"


def ref_value(value: bytes) -> bytes:
    return _CRLF_RUN.sub(b" ", value).translate(None, _VALUE_CONTROLS)


def ref_uri(url: str) -> bytes:
    b = url.encode("utf-8", "surrogatepass").translate(None, _CONTROLS)
    return b.replace(b" ", b"%20") if b" " in b else b


def ref_response_head(ex: Exchange, apart: bool) -> bytes:
    lines = [b"HTTP/", ref_token(ex.http_version) or b"1.1", b" ",
             _STATUS_LINES.get(ex.status) or f"{ex.status} ".encode(), b"\r\n"]
    for name, value in ex.response_headers:
        name = ref_name(name)
        if _BAD_VALUE.search(value):
            value = ref_value(value)
        if ex.decoded and name.lower() in _WIRE_HEADERS:
            lines += [b"X-Archive-Orig-", name, b": ", value, b"\r\n"]
        else:
            lines += [name, b": ", value, b"\r\n"]
    length = ex.payload_size if apart else len(ex.body)
    if ex.decoded and length >= 0:
        lines += [b"Content-Length: ", str(length).encode(), b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


def ref_request_head(ex: Exchange) -> bytes:
    lines = [ref_token(ex.method) or b"GET", b" ", ref_uri(records.request_target(ex.url)), b" HTTP/",
             ref_token(ex.http_version) or b"1.1", b"\r\n"]
    for name, value in ex.request_headers:
        if _BAD_VALUE.search(value):
            value = ref_value(value)
        lines += [ref_name(name), b": ", value, b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


def ref_record(kind: bytes, record_id: bytes, date: bytes, target: bytes | None, extra: list[bytes],
               content_type: bytes, block: Sequence[bytes]) -> bytes:
    size = sum(map(len, block))
    head = [b"WARC/1.1\r\nWARC-Type: ", kind, b"\r\nWARC-Record-ID: ", record_id, b"\r\nWARC-Date: ", date, b"\r\n"]
    if target is not None:
        head += [b"WARC-Target-URI: ", target, b"\r\n"]
    head += [*extra, b"Content-Type: ", content_type, b"\r\nContent-Length: ", str(size).encode(), b"\r\n\r\n"]
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [z.compress(b"".join(head))]
    parts += [z.compress(b) for b in block if b]
    parts += [z.compress(b"\r\n\r\n"), z.flush()]
    return b"".join(parts)


def ref_common(role: str, page: str) -> list[bytes]:
    out = [b"WARC-Crawler-Role: ", ref_token(role), b"\r\n"]
    if page:
        out += [b"WARC-Crawler-Page: ", ref_uri(page), b"\r\n"]
    return out


def ref_exchange(ex: Exchange, date: bytes, ids: list[bytes]) -> list[bytes]:
    """The response (or revisit) and request records of ``ex``, inflated."""
    target = ref_uri(ex.url)
    response_id = ids[0]
    common = ref_common(ex.role, ex.page)
    apart = not ex.body and ex.payload_digest.startswith("sha256:")
    head = ref_response_head(ex, apart)
    if apart:
        kind = b"revisit"
        block_digest = ref_b32(hashlib.sha1(head).digest())
        payload_digest = b"sha256:" + base64.b32encode(bytes.fromhex(ex.payload_digest[7:]))
        extra = [b"WARC-Profile: ", records.REVISIT_PROFILE, b"\r\n"]
        if ex.payload_size >= 0:
            extra += [b"WARC-Crawler-Payload-Length: ", str(ex.payload_size).encode(), b"\r\n"]
        block: tuple[bytes, ...] = (head,)
    else:
        kind = b"response"
        if ex.payload_digest.startswith("sha256:"):
            payload_digest = b"sha256:" + base64.b32encode(hashlib.sha256(ex.body).digest())
        else:
            payload_digest = b"sha1:" + ref_b32(hashlib.sha1(ex.body).digest())
        block_digest = ref_b32(hashlib.sha1(head + ex.body).digest())
        extra = []
        block = (head, ex.body)
    if ex.truncated:
        extra += [b"WARC-Truncated: ", ref_token(ex.truncated), b"\r\n"]
    response = ref_record(kind, response_id, date, target,
                          [*extra, *common, b"WARC-Block-Digest: sha1:", block_digest,
                           b"\r\nWARC-Payload-Digest: ", payload_digest, b"\r\n"],
                          b"application/http;msgtype=response", block)
    request_head = ref_request_head(ex)
    request_payload = ref_b32(hashlib.sha1(ex.request_body).digest())
    request = ref_record(b"request", ids[1], date, target,
                         [b"WARC-Concurrent-To: ", response_id, b"\r\n", *common,
                          b"WARC-Block-Digest: sha1:", ref_b32(hashlib.sha1(request_head + ex.request_body).digest()),
                          b"\r\nWARC-Payload-Digest: sha1:", request_payload, b"\r\n"],
                         b"application/http;msgtype=request", (request_head, ex.request_body))
    return [zlib.decompress(response, 31), zlib.decompress(request, 31)]


# ------------------------------------------------------------------------------------------- the input
# Header sets a joined block could misread: a value's CRLF and "x: y", a name's ": ", CR and LF apart.
_TRICKY_HEADERS = [((b"Content-Length", b"\r\n!: "),), ((b"a: b", b"c"),), ((b"X: y\r\nA", b"b"),),
                   ((b"A", b"x\r"), (b"\nB", b"y")), ((b"A", b"v\r\n"), (b"B", b"w")), ((b"A:", b"b"),),
                   ((b"", b""),), ((b"Content-Length", b"5"), (b"X", b"a\tb")), ((b"A\tB", b"c"),), ((b"A", b"\x7f"),)]
_NAMES = [b"Content-Length", b"content-encoding", b"Transfer-Encoding", b"CONTENT-LENGTH", b"Content-Type",
          b"Set-Cookie", b"Date", b"X-Content-Length", b"Content-Length-X", b"Host", b"Referer"]
_BYTES = st.binary(max_size=40) | st.sampled_from([b"", b"a:b", b"a b", b"\r\n", b"\t", b"x\x00y", b"\x7f",
                                                    b"v\r\nContent-Length: 5", b"\xff\xfe", b"caf\xc3\xa9"])
_NAME = st.sampled_from(_NAMES) | _BYTES
_VALUE = st.sampled_from([b"4400", b"gzip", b"text/html; charset=utf-8", b"Wed, 02 Dec 2026 13:00:00 GMT",
                          b"a\tb", b""]) | _BYTES
_HEADERS = st.lists(st.tuples(_NAME, _VALUE), max_size=12).map(tuple) | st.sampled_from(_TRICKY_HEADERS)
_TEXT = st.text(max_size=40) | st.sampled_from(["1.1", "1.0", "2", "GET", "POST", "page", "audio", "length", ""])
_URL = st.sampled_from(["http://site.test/a?b=1#f", "https://x.test", "http://h.test/ a\r\nb", "ftp:/x",
                        "http://[::1]:80/\udcff/é"]) | st.text(max_size=60)


@st.composite
def exchanges(draw: st.DrawFn) -> Exchange:
    apart = draw(st.booleans())
    body = b"" if apart else draw(st.binary(max_size=3000) | st.sampled_from([b"", b"<html></html>"]))
    payload_digest = ""
    if apart or draw(st.booleans()):
        payload_digest = "sha256:" + hashlib.sha256(draw(st.binary(max_size=8))).hexdigest()
    return Exchange(role=draw(_TEXT), method=draw(_TEXT), url=draw(_URL), request_headers=draw(_HEADERS),
                    status=draw(st.sampled_from([200, 204, 304, 404, 999, 0, 599])),
                    response_headers=draw(_HEADERS), body=body, started=1_790_000_000.0 + draw(st.integers(0, 9)),
                    page=draw(st.sampled_from(["", "http://site.test/p"]) | _URL),
                    request_body=draw(st.sampled_from([b"", b"a=1&b=2"])), http_version=draw(_TEXT),
                    decoded=draw(st.booleans()), truncated=draw(st.sampled_from(["", "length", "ti\r\nme"])),
                    payload_digest=payload_digest, payload_size=draw(st.integers(-1, 10**6)))


def _fixed_ids(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    given_ids = [b"<urn:uuid:00000000-0000-4000-8000-000000000001>",
                 b"<urn:uuid:00000000-0000-4000-8000-000000000002>"]
    monkeypatch.setattr(records, "_record_ids", lambda count: given_ids[:count])
    return given_ids


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ex=exchanges(), one_shot=st.sampled_from([records.ONE_SHOT_BYTES, 0]))
@example(ex=Exchange(role="page", method="GET", url="http://a.test/", request_headers=_TRICKY_HEADERS[2], status=200,
                     response_headers=_TRICKY_HEADERS[0], body=b"x", started=1_790_000_000.0), one_shot=0)
def test_an_exchange_is_the_reference_records(monkeypatch, ex, one_shot):
    ids = _fixed_ids(monkeypatch)
    monkeypatch.setattr(records, "ONE_SHOT_BYTES", one_shot)    # 0: every record compressed part by part
    maker = Maker()
    response, request = maker.exchange(ex)
    assert [zlib.decompress(response.member, 31), zlib.decompress(request.member, 31)] == \
        ref_exchange(ex, maker.date(ex.started), ids)
    alone = maker.response(ex)
    assert zlib.decompress(alone.member, 31) == zlib.decompress(response.member, 31)
    parse_member(response.member)
    parse_member(request.member)


def test_base32_of_digests_is_rfc4648():
    for _ in range(20_000):
        digest = os.urandom(20)
        assert records._base32_160(digest) == base64.b32encode(digest) == ref_b32(digest)
    for digest in (bytes(20), b"\xff" * 20, hashlib.sha1(b"").digest()):
        assert records._base32_160(digest) == base64.b32encode(digest)


def test_record_ids_are_random_version_4_uuids():
    ids = [i for _ in range(2000) for i in records._record_ids(2)]
    assert len(set(ids)) == len(ids)
    for i in ids:
        assert i.startswith(b"<urn:uuid:") and i.endswith(b">")
        u = uuid.UUID(i[10:-1].decode())
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u).encode() == i[10:-1]
    # Every variant digit comes out (8, 9, a, b): the two free bits are random.
    assert {i[29:30] for i in ids} == {b"8", b"9", b"a", b"b"}


def test_metadata_resource_and_warcinfo_records_are_unchanged_in_form(monkeypatch):
    _fixed_ids(monkeypatch)
    maker = Maker()
    meta = zlib.decompress(maker.metadata("http://a.test/x", [("k", "v\r\nw")], refers_to="<urn:uuid:r>",
                                          page="http://a.test/", role="audio", now=1_790_000_000.0,
                                          sha256="AB" * 32).member, 31)
    assert meta == (b"WARC/1.1\r\nWARC-Type: metadata\r\nWARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-"
                    b"000000000001>\r\nWARC-Date: 2026-09-21T14:13:20Z\r\nWARC-Target-URI: http://a.test/x\r\n"
                    b"WARC-Refers-To: <urn:uuid:r>\r\nWARC-Crawler-SHA256: " + b"ab" * 32 + b"\r\n"
                    b"WARC-Crawler-Role: audio\r\nWARC-Crawler-Page: http://a.test/\r\nWARC-Block-Digest: sha1:"
                    + ref_b32(hashlib.sha1(b"k: v w\r\n").digest()) + b"\r\nWARC-Payload-Digest: sha1:"
                    + ref_b32(hashlib.sha1(b"k: v w\r\n").digest()) + b"\r\nContent-Type: application/warc-fields"
                    b"\r\nContent-Length: 8\r\n\r\nk: v w\r\n\r\n\r\n")
    info = zlib.decompress(maker.warcinfo("f.warc.gz", 1_790_000_000.0).member, 31)
    assert info.startswith(b"WARC/1.1\r\nWARC-Type: warcinfo\r\nWARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-"
                           b"000000000001>\r\nWARC-Date: 2026-09-21T14:13:20Z\r\nWARC-Filename: f.warc.gz\r\n")
    res = zlib.decompress(maker.resource("http://a.test/", "text/html", b"<p>", refers_to="", page="",
                                         role="browser", now=1_790_000_000.0).member, 31)
    assert b"\r\nWARC-Crawler-Role: browser\r\nWARC-Block-Digest: sha1:" in res and res.endswith(b"<p>\r\n\r\n")


@pytest.mark.parametrize("headers", _TRICKY_HEADERS)
@pytest.mark.parametrize("decoded", [True, False])
def test_header_sets_a_joined_block_could_misread_are_cleaned_as_before(headers, decoded):
    ex = Exchange(role="page", method="GET", url="http://a.test/", request_headers=headers, status=200,
                  response_headers=headers, body=b"x", started=1_790_000_000.0, decoded=decoded)
    assert records._response_head(ex, False) == ref_response_head(ex, False)
    assert records._request_head(ex) == ref_request_head(ex)
