"""The archive's records: WARC 1.1 that standard tools read and check, built from an Exchange alone."""

import base64
import gzip
import hashlib
import io
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from msgspec.structs import replace
from warcio.archiveiterator import ArchiveIterator

from crawler.archive import Exchange
from crawler.archive.records import (
    Maker,
    http_payload,
    iter_records,
    parse_member,
    read_member,
    sha256_hex,
)

WARCIO = Path(sys.executable).parent / "warcio"     # the venv's script, beside its python
T = 1_790_000_000.0
PAGE = Exchange(role="page", method="GET", url="http://site.test/a?b=1",
                request_headers=((b"Host", b"site.test"), (b"User-Agent", b"audio-crawler/1"),
                                 (b"Accept-Encoding", b"gzip")),
                status=200,
                response_headers=((b"Content-Type", b"text/html"), (b"Content-Encoding", b"gzip"),
                                  (b"Content-Length", b"99"), (b"Set-Cookie", b"a=1"), (b"Set-Cookie", b"b=2")),
                body=b"<html>" + b"x" * 5000 + b"</html>", started=T + 0.5)
AUDIO = Exchange(role="audio", method="GET", url="http://cdn.test/a.mp3",
                 request_headers=((b"Host", b"cdn.test"), (b"Range", b"bytes=100-")),
                 status=206, response_headers=((b"Content-Type", b"audio/mpeg"), (b"Content-Length", b"900")),
                 body=b"", started=T + 1, page="http://site.test/a?b=1",
                 payload_digest="sha256:" + hashlib.sha256(b"the file").hexdigest(), payload_size=900,
                 decoded=False)


def write(path: Path, members: list[bytes]) -> Path:
    path.write_bytes(b"".join(members))
    return path


