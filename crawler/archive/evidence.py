"""The chain of an item, found through a node's archive index, shown as text or bundled as evidence.

An item is named by its audio URL, its page's URL or the stored file's sha256. Its chain is every record that
proves "this page, at this time, led to this address, which served these bytes":

- the page's own records (role "page", page ""): every visit of it the archive still holds;
- every record made for that page (page = its URL): resolver API calls, playlists, the browser's view, HLS
  segments;
- the audio exchanges of the item's address (all of them, in time order: a resumed download is several ranged
  exchanges) and the ``metadata`` record naming the stored file (path, sha256, size, content type).

Named by a page, the chain holds all the page's audio; named by an audio URL or a sha256, only that audio's records
(an album page's other songs are left out), with the pages that led to it.

``chain`` is pure (records in, chain out); ``find_chains`` runs it over an index in two passes that keep only the
chain's records, however large the index. ``collect`` writes the chains' records (each record's gzip member as
archived, byte for byte) into one record-compressed WARC stream, and for every stored file a ``response`` record
that carries its bytes (streamed from the data dir, checked against its sha256): the archive keeps the audio
response without its payload (the file is kept content-addressed beside it), and a bundle must prove the bytes.
That record has the archived response's HTTP headers and date, refers to it (``WARC-Refers-To``) and to its
request (``WARC-Concurrent-To``).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import re
import time
import uuid
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

from crawler.archive import RecordRef, writer
from crawler.archive.wacz import RecordHead, member_head

_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1024 * 1024
# A page's side records: what was fetched to resolve its audio.
SIDE_ROLES = ("api", "playlist", "browser", "segment")
# The HTTP headers a whole-file response cannot keep as they were: it carries the stored (decoded, whole) file.
_REWRITTEN = ("content-length", "content-range", "content-encoding", "transfer-encoding")


class EvidenceError(Exception):
    """An item's evidence cannot be made: nothing archived for it, a stored file that is not its bytes, too big."""


def is_sha256(s: str) -> bool:
    return _SHA256.fullmatch(s) is not None


def warc_time(date: str) -> float:
    """A WARC-Date as epoch seconds (fractions kept); 0.0 if it is not one."""
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?Z", date)
    if not m:
        return 0.0
    whole = calendar.timegm(tuple(int(x) for x in m.groups()[:6]) + (0, 0, 0))
    return whole + (float(m.group(7)) if m.group(7) else 0.0)


# What the master's catalogue knows of the items asked for: (the item's place in the list, a page, an audio URL).
Known = Sequence[tuple[int, str, str]]


def _order(r: RecordRef) -> tuple[float, str, int]:
    return warc_time(r.date), r.file, r.offset


# --------------------------------------------------------------------------------------------- the chain
@dataclass(frozen=True, slots=True)
class Chain:
    """The records of one item's chain, in time order (all of them: every visit, every exchange)."""

    wanted: str
    pages: tuple[str, ...]            # the pages that led to the audio (or the page wanted)
    audio: tuple[str, ...]            # the audio addresses of the chain
    records: tuple[RecordRef, ...]

    @property
    def found(self) -> bool:
        return bool(self.records)


@dataclass(frozen=True, slots=True)
class _Anchor:
    pages: frozenset[str]
    audio: frozenset[str]
    all_audio: bool                   # a page was wanted: every audio record of its pages belongs


