"""An evidence bundle as a WACZ 1.1.1 file, laid out as Webrecorder's ``wacz`` package lays one out.

    archive/<name>.warc.gz      the records (one gzip member each), stored in the zip, not deflated, so a reader
                                seeks to a record through the index without inflating the zip
    indexes/index.cdxj          one line per response, revisit or resource record: SURT key, 14-digit time, JSON
                                (url, mime, status, digest, length, offset, filename), sorted, as cdxj-indexer writes
    pages/pages.jsonl           a header line, then one line per page of the bundle (url, ts)
    evidence/chains.json        the chains the bundle proves: each item's page, resolver exchanges and audio
                                exchange, with their times, record ids and the stored file's digest
    datapackage.json            every file above with its sha256 and size; profile, wacz_version, created, software
    datapackage-digest.json     the sha256 of datapackage.json

Written with zipfile alone (the ``wacz`` package is only the tests' validator). The WARC files are streamed into
the zip and hashed on the way, so an audio file of any size never sits whole in memory; the index is read from
the WARC files as they were written (each member's head inflated, its end found), so it cannot disagree with them.
The file appears under its name only once complete (written beside it, then renamed).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

WACZ_VERSION = "1.1.1"
PAGES_FORMAT = "json-pages-1.0"
CHAINS_PATH = "evidence/chains.json"
HEAD_MAX = 64 * 1024          # bytes of a record inflated for its headers (WARC, HTTP) and a metadata block
_CHUNK = 1024 * 1024
_INDEXED = ("response", "revisit", "resource", "metadata")   # cdxj-indexer's default (warc-fields skipped)


# --------------------------------------------------------------------------------------------- record heads
@dataclass(frozen=True, slots=True)
class RecordHead:
    """The start of one WARC record: its WARC headers, the HTTP status and headers of a request or response
    record, and the first bytes of its block after those (a metadata record's fields)."""

    warc: tuple[tuple[str, str], ...]
    status: int | None                      # of a response record's HTTP answer
    http: tuple[tuple[str, str], ...]       # the HTTP headers of a request or response record
    http_line: str                          # the HTTP status or request line
    block: bytes                            # what follows the HTTP head (or the WARC headers), up to HEAD_MAX
    payload_length: int = 0                 # bytes of the block after the HTTP head (all of it without one)

    def get(self, name: str, default: str = "") -> str:
        low = name.lower()
        return next((v for k, v in self.warc if k.lower() == low), default)

    def http_get(self, name: str, default: str = "") -> str:
        low = name.lower()
        return next((v for k, v in self.http if k.lower() == low), default)

    @property
    def kind(self) -> str:
        return self.get("WARC-Type")

    def fields(self) -> dict[str, str]:
        """A metadata record's application/warc-fields block as a dict (the first value of each name)."""
        out: dict[str, str] = {}
        for line in self.block.decode("utf-8", "replace").splitlines():
            k, sep, v = line.partition(":")
            if sep and k.strip() and k.strip() not in out:
                out[k.strip()] = v.strip()
        return out


def _headers(raw: bytes) -> tuple[tuple[str, str], ...]:
    out = []
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        k, sep, v = line.partition(":")
        if sep:
            out.append((k.strip(), v.strip()))
    return tuple(out)


def parse_head(data: bytes) -> RecordHead:
    """The head of a record from its first inflated bytes (ValueError if they are not a WARC record)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"WARC/"):
        raise ValueError("not a WARC record")
    _, _, warc_raw = head.partition(b"\r\n")
    warc = _headers(warc_raw)
    kind = next((v for k, v in warc if k.lower() == "warc-type"), "")
    ctype = next((v for k, v in warc if k.lower() == "content-type"), "")
    length = int(next((v for k, v in warc if k.lower() == "content-length"), "0") or 0)
    rest = rest[:length]
    if kind in ("request", "response", "revisit") and ctype.startswith("application/http"):
        http_head, sep2, body = rest.partition(b"\r\n\r\n")
        if sep2 or (kind == "revisit" and http_head):
            line, _, http_raw = http_head.partition(b"\r\n")
            http_line = line.decode("latin-1")
            status = None
            if kind != "request":
                parts = http_line.split(" ", 2)
                status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            payload = max(0, length - len(http_head) - len(sep2))
            return RecordHead(warc, status, _headers(http_raw), http_line, body, payload)
    return RecordHead(warc, None, (), "", rest, length)


def member_head(member: bytes) -> RecordHead:
    """The head of a record from its whole gzip member (only the first HEAD_MAX bytes are inflated)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    return parse_head(d.decompress(member, HEAD_MAX))


def scan_members(fh: IO[bytes]) -> Iterator[tuple[int, int, RecordHead]]:
    """(offset, length, head) of each gzip member of a record-compressed WARC file, in order. Each member is
    inflated in bounded steps (its end is only known once inflated) and only its head is kept."""
    offset = 0
    pending = b""
    while True:
        if not pending:
            pending = fh.read(_CHUNK)
            if not pending:
                return
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        head = bytearray()
        used = 0
        while True:
            data = pending
            while data:
                out = d.decompress(data, _CHUNK)
                if len(head) < HEAD_MAX:
                    head += out[:HEAD_MAX - len(head)]
                data = d.unconsumed_tail
                if d.eof:
                    break
            if d.eof:
                used += len(pending) - len(d.unused_data)
                pending = d.unused_data
                break
            used += len(pending)
            pending = fh.read(_CHUNK)
            if not pending:
                raise ValueError(f"a record at offset {offset} is cut short")
        yield offset, used, parse_head(bytes(head))
        offset += used


# --------------------------------------------------------------------------------------------- the index
def surt(url: str) -> str:
    """The SURT key of a URL as cdxj-indexer writes it: host labels reversed without www, the default port
    dropped, path and sorted query parameters, lower case."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").strip(".")
        port = parts.port
    except ValueError:
        return url.lower()
    labels = host.split(".")
    if len(labels) > 2 and re.fullmatch(r"www\d*", labels[0]):
        labels = labels[1:]
    key = ",".join(reversed(labels))
    if port is not None and (parts.scheme, port) not in (("http", 80), ("https", 443)):
        key += f":{port}"
    path = parts.path or "/"
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    return (key + ")" + path + (f"?{query}" if query else "")).lower()


def timestamp14(warc_date: str) -> str:
    """A WARC-Date (ISO-8601) as the 14 digits of a CDX line."""
    digits = "".join(c for c in warc_date if c.isdigit())
    return digits[:14].ljust(14, "0")


def cdxj_line(head: RecordHead, offset: int, length: int, filename: str) -> str | None:
    """The index line of one record, or None for a record the index leaves out (requests, warcinfo, fields)."""
    kind = head.kind
    if kind not in _INDEXED:
        return None
    ctype = head.get("Content-Type")
    if kind in ("resource", "metadata") and ctype == "application/warc-fields":
        return None
    url = head.get("WARC-Target-URI")
    entry: dict[str, str] = {"url": url}
    if kind == "revisit":
        entry["mime"] = "warc/revisit"
        if head.status is not None:
            entry["status"] = str(head.status)
    elif kind == "response" and head.status is not None:
        entry["mime"] = head.http_get("Content-Type").split(";")[0].strip() or "unk"
        entry["status"] = str(head.status)
    elif kind in ("resource", "metadata"):
        entry["mime"] = ctype.split(";")[0].strip() or "unk"
        entry["status"] = "200"
    else:
        entry["mime"] = "unk"
    digest = head.get("WARC-Payload-Digest") or head.get("WARC-Block-Digest")
    if digest:
        entry["digest"] = digest
    entry.update(length=str(length), offset=str(offset), filename=filename)
    return f"{surt(url)} {timestamp14(head.get('WARC-Date'))} {json.dumps(entry)}"


# --------------------------------------------------------------------------------------------- the package
def iso_now(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pages_lines(pages: Iterable[Mapping[str, str]]) -> list[str]:
    """pages/pages.jsonl: the header, then each page once (url, ts, an id made from both)."""
    lines = [json.dumps({"format": PAGES_FORMAT, "id": "pages", "title": "Pages"})]
    seen = set()
    for p in pages:
        key = (p["url"], p["ts"])
        if key in seen:
            continue
        seen.add(key)
        pid = hashlib.sha256(f"{p['ts']} {p['url']}".encode()).hexdigest()[:32]
        lines.append(json.dumps({"id": pid, "url": p["url"], "ts": p["ts"], **({"title": p["title"]}
                                                                                if p.get("title") else {})},
                                ensure_ascii=False))
    return lines


def datapackage(resources: Sequence[Mapping[str, Any]], *, created: str, software: str, title: str,
                main_page: Mapping[str, str] | None = None, extras: Mapping[str, Any] | None = None) -> bytes:
    d: dict[str, Any] = {"profile": "data-package", "resources": list(resources), "wacz_version": WACZ_VERSION,
                         "created": created, "software": software, "title": title}
    if main_page:
        d["mainPageURL"] = main_page["url"]
        d["mainPageDate"] = main_page["ts"]
    if extras:
        d.update(extras)
    return json.dumps(d, indent=2, ensure_ascii=False).encode()


class _Hashing:
    """A writable that hashes and counts what passes through."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b: bytes) -> None:
        self.out.write(b)
        self.sha.update(b)
        self.size += len(b)


def _resource(path: str, sha: str, size: int) -> dict[str, Any]:
    return {"name": os.path.basename(path).lower(), "path": path, "hash": f"sha256:{sha}", "bytes": size}


def write_wacz(out: Path, warcs: Sequence[tuple[str, Path]], chains: Sequence[Mapping[str, Any]], *,
               pages: Iterable[Mapping[str, str]], created: float, software: str, title: str) -> Path:
    """Writes the WACZ at ``out`` from record-compressed WARC files (name in the bundle, path on disk), the
    chains' summary and the pages (url, ts); returns ``out``. OSError as the disk gives it; ValueError for a WARC
    file that is not one."""
    import zipfile

    stamp = datetime.datetime.fromtimestamp(created, datetime.UTC).timetuple()[:6]
    resources: list[dict[str, Any]] = []
    lines: list[str] = []
    tmp = out.with_name(f".{out.name}.part")
    try:
        with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
            for name, path in warcs:
                entry = f"archive/{name}"
                with open(path, "rb") as src:
                    for offset, length, head in scan_members(src):
                        line = cdxj_line(head, offset, length, name)
                        if line is not None:
                            lines.append(line)
                    src.seek(0)
                    info = zipfile.ZipInfo(entry, stamp)
                    info.compress_type = zipfile.ZIP_STORED
                    with zf.open(info, "w", force_zip64=True) as dst:
                        h = _Hashing(dst)
                        while chunk := src.read(_CHUNK):
                            h.write(chunk)
                resources.append(_resource(entry, h.sha.hexdigest(), h.size))
            page_list = list(pages)
            small = {
                "indexes/index.cdxj": "".join(f"{x}\n" for x in sorted(lines)).encode(),
                "pages/pages.jsonl": "".join(f"{x}\n" for x in pages_lines(page_list)).encode(),
                CHAINS_PATH: json.dumps(list(chains), indent=2, ensure_ascii=False).encode(),
            }
            for path_, data in small.items():
                info = zipfile.ZipInfo(path_, stamp)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
                resources.append(_resource(path_, hashlib.sha256(data).hexdigest(), len(data)))
            package = datapackage(resources, created=iso_now(created), software=software, title=title,
                                  main_page=page_list[0] if len(page_list) == 1 else None)
            for path_, data in (("datapackage.json", package),
                                ("datapackage-digest.json",
                                 json.dumps({"path": "datapackage.json",
                                             "hash": f"sha256:{hashlib.sha256(package).hexdigest()}"},
                                            indent=2).encode())):
                info = zipfile.ZipInfo(path_, stamp)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