def warcio_check(path: Path) -> None:
    done = subprocess.run([str(WARCIO), "check", "-v", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fail" not in done.stdout, done.stdout


def read_all(path: Path) -> list:
    with open(path, "rb") as fh:
        return [(r.rec_headers, r.http_headers, r.content_stream().read())
                for r in ArchiveIterator(fh, check_digests="raise")]


def test_an_exchange_is_a_response_and_a_request_tied_together(tmp_path):
    maker = Maker()
    response, request = maker.exchange(PAGE)
    path = write(tmp_path / "a.warc.gz", [maker.warcinfo("a.warc.gz", T).member, response.member, request.member])
    warcio_check(path)
    info, (rh, http, body), (qh, qhttp, qbody) = read_all(path)
    assert info[0].get_header("WARC-Type") == "warcinfo"
    assert (rh.get_header("WARC-Type"), qh.get_header("WARC-Type")) == ("response", "request")
    assert qh.get_header("WARC-Concurrent-To") == rh.get_header("WARC-Record-ID") == response.record_id
    assert request.refers_to == response.record_id and uuid.UUID(response.record_id[10:-1]).version == 4
    assert rh.get_header("WARC-Date") == qh.get_header("WARC-Date") == "2026-09-21T14:13:20Z"
    assert rh.get_header("WARC-Target-URI") == "http://site.test/a?b=1"
    assert rh.get_header("WARC-Crawler-Role") == "page" and rh.get_header("WARC-Crawler-Page") is None
    assert body == PAGE.body
    digest = base64.b32encode(hashlib.sha1(PAGE.body).digest()).decode()
    assert rh.get_header("WARC-Payload-Digest") == f"sha1:{digest}" == response.digest
    for h in (rh, qh, info[0]):
        assert h.get_header("WARC-Block-Digest").startswith("sha1:")
        assert h.get_header("WARC-Payload-Digest").startswith("sha1:")
    # Stored decoded: the wire's encoding and length are kept aside, the length is the stored one.
    assert http.get_statuscode() == "200" and http.get_header("Content-Encoding") is None
    assert http.get_header("X-Archive-Orig-Content-Encoding") == "gzip"
    assert http.get_header("X-Archive-Orig-Content-Length") == "99"
    assert http.get_header("Content-Length") == str(len(PAGE.body))
    assert [v for k, v in http.headers if k == "Set-Cookie"] == ["a=1", "b=2"]
    # The request as sent.
    assert qhttp.protocol == "GET" and qhttp.statusline.startswith("/a?b=1")
    assert qhttp.get_header("Host") == "site.test" and qhttp.get_header("User-Agent") == "audio-crawler/1"
    assert qbody == b""


def test_a_payload_kept_apart_is_a_revisit_with_the_stored_files_digest(tmp_path):
    maker = Maker()
    response, request = maker.exchange(AUDIO)
    path = write(tmp_path / "a.warc.gz", [response.member, request.member])
    warcio_check(path)
    (rh, http, body), (qh, _, _) = read_all(path)
    assert rh.get_header("WARC-Type") == response.kind == "revisit"
    assert rh.get_header("WARC-Profile") == "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
    assert sha256_hex(rh.get_header("WARC-Payload-Digest")) == hashlib.sha256(b"the file").hexdigest()
    assert rh.get_header("WARC-Payload-Digest") == response.digest
    assert rh.get_header("WARC-Crawler-Payload-Length") == "900"
    assert rh.get_header("WARC-Crawler-Page") == "http://site.test/a?b=1"
    assert http.get_statuscode() == "206" and http.get_header("Content-Length") == "900" and body == b""
    # Stored decoded (a gzip-coded answer): the wire's length aside, the stored payload's length in its place.
    decoded, _ = maker.exchange(replace(AUDIO, decoded=True, response_headers=(
        (b"Content-Encoding", b"gzip"), (b"Content-Length", b"500"))))
    _, block = parse_member(decoded.member)
    assert b"X-Archive-Orig-Content-Length: 500\r\n" in block and b"\r\nContent-Length: 900\r\n" in block
    assert qh.get_header("WARC-Concurrent-To") == response.record_id


def test_audio_with_its_bytes_in_the_record_has_their_sha256(tmp_path):
    maker = Maker()
    whole = replace(AUDIO, body=b"the file", status=200)
    response, request = maker.exchange(whole)
    path = write(tmp_path / "a.warc.gz", [response.member, request.member])
    warcio_check(path)
    (rh, _, body), _ = read_all(path)
    assert rh.get_header("WARC-Type") == "response" and body == b"the file"
    assert sha256_hex(rh.get_header("WARC-Payload-Digest")) == hashlib.sha256(b"the file").hexdigest()


def test_metadata_and_resource_records_refer_to_their_record(tmp_path):
    maker = Maker()
    meta = maker.metadata("http://cdn.test/a.mp3", (("file", "audio/ab/cd.mp3"), ("evil", "a\r\nWARC-Type: x")),
                          refers_to="<urn:uuid:r>", page="http://site.test/", role="audio", now=T)
    res = maker.resource("http://site.test/", "image/png", b"\x89PNG...", refers_to="", page="http://site.test/",
                         role="browser", now=T)
    path = write(tmp_path / "a.warc.gz", [meta.member, res.member])
    warcio_check(path)
    (mh, _, mbody), (sh, _, sbody) = read_all(path)
    assert mh.get_header("WARC-Type") == "metadata" and mh.get_header("WARC-Refers-To") == "<urn:uuid:r>"
    assert mh.get_header("Content-Type") == "application/warc-fields"
    assert mbody == b"file: audio/ab/cd.mp3\r\nevil: a WARC-Type: x\r\n"
    assert sh.get_header("WARC-Type") == "resource" and sh.get_header("Content-Type") == "image/png"
    assert sbody == b"\x89PNG..." and sh.get_header("WARC-Refers-To") is None


def test_each_record_is_one_gzip_member_read_back_alone(tmp_path):
    maker = Maker()
    built = [maker.warcinfo("x", T), *maker.exchange(PAGE), *maker.exchange(AUDIO)]
    path = write(tmp_path / "a.warc.gz", [b.member for b in built])
    records = list(iter_records(path))
    assert [r.header("WARC-Type") for r in records] == ["warcinfo", "response", "request", "revisit", "request"]
    for b, r in zip(built, records, strict=True):
        assert read_member(path, r.offset, r.length) == b.member
        headers, block = parse_member(b.member)
        assert dict(headers)["WARC-Record-ID"] == b.record_id and block == r.block
    _head, payload = http_payload(records[1].block)
    assert payload == PAGE.body
    assert gzip.decompress(path.read_bytes()).count(b"WARC/1.1\r\n") == 5


def test_a_member_cut_short_ends_the_walk(tmp_path):
    maker = Maker()
    members = [b.member for b in maker.exchange(PAGE)]
    path = write(tmp_path / "a.warc.gz", [members[0], members[1][:-7]])
    assert [r.header("WARC-Type") for r in iter_records(path)] == ["response"]
    with pytest.raises(ValueError):
        parse_member(members[1][:-7])


@pytest.mark.parametrize("url", ["http://site.test/a\r\nWARC-Type: response", "http://site.test/\x00\x7f\t",
                                 "http://site.test/ a b", "http://[::1]:80/%2e%2e/" + "é" * 300])
def test_hostile_urls_and_headers_cannot_break_a_record(tmp_path, url):
    evil = Exchange(role="page\r\nX: y", method="GET\r\n", url=url,
                    request_headers=((b"Host", b"site.test\r\nWARC-Type: x"), (b"X\r\nA:", b"\x00a\x1fb")),
                    status=999, response_headers=((b"X-Evil", b"a\r\n\r\nWARC/1.1\r\nWARC-Type: response"),
                                                  (b"Bad Name:", b"v"), (b"", b"empty")),
                    body=b"z" * 100, started=T, page=url, truncated="length\r\nX: y", http_version="1.1\r\n")
    maker = Maker()
    path = write(tmp_path / "a.warc.gz", [b.member for b in maker.exchange(evil)])
    warcio_check(path)
    (rh, http, body), (qh, qhttp, _) = read_all(path)
    assert rh.get_header("WARC-Target-URI") == rh.get_header("WARC-Crawler-Page")
    assert "\n" not in rh.get_header("WARC-Target-URI") and "\r" not in rh.get_header("WARC-Target-URI")
    assert rh.get_header("WARC-Truncated") == "lengthXy" and rh.get_header("WARC-Crawler-Role") == "pageXy"
    assert http.get_header("X-Evil") == "a WARC/1.1 WARC-Type: response" and body == b"z" * 100
    assert http.get_statuscode() == "999"
    assert qhttp.get_header("Host") == "site.test WARC-Type: x" and qhttp.get_header("XA") == "ab"
    assert len([r for r in iter_records(path)]) == 2


def test_the_date_is_formatted_once_a_second_but_follows_the_clock():
    maker = Maker()
    assert maker.date(T) == b"2026-09-21T14:13:20Z"
    assert maker.date(T + 0.9) is maker.date(T)
    assert maker.date(T + 61) == b"2026-09-21T14:14:21Z"


def test_warcio_reads_a_file_written_whole_too():
    maker = Maker()
    data = b"".join(b.member for b in maker.exchange(PAGE))
    types = [r.rec_headers.get_header("WARC-Type") for r in ArchiveIterator(io.BytesIO(data))]
    assert types == ["response", "request"]


@pytest.mark.parametrize("chunk", [1, 7, 100, 4096])
def test_the_walk_finds_every_member_whatever_the_reads_cut(tmp_path, monkeypatch, chunk):
    from crawler.archive import records

    monkeypatch.setattr(records, "READ_CHUNK", chunk)
    maker = Maker()
    built = [maker.warcinfo("x", T), *maker.exchange(PAGE), *maker.exchange(AUDIO), *maker.exchange(PAGE)]
    path = write(tmp_path / "a.warc.gz", [b.member for b in built])
    found = list(iter_records(path))
    assert [r.header("WARC-Record-ID") for r in found] == [b.record_id for b in built]
    assert [(r.offset, r.length) for r in found] == [
        (sum(len(b.member) for b in built[:i]), len(built[i].member)) for i in range(len(built))]
    cut = write(tmp_path / "cut.warc.gz", [b.member for b in built][:-1] + [built[-1].member[:30]])
    assert len(list(iter_records(cut))) == len(built) - 1