def _places(names: Iterable[tuple[int, str]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, name in names:
        if name:
            out.setdefault(name, []).append(i)
    return out


def _anchors(refs: Iterable[RecordRef], wanted: Sequence[str], known: Known) -> list[_Anchor]:
    """Each item's pages and audio addresses: from ``known`` and from the records that name the item. One look-up
    a record, however many items are asked for."""
    pages: list[set[str]] = [set() for _ in wanted]
    audio: list[set[str]] = [set() for _ in wanted]
    for i, page, url in known:
        if 0 <= i < len(wanted):
            if page:
                pages[i].add(page)
            if url:
                audio[i].add(url)
    whole = [False] * len(wanted)
    by_name = _places(enumerate(wanted))
    by_sha = _places((i, w.lower()) for i, w in enumerate(wanted) if is_sha256(w.lower()))
    for ref in refs:
        if ref.role == "audio":
            for i in (*by_name.get(ref.target, ()), *(by_sha.get(ref.sha256, ()) if ref.sha256 else ())):
                audio[i].add(ref.target)
                if ref.page:
                    pages[i].add(ref.page)
        for i in (*by_name.get(ref.page, ()),
                  *(by_name.get(ref.target, ()) if ref.role == "page" and not ref.page else ())):
            pages[i].add(wanted[i])       # a page wanted: found by its own records or by those made for it
            whole[i] = True
    return [_Anchor(frozenset(p), frozenset(a), w) for p, a, w in zip(pages, audio, whole)]


def _belongs(ref: RecordRef, a: _Anchor) -> bool:
    if ref.role == "audio":
        return ref.target in a.audio or (a.all_audio and ref.page in a.pages)
    if not ref.page:
        return ref.role == "page" and ref.target in a.pages
    return ref.page in a.pages and ref.role in SIDE_ROLES


def _members(refs: Iterable[RecordRef], wanted: Sequence[str], anchors: Sequence[_Anchor]) -> list[Chain]:
    found: list[list[RecordRef]] = [[] for _ in wanted]
    # The anchors a record may belong to, found by its page or its target: one look-up a record.
    by_page = _places((i, pg) for i, a in enumerate(anchors) for pg in a.pages)
    by_audio = _places((i, u) for i, a in enumerate(anchors) for u in a.audio)
    for ref in refs:
        for i in {*by_page.get(ref.page or ref.target, ()), *by_audio.get(ref.target, ())}:
            if _belongs(ref, anchors[i]):
                found[i].append(ref)
    out = []
    for w, a, recs in zip(wanted, anchors, found):
        recs.sort(key=_order)
        audio = a.audio | {r.target for r in recs if r.role == "audio"}
        out.append(Chain(w, tuple(sorted(a.pages)), tuple(sorted(audio)), tuple(recs)))
    return out


def chain(refs: Iterable[RecordRef], wanted: str, known: Sequence[tuple[str, str]] = ()) -> Chain:
    """The chain of the item named ``wanted`` (audio URL, page URL or sha256) among ``refs``; ``known``: (page,
    audio URL) pairs of the item from elsewhere (the master's catalogue), for a chain that lies on two nodes."""
    many = refs if isinstance(refs, Collection) else list(refs)
    return _members(many, [wanted], _anchors(many, [wanted], [(0, pg, u) for pg, u in known]))[0]


class Index(Protocol):
    """A node's archive index: every RecordRef, and the bytes (the gzip member) of one."""

    def refs(self) -> Iterable[RecordRef]: ...

    def read(self, ref: RecordRef) -> bytes: ...


def find_chains(index: Index, wanted: Sequence[str], known: Known = ()) -> list[Chain]:
    """The chains of several items, in two passes over the index (keeping only the chains' records); ``known``:
    (item's place in ``wanted``, page, audio URL) from elsewhere, as ``chain`` takes them."""
    return _members(index.refs(), wanted, _anchors(index.refs(), wanted, known))


class WriterIndex:
    """The index the crawl's archive writer keeps in ``<data dir>/archive/`` (crawler/archive/writer.py)."""

    def __init__(self, archive_dir: Path) -> None:
        self.dir = archive_dir

    def refs(self) -> Iterator[RecordRef]:
        return writer.iter_index(self.dir)

    def read(self, ref: RecordRef) -> bytes:
        return writer.read_record(self.dir, ref)


def open_index(data_dir: Path) -> Index:
    """The archive index of a node's data dir (EvidenceError if it has none)."""
    archive = data_dir / "archive"
    if not archive.is_dir():
        raise EvidenceError(f"no archive in {data_dir} (is it a worker's data dir, with archiving on?)")
    return WriterIndex(archive)


# --------------------------------------------------------------------------------------------- reading heads
def heads(index: Index, records: Iterable[RecordRef]) -> dict[str, RecordHead]:
    """The heads of the records that say something about the chain (responses, metadata, resources)."""
    out: dict[str, RecordHead] = {}
    for r in records:
        if r.kind in ("response", "metadata", "resource", "revisit") and r.record_id not in out:
            out[r.record_id] = member_head(index.read(r))
    return out


# --------------------------------------------------------------------------------------------- as text
def _step_text(st: Mapping[str, Any]) -> str | None:
    role, kind, target, date = st["role"], st["type"], st["target"], st["date"]
    status = f" ({st['status']})" if st.get("status") is not None else ""
    answered = kind in ("response", "revisit")     # a revisit: the answer without its payload (kept apart)
    if answered and role == "page":
        return f"page {target} fetched at {date}{status}"
    if answered and role == "audio":
        return f"audio {target} at {date}{status}"
    if answered:
        return f"{role} call {target} at {date}{status}"
    if kind == "resource":
        return f"{role} {st.get('content_type') or 'resource'} of {target} at {date}"
    if kind == "metadata" and role == "audio":
        f = st.get("fields", {})
        return (f"stored {target} at {date}, sha256 {f.get('sha256', '?')}, size {f.get('size', '?')}, "
                f"stored as {f.get('stored-file', '?')}")
    return None


def show(s: Mapping[str, Any]) -> str:
    """A chain's summary as text, one step a line in time order: "page URL fetched at T (status)", "-> api call
    X at T (status)", "-> audio URL at T (status)", "-> stored URL at T, sha256 S, size N, stored as P"."""
    if not s["steps"]:
        return f"{s['wanted']}: no archived records"
    lines = [f"{s['wanted']}:"]
    for st in s["steps"]:
        text = _step_text(st)
        if text is not None:
            lines.append(f"  {'' if text.startswith('page ') else '-> '}{text}")
    for f in s.get("files", ()):
        if str(f.get("bytes", "")).startswith("missing"):
            lines.append(f"  !! the bytes of {f['target']} are {f['bytes']}")
    return "\n".join(lines)


def merge(answers: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The chains of the same items from several nodes (each node's list in the order asked) as one: a chain's
    records may lie on more than one node (a page visited by one, its audio copied from another)."""
    out: list[dict[str, Any]] = []
    for parts in zip(*answers):
        steps: dict[str, Mapping[str, Any]] = {}
        for part in parts:
            for st in part["steps"]:
                steps.setdefault(st["record_id"], st)
        out.append({"wanted": parts[0]["wanted"],
                    "pages": sorted({x for part in parts for x in part["pages"]}),
                    "audio": sorted({x for part in parts for x in part["audio"]}),
                    "steps": sorted(steps.values(), key=lambda st: warc_time(st["date"])),   # stable: a request first
                    "files": [f for part in parts for f in part.get("files", ())]})
    return out


# --------------------------------------------------------------------------------------------- a WARC of chains
def _record_id() -> str:
    return f"<urn:uuid:{uuid.uuid4()}>"


def _file_sha(path: Path, prefix: bytes) -> tuple[str, str, int]:
    """(sha256 of the file, sha256 of prefix + file, file size), read in chunks."""
    payload, block = hashlib.sha256(), hashlib.sha256(prefix)
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            payload.update(chunk)
            block.update(chunk)
            size += len(chunk)
    return payload.hexdigest(), block.hexdigest(), size


def whole_file_http(original: RecordHead | None, size: int, content_type: str) -> bytes:
    """The HTTP head of a whole stored file's response: the archived answer's status and headers, a partial
    answer made whole (206 -> 200), the headers that described other bytes kept as X-Archive-Orig-*."""
    if original is None or original.status is None:
        return (f"HTTP/1.1 200 OK\r\nContent-Type: {content_type or 'application/octet-stream'}\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()
    line = original.http_line
    if original.status == 206:
        line = f"{line.split(' ', 1)[0]} 200 OK"
    out = [line]
    for k, v in original.http:
        low = k.lower()
        if low == "content-length":
            continue              # the wire's, if it differed, is an X-Archive-Orig-Content-Length already
        out.append(f"X-Archive-Orig-{k}: {v}" if low in _REWRITTEN else f"{k}: {v}")
    out.append(f"Content-Length: {size}")
    return ("\r\n".join(out) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def whole_file_record(out: IO[bytes], path: Path, *, target: str, sha256: str, date: str, http_head: bytes,
                      refers_to: str, concurrent_to: str, page: str, stored_file: str, digest: str = "") -> int:
    """Writes one gzip member: a ``response`` record whose payload is the file at ``path`` (streamed, twice:
    once for the digests, once into the member). EvidenceError if the file's bytes are not ``sha256``.
    Returns the member's length."""
    payload_sha, block_sha, size = _file_sha(path, http_head)
    if payload_sha != sha256:
        raise EvidenceError(f"the stored file {stored_file} is not the bytes archived for {target} "
                            f"(sha256 {payload_sha}, archived {sha256})")
    headers = [("WARC-Type", "response"), ("WARC-Record-ID", _record_id()), ("WARC-Date", date),
               ("WARC-Target-URI", target), ("WARC-Refers-To", refers_to), ("WARC-Concurrent-To", concurrent_to),
               ("WARC-Crawler-Role", "audio"), ("WARC-Crawler-Page", page),
               ("WARC-Crawler-Stored-File", stored_file),
               ("Content-Type", "application/http;msgtype=response"),
               ("WARC-Payload-Digest", digest or f"sha256:{sha256}"),
               ("WARC-Block-Digest", f"sha256:{block_sha}"),
               ("Content-Length", str(len(http_head) + size))]
    head = ("WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers if v) + "\r\n").encode()
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    n = 0

    def put(b: bytes) -> None:
        nonlocal n
        if b:
            out.write(b)
            n += len(b)

    put(z.compress(head))
    put(z.compress(http_head))
    with open(path, "rb") as fh:
        read = 0
        while chunk := fh.read(_CHUNK):
            read += len(chunk)
            put(z.compress(chunk))
    if read != size:
        raise EvidenceError(f"the stored file {stored_file} changed while it was read")
    put(z.compress(b"\r\n\r\n"))
    put(z.flush())
    return n


def digest_hex(digest: str) -> str:
    """The hex of a "sha256:..." digest (hex or base32, as WARC files write them); "" for any other."""
    algo, _, value = digest.partition(":")
    if algo.lower() != "sha256":
        return ""
    if re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return value.lower()
    try:
        raw = base64.b32decode(value.upper() + "=" * (-len(value) % 8))
    except (binascii.Error, ValueError):
        return ""
    return raw.hex() if len(raw) == 32 else ""


def stored_path(data_dir: Path, rel: str) -> Path:
    """The stored file a metadata record names, refused if it would lie outside the data dir."""
    base = data_dir.resolve()
    p = (base / rel).resolve()
    if not rel or not p.is_relative_to(base) or p == base:
        raise EvidenceError(f"the stored file {rel!r} is not inside {data_dir}")
    return p


class _Counted:
    def __init__(self, out: IO[bytes], limit: int) -> None:
        self.out, self.limit, self.n = out, limit, 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        if self.n > self.limit:
            raise EvidenceError(f"the evidence is larger than the limit of {self.limit} bytes")
        self.out.write(b)
        return len(b)


def _page_ts(r: RecordRef) -> str:
    t = warc_time(r.date)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else r.date


def summary(c: Chain, got: Mapping[str, RecordHead], files: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The chain as JSON for the bundle's evidence/chains.json: each step with its time and record id; the audio
    files with their digest and where their bytes are in the bundle."""
    steps = []
    for r in c.records:
        head = got.get(r.record_id)
        step: dict[str, Any] = {"role": r.role, "type": r.kind, "target": r.target, "date": r.date,
                                "record_id": r.record_id}
        if r.refers_to:
            step["refers_to"] = r.refers_to
        if r.page:
            step["page"] = r.page
        if head is not None and head.status is not None:
            step["status"] = head.status
        if r.digest:
            step["payload_digest"] = r.digest
        if r.kind == "metadata" and head is not None:
            step["fields"] = head.fields()
        if r.kind == "resource" and head is not None:
            step["content_type"] = head.get("Content-Type")
        steps.append(step)
    return {"wanted": c.wanted, "pages": list(c.pages), "audio": list(c.audio), "steps": steps,
            "files": [files[r.record_id] for r in c.records if r.record_id in files]}


def pages_of(c: Chain) -> list[dict[str, str]]:
    """The bundle's pages (pages/pages.jsonl): each archived visit of the chain's pages."""
    return [{"url": r.target, "ts": _page_ts(r)} for r in c.records
            if r.role == "page" and r.kind == "response"]


def collect(index: Index, chains: Sequence[Chain], data_dir: Path, out: IO[bytes], *,
            max_bytes: int = 1 << 62, bytes_of_files: bool = True) -> tuple[list[dict[str, Any]],
                                                                           list[dict[str, str]]]:
    """Writes the chains' records into ``out`` (a record-compressed WARC stream), each record once, and after each
    stored file's metadata record a response record carrying the file (``bytes_of_files``). Returns the chains'
    summaries and the pages. EvidenceError past ``max_bytes`` or for a stored file that is not its bytes; a
    stored file that is gone is said in the summary (its archived digest still names the bytes)."""
    sink = _Counted(out, max_bytes)
    written: set[str] = set()
    files: dict[str, dict[str, Any]] = {}
    summaries, pages = [], []
    for c in chains:
        by_id = {r.record_id: r for r in c.records}
        got: dict[str, RecordHead] = {}
        for r in c.records:
            member = index.read(r)
            if r.kind in ("response", "metadata", "resource", "revisit"):
                got[r.record_id] = member_head(member)
            if r.record_id in written:
                continue
            written.add(r.record_id)
            sink.write(member)
            if bytes_of_files and r.kind == "metadata" and r.role == "audio":
                files[r.record_id] = _add_file(sink, r, got, by_id, index, data_dir)
        summaries.append(summary(c, got, files))
        pages += pages_of(c)
    return summaries, pages


def _add_file(sink: _Counted, meta: RecordRef, got: dict[str, RecordHead], by_id: Mapping[str, RecordRef],
              index: Index, data_dir: Path) -> dict[str, Any]:
    fields = got[meta.record_id].fields()
    sha = (fields.get("sha256") or meta.sha256).lower()
    rel = fields.get("stored-file", "")
    info: dict[str, Any] = {"target": meta.target, "sha256": sha, "stored_file": rel, "size": fields.get("size"),
                            "metadata_record": meta.record_id}
    original_ref = by_id.get(meta.refers_to)
    # The archived answer the metadata refers to is the file's own when it is an answer for the same address (a
    # download, its last ranged exchange); for a stream joined from segments it is the last segment's, which
    # says nothing of the whole file.
    same = original_ref is not None and original_ref.target == meta.target
    original = None
    if same and original_ref is not None:
        original = got.get(original_ref.record_id) or member_head(index.read(original_ref))
    digest_of_file = original_ref is not None and digest_hex(original_ref.digest) == sha
    if (original is not None and original.kind == "response" and original.payload_length > 0
            and digest_of_file):
        info["bytes"] = f"in the archived response {meta.refers_to}"     # archived with its payload
        return info
    # The request of the archived answer: named by the answer, or naming it.
    request = ""
    if same and original_ref is not None:
        request = original_ref.refers_to or next(
            (r.record_id for r in by_id.values() if r.kind == "request" and r.refers_to == meta.refers_to), "")
    try:
        path = stored_path(data_dir, rel)
        if not path.is_file():
            info["bytes"] = f"missing: {rel} is not in the data dir"
            return info
    except EvidenceError as e:
        info["bytes"] = f"missing: {e}"
        return info
    size = path.stat().st_size
    http_head = whole_file_http(original, size, fields.get("content-type", ""))
    start = sink.n
    whole_file_record(cast(IO[bytes], sink), path, target=meta.target, sha256=sha,
                      date=original_ref.date if same and original_ref else meta.date, http_head=http_head,
                      refers_to=meta.refers_to if same else meta.record_id, concurrent_to=request,
                      page=meta.page, stored_file=rel,
                      digest=original_ref.digest if digest_of_file and original_ref else "")
    info["bytes"] = "included"
    info["record_bytes"] = sink.n - start
    return info


def summaries(index: Index, chains: Sequence[Chain]) -> list[dict[str, Any]]:
    """The chains' summaries alone (no records copied, no stored file read): what --show prints."""
    return [summary(c, heads(index, c.records), {}) for c in chains]


def describe(index: Index, wanted: Sequence[str]) -> tuple[list[Chain], str]:
    """The chains of ``wanted`` and their text (for --show)."""
    chains = find_chains(index, wanted)
    return chains, "\n".join(show(s) for s in summaries(index, chains))


def software() -> str:
    from crawler import version

    return f"audio-crawler {version()}"


def missing(chains: Sequence[Chain]) -> list[str]:
    return [c.wanted for c in chains if not c.found]


def write_bundle(index: Index, data_dir: Path, wanted: Sequence[str], out: Path, *, now: float,
                 max_bytes: int = 1 << 62) -> list[Chain]:
    """The WACZ of the items' chains from one node's archive, at ``out``. EvidenceError when an item has no
    archived records (nothing is written then) or the evidence cannot be made."""
    import tempfile

    from crawler.archive.wacz import write_wacz

    chains = find_chains(index, wanted)
    if lost := missing(chains):
        raise EvidenceError(f"no archived records of {', '.join(lost)}")
    with tempfile.TemporaryDirectory(prefix=".evidence-", dir=out.parent) as tmp:
        warc = Path(tmp) / "data.warc.gz"
        with open(warc, "wb") as fh:
            chain_summaries, pages = collect(index, chains, data_dir, fh, max_bytes=max_bytes)
        write_wacz(out, [("data.warc.gz", warc)], chain_summaries, pages=pages, created=now,
                   software=software(), title=bundle_title(wanted))
    return chains


def bundle_title(wanted: Sequence[str]) -> str:
    return "Evidence: " + ", ".join(wanted[:3]) + (f" and {len(wanted) - 3} more" if len(wanted) > 3 else "")
