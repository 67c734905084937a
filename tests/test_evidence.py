"""An item's chain through a node's archive index, its text, and the WACZ bundle of it: the bundle passes
`wacz validate`, opens in warcio, and proves the stored bytes (a response record carrying them, digests checked)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawler.archive import Exchange, RecordRef
from crawler.archive.evidence import (
    EvidenceError,
    chain,
    collect,
    describe,
    find_chains,
    stored_path,
    warc_time,
    whole_file_http,
    write_bundle,
)
from crawler.archive.wacz import cdxj_line, member_head, parse_head, scan_members, surt, timestamp14
from tests.fakes.warcs import WarcArchive, crawl_song, store_audio

PAGE = "http://music.test/song/1"
API = "http://api.music.test/play?id=1"
AUDIO = "http://cdn.music.test/a/1.mp3"
BODY = b"ID3" + bytes(range(256)) * 40
T0 = 1_780_000_000.0
WACZ = Path(sys.executable).parent / "wacz"


def ref(role: str, target: str, *, kind: str = "response", page: str = "", date: str = "2026-01-01T00:00:00Z",
        rid: str = "", sha256: str = "") -> RecordRef:
    return RecordRef("f.warc.gz", 0, 1, kind, role, target, rid or f"<urn:uuid:{role}-{target}-{kind}-{date}>",
                     "", page, date, "", sha256)


@pytest.fixture
def node(tmp_path: Path) -> tuple[WarcArchive, Path, str, str]:
    data = tmp_path / "data"
    archive = WarcArchive(data / "archive")
    rel, sha = crawl_song(archive, data, page=PAGE, api=API, audio=AUDIO, body=BODY, t=T0)
    # Another song on another page: never part of the first song's chain.
    crawl_song(archive, data, page="http://music.test/song/2", api="http://api.music.test/play?id=2",
               audio="http://cdn.music.test/a/2.mp3", body=b"other" * 100, t=T0 + 10)
    return archive, data, rel, sha


# --------------------------------------------------------------------------------------------- the chain
def test_chain_by_audio_page_and_sha_is_the_same_records(node):
    archive, _, _, sha = node
    by_audio = chain(archive.index, AUDIO)
    by_page = chain(archive.index, PAGE)
    by_sha = chain(archive.index, sha)
    assert by_audio.records == by_page.records == by_sha.records
    assert by_audio.pages == (PAGE,) and by_audio.audio == (AUDIO,)
    kinds = [(r.role, r.kind) for r in by_audio.records]
    assert kinds == [("page", "response"), ("page", "request"), ("api", "response"), ("api", "request"),
                     ("audio", "revisit"), ("audio", "request"), ("audio", "metadata")]
    assert all("song/2" not in r.target and "2.mp3" not in r.target for r in by_audio.records)


def test_chain_of_an_audio_url_leaves_the_pages_other_audio_out():
    refs = [ref("page", PAGE), ref("audio", AUDIO, page=PAGE), ref("audio", AUDIO + "x", page=PAGE),
            ref("api", API, page=PAGE), ref("segment", AUDIO + "/seg1.ts", page=PAGE)]
    c = chain(refs, AUDIO)
    assert {r.target for r in c.records} == {PAGE, AUDIO, API, AUDIO + "/seg1.ts"}
    assert {r.target for r in chain(refs, PAGE).records} == {r.target for r in refs}


def test_chain_is_in_time_order_with_fractions_and_every_visit_kept():
    refs = [ref("page", PAGE, date="2026-01-02T00:00:00Z"), ref("page", PAGE, date="2026-01-01T00:00:00.5Z"),
            ref("page", PAGE, date="2026-01-01T00:00:00Z")]
    assert [r.date for r in chain(refs, PAGE).records] == ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z",
                                                             "2026-01-02T00:00:00Z"]
    assert warc_time("2026-01-01T00:00:00.5Z") - warc_time("2026-01-01T00:00:00Z") == 0.5
    assert warc_time("yesterday") == 0.0


def test_nothing_archived_is_an_empty_chain(node):
    archive, *_ = node
    c = chain(archive.index, "http://elsewhere.test/x")
    assert not c.found and c.records == ()
    assert not chain(archive.index, "0" * 64).found


def test_find_chains_reads_the_index_twice_and_keeps_only_the_chains(node):
    archive, *_ = node
    calls = []

    class Counting:
        def refs(self):
            calls.append(1)
            return iter(archive.index)

        def read(self, r: RecordRef) -> bytes:
            return archive.read(r)

    chains = find_chains(Counting(), [AUDIO, "http://music.test/song/2"])
    assert len(calls) == 2
    assert [c.audio for c in chains] == [(AUDIO,), ("http://cdn.music.test/a/2.mp3",)]


def test_show_says_the_chain_in_one_line_a_step(node):
    archive, _, rel, sha = node
    _, text = describe(archive, [AUDIO])
    lines = text.splitlines()
    assert lines[0] == f"{AUDIO}:"
    assert lines[1].startswith(f"  page {PAGE} fetched at 2026-") and lines[1].endswith("(200)")
    assert lines[2].startswith(f"  -> api call {API} at ") and lines[2].endswith("(200)")
    assert lines[3].startswith(f"  -> audio {AUDIO} at ")
    assert lines[4].endswith(f"sha256 {sha}, size {len(BODY)}, stored as {rel}")
    assert describe(archive, ["http://nowhere.test/"])[1] == "http://nowhere.test/: no archived records"


# --------------------------------------------------------------------------------------------- record heads
def test_heads_and_index_lines_read_what_warcio_wrote(node):
    archive, *_ = node
    with open(archive.dir / archive.name, "rb") as fh:
        scanned = list(scan_members(fh))
    assert [(o, n) for o, n, _ in scanned] == [(r.offset, r.length) for r in archive.index]
    for (_, _, head), r in zip(scanned, archive.index):
        assert head.kind == r.kind and head.get("WARC-Record-ID") == r.record_id
        assert member_head(archive.read(r)) == head
    page_resp = scanned[0][2]
    assert page_resp.status == 200 and page_resp.http_get("content-type") == "text/html"
    line = cdxj_line(page_resp, 10, 20, "data.warc.gz")
    assert line is not None
    key, ts, entry = line.split(" ", 2)
    assert key == "test,music)/song/1" and ts == timestamp14(page_resp.get("WARC-Date"))
    assert json.loads(entry) == {"url": PAGE, "mime": "text/html", "status": "200",
                                 "digest": page_resp.get("WARC-Payload-Digest"), "length": "20", "offset": "10",
                                 "filename": "data.warc.gz"}
    assert cdxj_line(scanned[1][2], 0, 1, "x") is None            # requests are not indexed
    revisit = json.loads((cdxj_line(scanned[4][2], 0, 1, "x") or "").split(" ", 2)[2])
    assert revisit["mime"] == "warc/revisit" and revisit["status"] == "200"
    assert cdxj_line(scanned[6][2], 0, 1, "x") is None            # nor warc-fields metadata
    assert scanned[6][2].fields()["stored-file"].startswith("audio/")


def test_surt_keys_as_cdxj_indexer():
    assert surt("http://www.Example.com/A/b?z=1&a=2") == "com,example)/a/b?a=2&z=1"
    assert surt("https://example.com:8443/") == "com,example:8443)/"
    assert surt("http://127.0.0.1:8080/x") == "1,0,0,127:8080)/x"
    assert surt("http://a.com/x?b&q=1") == "com,a)/x?b&q=1"
    assert surt("https://example.com:443") == "com,example)/"
    with pytest.raises(ValueError):
        parse_head(b"HTTP/1.1 200 OK\r\n\r\n")


def test_whole_file_head_keeps_the_archived_answer_and_makes_a_range_whole():
    head = parse_head(b"WARC/1.1\r\nWARC-Type: response\r\nContent-Type: application/http;msgtype=response\r\n"
                      b"Content-Length: 200\r\n\r\nHTTP/1.1 206 Partial Content\r\nContent-Type: audio/mpeg\r\n"
                      b"Content-Range: bytes 100-199/200\r\nContent-Length: 100\r\nETag: \"x\"\r\n\r\n")
    http = whole_file_http(head, 200, "audio/mpeg").decode()
    assert http.startswith("HTTP/1.1 200 OK\r\n")
    assert "X-Archive-Orig-Content-Range: bytes 100-199/200" in http and 'ETag: "x"' in http
    assert http.endswith("Content-Length: 200\r\n\r\n") and "\r\nContent-Length: 100" not in http
    assert whole_file_http(None, 5, "").startswith(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream")


def test_stored_files_never_escape_the_data_dir(tmp_path):
    assert stored_path(tmp_path, "audio/x.mp3") == (tmp_path / "audio/x.mp3").resolve()
    for bad in ("../x", "/etc/passwd", "", "audio/../../x"):
        with pytest.raises(EvidenceError):
            stored_path(tmp_path, bad)


# --------------------------------------------------------------------------------------------- the bundle
def _records(warc: bytes) -> list:
    out = []
    for rec in ArchiveIterator(io.BytesIO(warc), check_digests="raise"):
        out.append((rec.rec_type, rec.rec_headers, rec.http_headers, rec.content_stream().read()))
    return out


def test_collect_copies_the_records_and_adds_the_stored_bytes(node):
    archive, data, rel, sha = node
    chains = find_chains(archive, [AUDIO])
    buf = io.BytesIO()
    summaries, pages = collect(archive, chains, data, buf)
    recs = _records(buf.getvalue())
    assert [r[0] for r in recs] == ["response", "request", "response", "request", "revisit", "request",
                                    "metadata", "response"]
    kind, warc, http, payload = recs[-1]
    assert payload == BODY and hashlib.sha256(payload).hexdigest() == sha
    assert warc.get_header("WARC-Payload-Digest") == f"sha256:{sha}"
    original, request = recs[4][1], recs[5][1]
    assert warc.get_header("WARC-Refers-To") == original.get_header("WARC-Record-ID")
    assert warc.get_header("WARC-Concurrent-To") == request.get_header("WARC-Record-ID")
    assert warc.get_header("WARC-Date") == original.get_header("WARC-Date")
    assert http.get_statuscode() == "200" and http.get_header("Content-Type") == "audio/mpeg"
    # The archived records are the archive's own bytes.
    assert buf.getvalue().startswith(b"".join(archive.read(r) for r in chains[0].records))
    [s] = summaries
    assert s["wanted"] == AUDIO and s["pages"] == [PAGE]
    assert [st["role"] for st in s["steps"]] == ["page", "page", "api", "api", "audio", "audio", "audio"]
    assert s["steps"][0]["status"] == 200 and s["steps"][6]["fields"]["sha256"] == sha
    assert s["files"] == [{"target": AUDIO, "sha256": sha, "stored_file": rel, "size": str(len(BODY)),
                           "metadata_record": chains[0].records[6].record_id, "bytes": "included",
                           "record_bytes": len(buf.getvalue()) - sum(r.length for r in chains[0].records)}]
    assert pages == [{"url": PAGE, "ts": "2026-05-28T20:26:40Z"}]


def test_a_record_shared_by_two_chains_is_written_once(node):
    archive, data, *_ = node
    buf = io.BytesIO()
    collect(archive, find_chains(archive, [AUDIO, PAGE]), data, buf)
    ids = [r[1].get_header("WARC-Record-ID") for r in _records(buf.getvalue())]
    assert len(ids) == len(set(ids)) == 8


def test_a_stored_file_with_other_bytes_is_refused_and_a_missing_one_said(node):
    archive, data, rel, _ = node
    (data / rel).write_bytes(b"tampered")
    with pytest.raises(EvidenceError, match="is not the bytes archived"):
        collect(archive, find_chains(archive, [AUDIO]), data, io.BytesIO())
    (data / rel).unlink()
    summaries, _ = collect(archive, find_chains(archive, [AUDIO]), data, io.BytesIO())
    assert summaries[0]["files"][0]["bytes"].startswith("missing")


def test_the_byte_cap_holds(node):
    archive, data, *_ = node
    with pytest.raises(EvidenceError, match="larger than the limit"):
        collect(archive, find_chains(archive, [AUDIO]), data, io.BytesIO(), max_bytes=2000)


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(WACZ), "validate", "-f", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_wacz_validates_and_opens_in_warcio(node, tmp_path):
    archive, data, rel, sha = node
    out = tmp_path / "evidence.wacz"
    write_bundle(archive, data, [AUDIO, "http://music.test/song/2"], out, now=T0 + 100)
    r = validate(out)
    assert r.returncode == 0 and "Validation succeeded" in r.stdout, r.stdout + r.stderr
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {"archive/data.warc.gz", "indexes/index.cdxj", "pages/pages.jsonl", "evidence/chains.json",
                "datapackage.json", "datapackage-digest.json"} <= names
        assert zf.getinfo("archive/data.warc.gz").compress_type == zipfile.ZIP_STORED
        package = json.loads(zf.read("datapackage.json"))
        assert package["wacz_version"] == "1.1.1" and package["profile"] == "data-package"
        assert package["created"] == "2026-05-28T20:28:20Z" and package["software"].startswith("audio-crawler")
        for res in package["resources"]:
            blob = zf.read(res["path"])
            assert res["hash"] == "sha256:" + hashlib.sha256(blob).hexdigest() and res["bytes"] == len(blob)
        digest = json.loads(zf.read("datapackage-digest.json"))
        assert digest["hash"] == "sha256:" + hashlib.sha256(zf.read("datapackage.json")).hexdigest()
        warc = zf.read("archive/data.warc.gz")
        recs = _records(warc)
        assert sum(1 for r in recs if r[0] == "response" and r[3] == BODY) == 1
        # Every index line points at its record.
        for line in zf.read("indexes/index.cdxj").decode().splitlines():
            entry = json.loads(line.split(" ", 2)[2])
            member = warc[int(entry["offset"]):int(entry["offset"]) + int(entry["length"])]
            assert member_head(member).get("WARC-Target-URI") == entry["url"]
        pages = [json.loads(x) for x in zf.read("pages/pages.jsonl").decode().splitlines()]
        assert pages[0]["format"] == "json-pages-1.0"
        assert [p["url"] for p in pages[1:]] == [PAGE, "http://music.test/song/2"]
        chains = json.loads(zf.read("evidence/chains.json"))
        assert [c["wanted"] for c in chains] == [AUDIO, "http://music.test/song/2"]
        assert chains[0]["files"][0]["sha256"] == sha


def test_a_tampered_bundle_fails_validation(node, tmp_path):
    archive, data, *_ = node
    out = tmp_path / "evidence.wacz"
    write_bundle(archive, data, [AUDIO], out, now=T0)
    bad = tmp_path / "bad.wacz"
    with zipfile.ZipFile(out) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            blob = src.read(info)
            if info.filename == "evidence/chains.json":
                blob = blob.replace(b"included", b"excluded")
            dst.writestr(info, blob)
    assert validate(bad).returncode != 0


def test_a_bundle_of_an_unknown_item_writes_nothing(node, tmp_path):
    archive, data, *_ = node
    out = tmp_path / "evidence.wacz"
    with pytest.raises(EvidenceError, match="no archived records of http://x.test/"):
        write_bundle(archive, data, [AUDIO, "http://x.test/"], out, now=T0)
    assert not out.exists() and list(tmp_path.iterdir()) == [data]


def test_exchange_fields_reach_the_fake_archive(tmp_path):
    a = WarcArchive(tmp_path)
    rid = a.exchange(Exchange("robots", "GET", "http://x.test/robots.txt", ((b"Host", b"x.test"),), 404, (), b"",
                              T0))
    assert rid.startswith("<urn:uuid:") and [r.kind for r in a.index] == ["response", "request"]


def test_a_page_is_found_by_the_records_made_for_it_and_the_catalogue_ties_a_page_alone():
    # The node that downloaded the audio has no page record: the page is found by the records made for it.
    audio_only = [ref("audio", AUDIO, page=PAGE, kind="request"), ref("audio", AUDIO, page=PAGE)]
    c = chain(audio_only, PAGE)
    assert c.found and c.pages == (PAGE,) and c.audio == (AUDIO,)
    # The node that fetched the page has nothing naming the audio: what the catalogue knows ties them.
    page_only = [ref("page", PAGE), ref("api", API, page=PAGE), ref("page", "http://music.test/other")]
    assert not chain(page_only, AUDIO).found
    c = chain(page_only, AUDIO, known=[(PAGE, AUDIO)])
    assert [r.target for r in c.records] == [PAGE, API] and c.audio == (AUDIO,)


def test_chains_of_two_nodes_merge_by_item_in_time_order():
    from crawler.archive.evidence import merge

    def step(rid: str, date: str) -> dict:
        return {"role": "page", "type": "response", "target": PAGE, "date": date, "record_id": rid}

    a = [{"wanted": AUDIO, "pages": [PAGE], "audio": [], "steps": [step("1", "2026-01-01T00:00:02Z")],
          "files": []}]
    b = [{"wanted": AUDIO, "pages": [], "audio": [AUDIO],
          "steps": [step("2", "2026-01-01T00:00:01Z"), step("1", "2026-01-01T00:00:02Z")], "files": [{"x": 1}]}]
    [m] = merge([a, b])
    assert m["pages"] == [PAGE] and m["audio"] == [AUDIO] and m["files"] == [{"x": 1}]
    assert [s["record_id"] for s in m["steps"]] == ["2", "1"]


def test_audio_archived_with_its_payload_is_not_added_again(tmp_path):
    data = tmp_path / "data"
    archive = WarcArchive(data / "archive")
    rel, sha = store_audio(data, BODY)
    rid = archive.exchange(Exchange("audio", "GET", AUDIO, ((b"Host", b"cdn.music.test"),), 200,
                                    ((b"Content-Type", b"audio/mpeg"),), BODY, T0, page=PAGE,
                                    payload_digest=f"sha256:{sha}"))
    archive.metadata(AUDIO, (("stored-file", rel), ("sha256", sha), ("size", str(len(BODY)))), refers_to=rid,
                     page=PAGE, role="audio", now=T0 + 1, sha256=sha)
    buf = io.BytesIO()
    summaries, _ = collect(archive, find_chains(archive, [sha]), data, buf)
    assert [r[0] for r in _records(buf.getvalue())] == ["response", "request", "metadata"]
    assert summaries[0]["files"][0]["bytes"] == f"in the archived response {rid}"


def test_digests_read_as_warc_files_write_them():
    from crawler.archive.evidence import digest_hex

    raw = hashlib.sha256(b"x").digest()
    b32 = __import__("base64").b32encode(raw).decode()
    assert digest_hex(f"sha256:{raw.hex()}") == digest_hex(f"sha256:{b32}") == digest_hex(f"sha256:{b32.rstrip('=')}")
    assert digest_hex(f"sha256:{b32}") == raw.hex()
    assert digest_hex("sha1:" + b32[:32]) == "" and digest_hex("sha256:!!") == "" and digest_hex("") == ""


def test_a_stream_joined_from_segments_gets_a_record_of_its_own(tmp_path):
    """The metadata of an HLS file refers to its last segment: the bundle's record of the whole file neither
    borrows the segment's headers and digest nor refers to it."""
    data = tmp_path / "data"
    archive = WarcArchive(data / "archive")
    rel, sha = store_audio(data, BODY)
    stream = "http://cdn.music.test/s/index.m3u8"
    archive.exchange(Exchange("playlist", "GET", stream, (), 200, ((b"Content-Type", b"application/x-mpegurl"),),
                              b"#EXTM3U\n", T0, page=PAGE))
    seg_digest = "sha256:" + hashlib.sha256(b"segment").hexdigest()
    seg = archive.exchange(Exchange("segment", "GET", stream + "/1.ts", (), 200,
                                    ((b"Content-Type", b"video/mp2t"),), b"", T0 + 1, page=PAGE,
                                    payload_digest=seg_digest, payload_size=7))
    meta = archive.metadata(stream, (("stored-file", rel), ("sha256", sha), ("size", str(len(BODY))),
                                     ("content-type", "audio/aac")), refers_to=seg, page=PAGE, role="audio",
                            now=T0 + 2, sha256=sha)
    buf = io.BytesIO()
    [s], _ = collect(archive, find_chains(archive, [sha]), data, buf)
    assert [st["role"] for st in s["steps"]] == ["playlist", "playlist", "segment", "segment", "audio"]
    kind, warc, http, payload = _records(buf.getvalue())[-1]
    assert kind == "response" and payload == BODY and warc.get_header("WARC-Target-URI") == stream
    assert warc.get_header("WARC-Refers-To") == meta and not warc.get_header("WARC-Concurrent-To")
    assert warc.get_header("WARC-Payload-Digest") == f"sha256:{sha}"
    assert http.get_header("Content-Type") == "audio/aac" and http.get_statuscode() == "200"
