"""A node's archive written by warcio: record-compressed WARC files and the index of RecordRefs, for tests of the
parts that read an archive (evidence chains, WACZ bundles) without the crawl's own writer.

It is an Archive (the interface the crawl's requesting parts call) and an evidence Index (refs, read) at once.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from crawler.archive import Exchange, RecordRef


def _date(t: float) -> str:
    import datetime

    return str(datetime_to_iso_date(datetime.datetime.fromtimestamp(t, datetime.UTC).replace(tzinfo=None),
                                    use_micros=True))


class WarcArchive:
    """Appends records to ``<archive_dir>/<name>`` (one gzip member each) and keeps a RecordRef per record."""

    def __init__(self, archive_dir: Path, name: str = "test-00000.warc.gz") -> None:
        archive_dir.mkdir(parents=True, exist_ok=True)
        self.dir = archive_dir
        self.name = name
        self.index: list[RecordRef] = []
        self._seq = 0

    # -- the index
    def refs(self) -> Iterator[RecordRef]:
        return iter(list(self.index))

    def read(self, ref: RecordRef) -> bytes:
        with open(self.dir / ref.file, "rb") as fh:
            fh.seek(ref.offset)
            return fh.read(ref.length)

    # -- writing
    def _write(self, record: object, *, kind: str, role: str, target: str, refers_to: str, page: str,
               sha256: str = "") -> str:
        with open(self.dir / self.name, "ab") as fh:
            start = fh.tell()
            WARCWriter(fh, gzip=True, warc_version="WARC/1.1").write_record(record)
            end = fh.tell()
        headers = record.rec_headers     # type: ignore[attr-defined]
        rid = headers.get_header("WARC-Record-ID")
        self.index.append(RecordRef(self.name, start, end - start, kind, role, target, rid, refers_to, page,
                                    headers.get_header("WARC-Date"),
                                    headers.get_header("WARC-Payload-Digest") or "", sha256))
        return str(rid)

    def _headers(self, role: str, page: str, t: float, extra: dict[str, str]) -> dict[str, str]:
        d = {"WARC-Date": _date(t), "WARC-Crawler-Role": role, **extra}
        if page:
            d["WARC-Crawler-Page"] = page
        return d

    def exchange(self, ex: Exchange) -> str:
        """As the crawl's writer does: the response first, then the request naming it (WARC-Concurrent-To); an
        answer whose payload is kept apart (audio stored beside the archive) is a ``revisit`` record with the
        identical-payload-digest profile and the stored bytes' digest."""
        writer = WARCWriter(io.BytesIO(), gzip=True, warc_version="WARC/1.1")
        apart = not ex.body and ex.payload_digest.startswith("sha256:")
        resp_http = StatusAndHeaders(f"{ex.status} {'OK' if ex.status < 300 else 'Other'}",
                                     [(k.decode(), v.decode()) for k, v in ex.response_headers],
                                     protocol=f"HTTP/{ex.http_version}")
        extra = {"WARC-Payload-Digest": ex.payload_digest} if ex.payload_digest else {}   # audio: its SHA-256
        if apart:
            extra["WARC-Profile"] = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
        kind = "revisit" if apart else "response"
        resp = writer.create_warc_record(ex.url, kind, payload=io.BytesIO(ex.body), length=len(ex.body),
                                         http_headers=resp_http,
                                         warc_headers_dict=self._headers(ex.role, ex.page, ex.started, extra))
        resp_id = self._write(resp, kind=kind, role=ex.role, target=ex.url, refers_to="", page=ex.page,
                              sha256=ex.payload_digest[7:] if ex.payload_digest else "")
        path = ex.url.split("/", 3)[3] if ex.url.count("/") >= 3 else ""
        req_http = StatusAndHeaders(f"{ex.method} /{path} HTTP/{ex.http_version}",
                                    [(k.decode(), v.decode()) for k, v in ex.request_headers], is_http_request=True)
        req = writer.create_warc_record(ex.url, "request", payload=io.BytesIO(ex.request_body),
                                        length=len(ex.request_body), http_headers=req_http,
                                        warc_headers_dict=self._headers(ex.role, ex.page, ex.started,
                                                                        {"WARC-Concurrent-To": resp_id}))
        self._write(req, kind="request", role=ex.role, target=ex.url, refers_to=resp_id, page=ex.page)
        return resp_id

    def metadata(self, target: str, fields: tuple[tuple[str, str], ...], *, refers_to: str, page: str,
                 role: str, now: float, sha256: str = "") -> str:
        writer = WARCWriter(io.BytesIO(), gzip=True, warc_version="WARC/1.1")
        block = "".join(f"{k}: {v}\r\n" for k, v in fields).encode()
        extra = {"WARC-Refers-To": refers_to} if refers_to else {}
        rec = writer.create_warc_record(target, "metadata", payload=io.BytesIO(block), length=len(block),
                                        warc_content_type="application/warc-fields",
                                        warc_headers_dict=self._headers(role, page, now, extra))
        return self._write(rec, kind="metadata", role=role, target=target, refers_to=refers_to, page=page,
                           sha256=sha256)

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> str:
        writer = WARCWriter(io.BytesIO(), gzip=True, warc_version="WARC/1.1")
        extra = {"WARC-Concurrent-To": refers_to} if refers_to else {}
        rec = writer.create_warc_record(target, "resource", payload=io.BytesIO(block), length=len(block),
                                        warc_content_type=content_type,
                                        warc_headers_dict=self._headers(role, page, now, extra))
        return self._write(rec, kind="resource", role=role, target=target, refers_to=refers_to, page=page)


def store_audio(data_dir: Path, body: bytes, suffix: str = ".mp3") -> tuple[str, str]:
    """A stored audio file as the downloader keeps one (content-addressed under audio/): (path relative to the
    data dir, sha256 hex)."""
    sha = hashlib.sha256(body).hexdigest()
    rel = f"audio/{sha[:2]}/{sha}{suffix}"
    (data_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (data_dir / rel).write_bytes(body)
    return rel, sha


def crawl_song(archive: WarcArchive, data_dir: Path, *, page: str, api: str, audio: str, body: bytes,
               t: float | None = None) -> tuple[str, str]:
    """One song page's whole chain, as a crawl archives it: the page, a resolver API call for it, the audio
    download (headers and digest only) and the metadata record naming the stored file. (stored path, sha256)"""
    t = time.time() if t is None else t
    rel, sha = store_audio(data_dir, body)
    host = [(b"Host", page.split("/")[2].encode()), (b"User-Agent", b"test")]
    archive.exchange(Exchange("page", "GET", page, tuple(host), 200, ((b"Content-Type", b"text/html"),),
                              b"<html><title>Song</title><a href='x'>x</a></html>", t))
    archive.exchange(Exchange("api", "GET", api, tuple(host), 200, ((b"Content-Type", b"application/json"),),
                              b'{"play_url": "' + audio.encode() + b'"}', t + 1, page=page))
    resp_id = archive.exchange(Exchange("audio", "GET", audio, tuple(host), 200,
                                        ((b"Content-Type", b"audio/mpeg"),
                                         (b"Content-Length", str(len(body)).encode())),
                                        b"", t + 2, page=page, payload_digest=f"sha256:{sha}",
                                        payload_size=len(body)))
    archive.metadata(audio, (("stored-file", rel), ("sha256", sha), ("size", str(len(body))),
                             ("content-type", "audio/mpeg"), ("page", page)),
                     refers_to=resp_id, page=page, role="audio", now=t + 3, sha256=sha)
    return rel, sha
