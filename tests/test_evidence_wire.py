"""Evidence over the master/worker connection: the worker's answer in pieces under the frame limit, the master's
desk that gathers the nodes' answers and writes one WACZ from them, and a real master in this process asking a
worker spoken by hand (tests/fakes/rawpeer.py) for the records, refusing at once for a node that is away."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import random
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from crawler import protocol as p
from crawler.archive import Exchange, evidence
from crawler.items import AudioItem
from crawler.master import steering
from crawler.master.evidence import EvidenceDesk, finish
from crawler.worker import evidence as worker_evidence
from tests.fakes.warcs import WarcArchive, crawl_song, store_audio
from tests.test_master_fragment_rules import running_master

PAGE = "http://music.test/song/1"
API = "http://api.music.test/play?id=1"
AUDIO = "http://cdn.music.test/a/1.mp3"
BODY = b"ID3" + random.Random(1).randbytes(16 * 1024)   # does not compress: many pieces
T0 = 1_780_000_000.0
WACZ = Path(sys.executable).parent / "wacz"


def valid(path: Path) -> bool:
    r = subprocess.run([str(WACZ), "validate", "-f", str(path)], capture_output=True, text=True, check=False)
    return r.returncode == 0


@pytest.fixture
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[WarcArchive, Path]]:
    """Two nodes' data dirs: `a` fetched the page and its API call, `b` downloaded the audio (a chain split over
    two nodes, as when the download went to another node)."""
    out = {}
    for name in ("a", "b"):
        data = tmp_path / name
        out[name] = (WarcArchive(data / "archive"), data)
    a, b = out["a"][0], out["b"][0]
    host = ((b"Host", b"music.test"),)
    a.exchange(Exchange("page", "GET", PAGE, host, 200, ((b"Content-Type", b"text/html"),), b"<html>", T0))
    a.exchange(Exchange("api", "GET", API, host, 200, (), b'{"url": "x"}', T0 + 1, page=PAGE))
    rel, sha = store_audio(out["b"][1], BODY)
    rid = b.exchange(Exchange("audio", "GET", AUDIO, host, 200, ((b"Content-Type", b"audio/mpeg"),), b"", T0 + 2,
                              page=PAGE, payload_digest=f"sha256:{sha}", payload_size=len(BODY)))
    b.metadata(AUDIO, (("stored-file", rel), ("sha256", sha), ("size", str(len(BODY))),
                       ("content-type", "audio/mpeg"), ("page", PAGE)),
               refers_to=rid, page=PAGE, role="audio", now=T0 + 3, sha256=sha)
    by_dir = {data: archive for archive, data in out.values()}
    monkeypatch.setattr(evidence, "open_index", lambda d: by_dir[d])
    return out


async def answer_of(data: Path, ask: p.EvidenceAsk, max_frame: int = p.DEFAULT_MAX_FRAME,
                    max_bytes: int = 1 << 40) -> list[p.EvidenceRecords]:
    sent: list[p.EvidenceRecords] = []

    async def send(m: p.Message) -> None:
        assert isinstance(m, p.EvidenceRecords)
        assert len(p.encode(m, max_frame)) <= max_frame + p.HEADER_SIZE
        sent.append(m)

    await worker_evidence.answer(send, ask, data, max_bytes=max_bytes, max_frame=max_frame)
    return sent


async def test_a_workers_answer_comes_in_pieces_that_fit_the_frame_and_leaves_no_file(nodes):
    _, data = nodes["b"]
    pieces = await answer_of(data, p.EvidenceAsk(5, (AUDIO,)), max_frame=4096)
    assert all(m.request == 5 for m in pieces) and [m.last for m in pieces].count(True) == 1 and pieces[-1].last
    kinds = [m.part for m in pieces]
    assert kinds == sorted(kinds, key=lambda k: k != p.EVIDENCE_WARC) and kinds.count(p.EVIDENCE_WARC) > 4
    warc = b"".join(m.chunk for m in pieces if m.part == p.EVIDENCE_WARC)
    assert BODY in gzip.decompress(warc)
    chains = json.loads(b"".join(m.chunk for m in pieces if m.part == p.EVIDENCE_CHAINS))
    assert chains["chains"][0]["audio"] == [AUDIO] and chains["chains"][0]["files"][0]["bytes"] == "included"
    assert not list(data.glob(".evidence-*"))


async def test_a_show_ask_gets_the_chains_only_and_a_failure_one_piece(nodes):
    _, data = nodes["a"]
    pieces = await answer_of(data, p.EvidenceAsk(1, (PAGE,), records=False))
    assert [m.part for m in pieces] == [p.EVIDENCE_CHAINS] and pieces[0].last
    [c] = json.loads(pieces[0].chunk)["chains"]
    assert [st["role"] for st in c["steps"]] == ["page", "page", "api", "api"]
    pieces = await answer_of(nodes["b"][1], p.EvidenceAsk(2, (AUDIO,)), max_bytes=1000)
    assert len(pieces) == 1 and pieces[0].last and "larger than the limit" in (pieces[0].error or "")


async def test_the_desk_merges_two_nodes_answers_into_one_valid_wacz(nodes, tmp_path):
    desk = EvidenceDesk(tmp_path / "work")
    out = tmp_path / "e.wacz"
    # Node a holds the page alone: only the catalogue ties it to the audio URL (the ask carries that).
    assert not evidence.find_chains(nodes["a"][0], [AUDIO])[0].found
    req, asks = desk.open(tmp_path / "cmd.json", [AUDIO], out, ["a", "b"], now=0.0, known=[(0, PAGE, AUDIO)])
    assert [n for n, _ in asks] == ["a", "b"]
    assert asks[0][1] == p.EvidenceAsk(req.number, (AUDIO,), known=((0, PAGE, AUDIO),))
    done = None
    for node in ("a", "b"):
        for m in await answer_of(nodes[node][1], asks[0][1], max_frame=8192):
            done = desk.piece(node, m)
    assert done is req
    result = finish(req, created=T0)
    desk.close(req)
    assert result == {"path": str(out), "items": 1, "records": 7, "nodes": ["a", "b"]}
    assert valid(out)
    assert list((tmp_path / "work").iterdir()) == []
    with zipfile.ZipFile(out) as zf:
        assert {"archive/a.warc.gz", "archive/b.warc.gz"} <= set(zf.namelist())
        [c] = json.loads(zf.read("evidence/chains.json"))
        assert [(st["role"], st["type"]) for st in c["steps"]] == [
            ("page", "response"), ("page", "request"), ("api", "response"), ("api", "request"),
            ("audio", "revisit"), ("audio", "request"), ("audio", "metadata")]
        assert c["pages"] == [PAGE] and c["files"][0]["bytes"] == "included"


async def test_the_desk_says_which_node_failed_went_or_was_silent(nodes, tmp_path):
    desk = EvidenceDesk(tmp_path / "work", timeout=10)
    req, asks = desk.open(tmp_path / "cmd.json", [AUDIO], tmp_path / "e.wacz", ["a", "b"], now=0.0)
    assert desk.piece("a", p.EvidenceRecords(req.number, p.EVIDENCE_CHAINS, last=True, error="disk gone")) is None
    assert desk.gone("b") == [req]
    assert finish(req, created=T0) == {"error": "evidence: a: disk gone; b: node b disconnected before it answered"}
    desk.close(req)
    req, _ = desk.open(tmp_path / "cmd.json", [AUDIO], None, ["a"], now=100.0)
    assert desk.expire(105.0) == [] and desk.expire(111.0) == [req]
    assert "did not answer within 10 s" in finish(req, created=T0)["error"]
    assert desk.piece("a", p.EvidenceRecords(req.number, p.EVIDENCE_CHAINS, b"x", last=True)) is None


async def test_the_desk_caps_what_the_nodes_send(nodes, tmp_path):
    desk = EvidenceDesk(tmp_path / "work", max_bytes=100, max_chains_bytes=10)
    req, _ = desk.open(tmp_path / "c.json", [AUDIO], tmp_path / "e.wacz", ["a", "b"], now=0.0)
    desk.piece("a", p.EvidenceRecords(req.number, p.EVIDENCE_WARC, b"x" * 101))
    desk.piece("b", p.EvidenceRecords(req.number, p.EVIDENCE_CHAINS, b"x" * 11))
    assert req.complete
    error = finish(req, created=T0)["error"]
    assert "larger than the master's limit of 100 bytes" in error and "chains are larger than 10 bytes" in error


# --------------------------------------------------------------------------------------------- a real master
async def wait_answer(path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while (r := steering.take_answer(path)) is None:
        assert time.monotonic() < deadline, "no answer"
        await asyncio.sleep(0.05)
    return r


async def test_a_running_master_asks_the_connected_node_and_writes_the_wacz(nodes, tmp_path):
    archive, data = nodes["b"]
    crawl_song(archive, data, page=PAGE + "x", api=API + "x", audio=AUDIO + "x", body=BODY + b"x", t=T0 + 10)
    stale = tmp_path / "m" / "evidence" / "3-abc"       # what a master killed mid-request left
    stale.mkdir(parents=True)
    (stale / "000-a.warc.gz").write_bytes(b"x" * 1000)
    async with running_master(tmp_path) as (master, addr, secret):
        assert not stale.exists()                        # removed when the master took over its data dir
        from tests.fakes.rawpeer import RawPeer

        peer = await RawPeer.join(addr, "a", 4, secret)
        out = tmp_path / "bundle.wacz"
        cmd = steering.submit(master.cfg.data_dir, {"command": "evidence", "items": [AUDIO + "x"],
                                                    "out": str(out)})
        ask = None
        while not isinstance(ask, p.EvidenceAsk):
            ask = await peer.recv(10)
        assert ask.wanted == (AUDIO + "x",) and ask.records
        for m in await answer_of(data, ask, max_frame=64 * 1024):
            peer.send(m)
        r = await wait_answer(cmd)
        assert r == {"path": str(out), "items": 1, "records": 7, "nodes": ["a"]}
        assert valid(out)
        # --show: the chains as text.
        cmd = steering.submit(master.cfg.data_dir, {"command": "evidence", "items": [AUDIO + "x"], "out": None})
        ask = None
        while not isinstance(ask, p.EvidenceAsk):
            ask = await peer.recv(10)
        assert not ask.records
        for m in await answer_of(data, ask):
            peer.send(m)
        r = await wait_answer(cmd)
        assert r["missing"] == [] and r["text"].splitlines()[1].startswith(f"  page {PAGE}x fetched at ")


async def test_a_holder_that_is_not_connected_is_said_in_one_line(nodes, tmp_path):
    async with running_master(tmp_path) as (master, addr, secret):
        from tests.fakes.rawpeer import RawPeer

        item = AudioItem(url=AUDIO, page=PAGE, status="ok", sha256="ab" * 32, size=3, path="audio/x.mp3")
        master.store.add_audio([{**item.catalogue_row(), "node": "c", "found_at": T0}])
        await RawPeer.join(addr, "a", 4, secret)
        for wanted in (AUDIO, PAGE, "ab" * 32):
            cmd = steering.submit(master.cfg.data_dir, {"command": "evidence", "items": [wanted], "out": None})
            r = await wait_answer(cmd)
            assert r == {"error": "evidence: the records of these items are on c, not connected now: on the node's "
                                  "machine run `crawler-worker evidence --data-dir DIR ...`"}
        cmd = steering.submit(master.cfg.data_dir, {"command": "evidence", "items": "x", "out": None})
        assert "expected 1 to" in (await wait_answer(cmd))["error"]


async def test_an_ask_past_the_frame_limit_is_refused_not_sent(nodes, tmp_path):
    async with running_master(tmp_path) as (master, addr, secret):
        from tests.fakes.rawpeer import RawPeer

        peer = await RawPeer.join(addr, "a", 4, secret)
        master.cfg = dataclasses.replace(master.cfg, max_frame=64 * 1024)     # a crawl with small frames
        long = [f"http://music.test/{i}/" + "x" * 1000 for i in range(100)]
        cmd = steering.submit(master.cfg.data_dir, {"command": "evidence", "items": long, "out": None})
        assert "too long for one request" in (await wait_answer(cmd))["error"]
        assert master.evidence.requests == {}
        peer.close()


async def test_an_answer_cut_off_by_the_end_of_its_session_leaves_no_file(nodes):
    _, data = nodes["b"]

    async def send(m: p.Message) -> None:
        await asyncio.sleep(10)

    task = asyncio.create_task(worker_evidence.answer(send, p.EvidenceAsk(1, (AUDIO,)), data, max_bytes=1 << 40,
                                                      max_frame=p.DEFAULT_MAX_FRAME))
    await asyncio.sleep(0)
    task.cancel()                      # while the records are gathered in a thread
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)           # the thread finishes its file meanwhile (a few KiB)
    for _ in range(100):
        if not list(data.glob(".evidence-*")):
            break
        await asyncio.sleep(0.02)
    assert not list(data.glob(".evidence-*"))
