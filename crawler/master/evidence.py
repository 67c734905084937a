"""The master's evidence requests: items' archived chains gathered from the nodes that hold them, written as WACZ.

`crawler-master evidence` queues a steering command (crawler/master/steering.py). The running master asks every
connected node (EvidenceAsk: a chain's records may lie on more than one, a page visited by one and its audio
fetched by another) and refuses at once, in one line, when the catalogue names a node that is not connected as
holding an item: its records are on that node's disk, for `crawler-worker evidence --data-dir` there.

Each node answers in EvidenceRecords pieces: its WARC pieces go to a file of their own under
``<data dir>/evidence/`` (written as they come, nothing held in memory), then its chains' JSON (bounded). Once every
node asked has answered (or failed, or gone), the request is finished off the event loop: the nodes' chains merged
by item, the WACZ written from the nodes' WARC files (crawler/archive/wacz.py), or for --show the chains as text;
the steering command is answered with the file's path or the text. A request no node finishes within ``timeout``
fails. ``EvidenceDesk`` holds the requests in flight and is synchronous: pieces in, requests that are complete out.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from crawler import protocol as p
from crawler.archive import evidence as ev

WORK_DIR = "evidence"
DEFAULT_TIMEOUT = 1800.0                 # seconds an evidence request may take in all
MAX_CHAINS_BYTES = 64 * 1024 * 1024      # of one node's chains JSON
DEFAULT_MAX_BYTES = 64 * 1024 ** 3       # of one request's records, all nodes together


@dataclass
class NodeAnswer:
    warc: Path
    fh: IO[bytes] | None = None
    size: int = 0
    chains: bytearray = field(default_factory=bytearray)
    done: bool = False
    error: str | None = None

    def end(self, error: str | None = None) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        self.done = True
        if error is not None and self.error is None:
            self.error = error


@dataclass
class Request:
    number: int
    command: Path                 # the steering command to answer
    wanted: tuple[str, ...]
    out: Path | None              # the WACZ to write; None: the chains as text
    started: float
    answers: dict[str, NodeAnswer]

    @property
    def complete(self) -> bool:
        return all(a.done for a in self.answers.values())


def _file_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node)[:100] or "node"


class EvidenceDesk:
    def __init__(self, work_dir: Path, *, timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_chains_bytes: int = MAX_CHAINS_BYTES) -> None:
        self.work_dir = work_dir
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_chains_bytes = max_chains_bytes
        self.requests: dict[int, Request] = {}
        self._next = 1

    def open(self, command: Path, wanted: Sequence[str], out: Path | None, nodes: Sequence[str], now: float,
             known: ev.Known = ()) -> tuple[Request, list[tuple[str, p.EvidenceAsk]]]:
        """A new request to ``nodes``: the request and the asks to send (one per node). ``known``: what the
        catalogue says of the items, (item's place in ``wanted``, page, audio URL)."""
        number, self._next = self._next, self._next + 1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # A folder of its own, never one a stopped master left behind.
        folder = Path(tempfile.mkdtemp(prefix=f"{number}-", dir=self.work_dir))
        answers = {n: NodeAnswer(folder / f"{i:03d}-{_file_name(n)}.warc.gz") for i, n in enumerate(nodes)}
        req = Request(number, command, tuple(wanted), out, now, answers)
        self.requests[number] = req
        ask = p.EvidenceAsk(number, tuple(wanted), records=out is not None,
                            known=tuple(known)[:p.MAX_EVIDENCE_KNOWN])
        return req, [(n, ask) for n in nodes]

    def piece(self, node: str, msg: p.EvidenceRecords) -> Request | None:
        """A piece of a node's answer; the request if it is complete now. Pieces of a request no longer waited
        for (it expired, or failed) are dropped."""
        req = self.requests.get(msg.request)
        a = req.answers.get(node) if req is not None else None
        if req is None or a is None or a.done:
            return None
        if msg.error is not None:
            a.end(msg.error)
        elif msg.part == p.EVIDENCE_WARC:
            if a.chains:
                a.end("sent records after its chains")
            elif self._total(req) + len(msg.chunk) > self.max_bytes:
                a.end(f"the evidence is larger than the master's limit of {self.max_bytes} bytes")
            else:
                try:
                    if a.fh is None:
                        a.fh = open(a.warc, "wb")
                    a.fh.write(msg.chunk)
                    a.size += len(msg.chunk)
                except OSError as e:
                    a.end(f"the master cannot keep its records: {e}")
        elif len(a.chains) + len(msg.chunk) > self.max_chains_bytes:
            a.end(f"its chains are larger than {self.max_chains_bytes} bytes")
        else:
            a.chains += msg.chunk
        if msg.last and not a.done:
            a.end()
        return req if req.complete else None

    @staticmethod
    def _total(req: Request) -> int:
        return sum(a.size for a in req.answers.values())

    def gone(self, node: str) -> list[Request]:
        """The node disconnected: its answers in flight fail; the requests complete now."""
        out = []
        for req in self.requests.values():
            a = req.answers.get(node)
            if a is not None and not a.done:
                a.end(f"node {node} disconnected before it answered")
                if req.complete:
                    out.append(req)
        return out

    def expire(self, now: float) -> list[Request]:
        out = []
        for req in self.requests.values():
            if not req.complete and now - req.started > self.timeout:
                for node, a in req.answers.items():
                    if not a.done:
                        a.end(f"node {node} did not answer within {self.timeout:.0f} s")
                out.append(req)
        return out

    def clear_leftovers(self) -> int:
        """Removes what requests of an earlier run left in the work folder (a master stopped or killed while
        nodes were answering); returns how many folders went. Only the running master calls it, before it takes
        requests: a stopped one's command line must not touch a running one's files."""
        gone = 0
        with contextlib.suppress(FileNotFoundError):
            for folder in self.work_dir.iterdir():
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)
                    gone += 1
        return gone

    def close(self, req: Request) -> None:
        """The request is answered: its files go."""
        self.requests.pop(req.number, None)
        for a in req.answers.values():
            a.end()
            a.warc.unlink(missing_ok=True)
        if req.answers:
            with contextlib.suppress(OSError):
                next(iter(req.answers.values())).warc.parent.rmdir()


