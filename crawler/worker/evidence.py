"""A worker's answer to the master's EvidenceAsk: the chains' records from its archive, sent in pieces.

The records are gathered off the event loop into a file beside the archive (the archive index read twice, the
records copied, each stored file streamed into its response record), capped by ``evidence_max_bytes``; then the
file goes to the master in EvidenceRecords pieces that fit the frame limit, each send waiting for the connection
to drain, so an answer of any size holds neither memory nor the connection's other messages for long. The chains'
JSON (steps, times, stored files, pages) follows; the last piece says so. One ask is answered at a time: the
session answers another while one runs with an error at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from crawler import protocol as p
from crawler.archive import evidence as ev
from crawler.items import MAX_TEXT

log = logging.getLogger(__name__)
# Room in a frame beside a piece's bytes (the message's other fields, the msgpack headers).
_FRAME_ROOM = 512
BUSY = "another evidence request is being answered on this node"


def piece_size(max_frame: int) -> int:
    return max(1, min(p.MAX_EVIDENCE_CHUNK, max_frame - _FRAME_ROOM))


def prepare(data_dir: Path, ask: p.EvidenceAsk, max_bytes: int) -> tuple[Path | None, bytes]:
    """(the WARC file of the chains' records or None, the chains' JSON). Blocking: run in a thread."""
    index = ev.open_index(data_dir)
    chains = ev.find_chains(index, ask.wanted, ask.known)
    records = ask.records
    if not records:
        return None, json.dumps({"chains": ev.summaries(index, chains), "pages": []}).encode()
    fd, name = tempfile.mkstemp(prefix=".evidence-", suffix=".warc.gz", dir=data_dir)
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            chain_summaries, pages = ev.collect(index, [c for c in chains if c.found], data_dir, fh,
                                                max_bytes=max_bytes)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    # The items this node has nothing of keep their place (the master merges the nodes' answers by position).
    found = iter(chain_summaries)
    ordered: list[dict[str, Any]] = [next(found) if c.found else ev.summary(c, {}, {}) for c in chains]
    return path, json.dumps({"chains": ordered, "pages": pages}).encode()


def _discard(work: asyncio.Future[tuple[Path | None, bytes]]) -> None:
    if not work.cancelled() and work.exception() is None and (path := work.result()[0]) is not None:
        path.unlink(missing_ok=True)


async def answer(send: Callable[[p.Message], Awaitable[None]], ask: p.EvidenceAsk, data_dir: Path, *,
                 max_bytes: int, max_frame: int) -> None:
    """Answers one ask through ``send`` (which waits for the connection to drain)."""
    req = ask.request
    work = asyncio.ensure_future(asyncio.to_thread(prepare, data_dir, ask, max_bytes))
    try:
        path, chains = await asyncio.shield(work)
    except asyncio.CancelledError:   # the session ended: the thread's file goes when it is done
        work.add_done_callback(_discard)
        raise
    except (ev.EvidenceError, OSError, ValueError, zlib.error) as e:   # a damaged record is a ValueError/zlib.error
        log.warning("evidence request %d: %s", req, e)
        await send(p.EvidenceRecords(req, p.EVIDENCE_CHAINS, last=True, error=str(e)[:MAX_TEXT]))
        return
    except Exception as e:    # a fault of ours: said to the master, the session goes on
        log.exception("evidence request %d failed", req)
        await send(p.EvidenceRecords(req, p.EVIDENCE_CHAINS, last=True, error=f"the node failed: {e}"[:MAX_TEXT]))
        return
    size = piece_size(max_frame)
    try:
        if path is not None:
            with open(path, "rb") as fh:
                while chunk := await asyncio.to_thread(fh.read, size):
                    await send(p.EvidenceRecords(req, p.EVIDENCE_WARC, chunk))
        for i in range(0, max(len(chains), 1), size):
            await send(p.EvidenceRecords(req, p.EVIDENCE_CHAINS, chains[i:i + size], last=i + size >= len(chains)))
    finally:
        if path is not None:
            path.unlink(missing_ok=True)
    log.info("evidence request %d answered: %d items", req, len(ask.wanted))