def finish(req: Request, *, created: float) -> dict[str, Any]:
    """The steering answer of a complete request: the WACZ written (its path), the text, or the error. Blocking
    (it writes the bundle): run off the event loop."""
    from crawler.archive.wacz import write_wacz

    failed = [f"{node}: {a.error}" for node, a in req.answers.items() if a.error]
    if failed:
        return {"error": "evidence: " + "; ".join(failed)}
    try:
        parts = [json.loads(a.chains) for a in req.answers.values()]
        merged = ev.merge([part["chains"] for part in parts])
        pages = [page for part in parts for page in part["pages"]]
        if len(merged) != len(req.wanted):
            raise ValueError("chains of other items")
        lost = [c["wanted"] for c in merged if not c["steps"]]
    except (ValueError, KeyError, TypeError) as e:
        return {"error": f"evidence: a node's chains cannot be read: {e}"}
    nodes = sorted(req.answers)
    if req.out is None:
        return {"text": "\n".join(ev.show(c) for c in merged), "missing": lost, "nodes": nodes}
    if lost:
        return {"error": f"evidence: no archived records of {', '.join(lost)} on the connected nodes "
                         f"({', '.join(nodes)})"}
    # Each node's records as archive/<node>.warc.gz (with its place in front when two names would clash).
    names = [a.warc.name[4:] for a in req.answers.values()]
    warcs = [(name if names.count(name) == 1 else a.warc.name, a.warc)
             for name, a in zip(names, req.answers.values()) if a.size]
    try:
        write_wacz(req.out, warcs, merged, pages=pages, created=created, software=ev.software(),
                   title=ev.bundle_title(req.wanted))
    except (OSError, ValueError) as e:
        return {"error": f"evidence: cannot write {req.out}: {e}"}
    return {"path": str(req.out), "items": len(merged), "records": len({st["record_id"] for c in merged
                                                                        for st in c["steps"]}),
            "nodes": [n for n, a in req.answers.items() if a.size]}
