"""Attacks on the master's port, against the real master as a process on loopback, while a real worker crawls.

Each test shows three things besides the attack's own outcome: the legitimate worker keeps working (its
heartbeats on time: the master never declares it dead, the worker never loses the master, it joins once),
the master's memory stays bounded (VmRSS from /proc, sampled all along), and no state is lost (every page of
the site fetched, nothing left queued or leased, the catalogue strict JSON).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack
import pytest

from crawler import protocol as p
from crawler.master.server import ADMISSION, HANDSHAKE_TIMEOUT
from crawler.master.store import MasterStore
from testkit import cluster, sitegen, siteserver
from tests.fakes.rawpeer import RawPeer

pytestmark = pytest.mark.timeout(240)
# What the master may grow by, from the worker's join to the end, while it crawls the site and is attacked.
# (Unbounded decoding used to take it to gigabytes.)
RSS_GROWTH_LIMIT = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=60)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class RssWatch:
    """Samples a process's resident memory until stopped; the peak is what counts."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline = rss_bytes(pid)
        self.peak = self.baseline
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, AssertionError):
                return
            await asyncio.sleep(0.05)     # the sampling period of the peak memory measured, not a wait for anything

    def stop(self) -> None:
        self._task.cancel()


def crawl_state(tmp: Path) -> dict:
    store = MasterStore.open_readonly(tmp / "master" / "master.db")
    try:
        return store.status()
    finally:
        store.db.close()


def finished(tmp: Path, pages: int) -> bool:
    """Every page done and every download they started reported (a page reports before its downloads end)."""
    st = crawl_state(tmp)
    states = st["states"]
    return (states.get("queued", 0) == 0 and states.get("leased", 0) == 0 and states.get("done", 0) >= pages
            and st.get("downloads_pending", 0) == 0)


Attack = Callable[[str, Path], Awaitable[None]]


async def crawl_under_attack(site, tmp: Path, attack: Attack, *, before_worker: Attack | None = None) -> str:
    """Crawls the site with worker w1 while `attack` runs against the master (node x is the attacker's id
    when it needs one). Returns the master's log."""
    site_dir, manifest = site
    html = [path for path in manifest.pages if path.endswith(".html")]
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.1}, record_log=True)
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp, [server.url + "/"], ["w1", "x"], exit_when_done=False,
                                       crawl={"max_depth": manifest.max_depth + 3})
        master = await cluster.start_master(config, tmp)
        worker = None
        watch = RssWatch(master.proc.pid)
        try:
            addr = cluster.master_addr(config)
            if before_worker is not None:
                await before_worker(addr, tmp)
            worker = await cluster.start_worker(addr, "w1", tmp, extra=["--concurrency", "2"])
            await cluster.until(lambda: "worker w1 joined" in master.log(), 60, "w1 to join")
            await attack(addr, tmp)
            await cluster.until(lambda: finished(tmp, len(html)), 180, "the crawl to finish")
        finally:
            watch.stop()
            if worker is not None:
                await worker.stop()
            await master.stop()
        log = list(server.log)
    mlog = master.log()
    assert master.proc.returncode == 0, mlog[-3000:]
    # The legitimate worker kept its one connection, with heartbeats on time both ways.
    assert "declaring it dead" not in mlog and mlog.count("worker w1 joined") == 1, mlog[-3000:]
    wlog = worker.log()
    lost = [line for line in wlog.splitlines() if "master lost" in line and "worker stopping" not in line]
    assert not lost and wlog.count("connected to master") == 1, wlog[-3000:]
    # Memory stayed bounded.
    growth = watch.peak - watch.baseline
    print(f"master RSS: {watch.baseline / 2**20:.1f} MiB at the join, peak {watch.peak / 2**20:.1f} MiB")
    assert growth < RSS_GROWTH_LIMIT, f"master RSS grew by {growth / 2**20:.0f} MiB"
    # No state lost: every page fetched, nothing queued or leased, the catalogue complete and strict JSON.
    gets = Counter(e.path for e in log if e.method == "GET")
    assert not [path for path in html if not gets[path]]
    states = crawl_state(tmp)["states"]
    assert states.get("leased", 0) == 0 and states.get("queued", 0) == 0, states
    rows = [json.loads(line, parse_constant=_refuse_constant)
            for line in (tmp / "master" / "catalog.jsonl").read_text().splitlines()]
    assert {r["url"] for r in rows} >= {server.url + a.url for a in manifest.audio if a.url}
    return mlog


def _refuse_constant(name: str) -> float:
    raise AssertionError(f"catalog.jsonl holds {name}: not strict JSON")


async def closed_soon(peers: list[RawPeer], timeout: float) -> int:
    """How many of the peers the master closed within timeout."""
    return sum(await asyncio.gather(*(peer.closed_by_peer(timeout) for peer in peers)))


# ------------------------------------------------------------------------------------------------ attacks
def _nested(depth: int, map_: bool) -> bytes:
    # One byte a level: [[[...]]] or {"": {"": ...}}, the cheapest bytes for the most objects.
    return (b"\x81\xa0" * (depth // 2) + b"\x80") if map_ else (b"\x91" * depth + b"\x90")


async def nested_containers_before_auth(addr: str, tmp: Path) -> None:
    for round_ in range(5):
        peers = await asyncio.gather(*(RawPeer.connect(addr) for _ in range(40)))
        for i, peer in enumerate(peers):
            payload = _nested(p.PRE_AUTH_MAX_FRAME - 2, map_=bool(i % 2))[:p.PRE_AUTH_MAX_FRAME]
            # A frame the size of the pre-auth limit, then as many as the socket takes: only the first is read.
            peer.send_raw((struct.pack(">I", len(payload)) + payload) * 50)
        assert await closed_soon(peers, 30) == len(peers)
        for peer in peers:
            peer.close()


async def oversized_frames_before_auth(addr: str, tmp: Path) -> None:
    peers = await asyncio.gather(*(RawPeer.connect(addr) for _ in range(50)))
    for i, peer in enumerate(peers):
        size = (p.PRE_AUTH_MAX_FRAME + 1, 16 * 1024 * 1024, 0xFFFFFFFF)[i % 3]
        peer.send_raw(struct.pack(">I", size) + _nested(60_000, map_=False))
    assert await closed_soon(peers, 30) == len(peers)
    # A valid Hello followed by a flood instead of waiting for the Challenge (from a source of its own: the 50
    # connections above used up their source's rate).
    peer = await RawPeer.connect(addr, source="127.0.0.3")
    peer.send(p.Hello("x", p.PROTOCOL_VERSION, 4, p.new_nonce()))
    peer.send_raw(b"\0" * (1 << 20))
    assert isinstance(await peer.recv(), p.Challenge)
    assert await peer.closed_by_peer(30)


async def idle_unauthenticated_connections(addr: str, tmp: Path) -> None:
    # Connections that never say a word, all from one source: it holds its share of the handshake slots (each new
    # one replaces its oldest), the excess is closed at once, and the slots are freed by the handshake timeout.
    # The worker, already in, is not affected.
    loop = asyncio.get_running_loop()
    started = loop.time()
    peers = [await RawPeer.connect(addr) for _ in range(3 * ADMISSION.total)]
    opened = loop.time()

    async def closed_at(peer: RawPeer) -> float:
        assert await peer.closed_by_peer(3 * HANDSHAKE_TIMEOUT), "an idle connection outlived the timeout"
        return loop.time()

    times = await asyncio.gather(*(closed_at(peer) for peer in peers))
    # A held connection lives at least HANDSHAKE_TIMEOUT from its accept (no earlier than `started`).
    early = sum(t < started + HANDSHAKE_TIMEOUT - 0.5 for t in times)
    assert early >= len(peers) - ADMISSION.per_source, (early, opened - started)     # refused or evicted at once
    assert len(times) - early <= ADMISSION.per_source                                # held, until the timeout
    for peer in peers:
        peer.close()


async def _wrong_secret_once(addr: str) -> None:
    peer = await RawPeer.connect(addr)
    guess = p.WorkerHandshake(b"a guess at the secret, long and varied 0123456789", "x", 4)
    peer.send(guess.hello())
    challenge = await peer.recv()
    assert challenge == p.Challenge(challenge.nonce)        # a nonce: nothing the secret was used on
    peer.send(guess.receive_challenge(challenge))
    assert await peer.recv() == p.Refused("authentication failed", p.AUTH_FAILED)
    assert await peer.closed_by_peer(10)
    peer.close()


async def wrong_secret(addr: str, tmp: Path) -> None:
    for _ in range(20):           # guessing online costs a round trip and a log line each; no proof comes back
        await _wrong_secret_once(addr)


async def replayed_handshake(addr: str, tmp: Path) -> None:
    secret = cluster.read_secret(tmp / "secret")
    # A real exchange, recorded (by an id the master does not know: it is refused after proving the secret).
    first = await RawPeer.connect(addr)
    hs = p.WorkerHandshake(secret, "ghost", 4)
    hello = hs.hello()
    first.send(hello)
    auth = hs.receive_challenge(await first.recv())
    first.send(auth)
    refused = await first.recv()
    assert isinstance(refused, p.Refused) and "not in the master's nodes list" in refused.reason
    first.close()
    # The recorded Hello and Auth sent again: the master's nonce is new, so the MAC no longer fits.
    replay = await RawPeer.connect(addr)
    replay.send(hello)
    assert isinstance(await replay.recv(), p.Challenge)
    replay.send(auth)
    assert await replay.recv() == p.Refused("authentication failed", p.AUTH_FAILED)
    assert await replay.closed_by_peer(10)
    # The recorded Hello twice on one connection, without waiting: the second is out of order.
    burst = await RawPeer.connect(addr)
    burst.send(hello, hello, auth)
    assert await burst.closed_by_peer(10)


def _report_frame(lease: int, url: str, **change) -> bytes:
    fields = {"lease": lease, "url": url, "status": "done", "http_status": 200, "final_url": url,
              "content_type": "text/html", "size": 10, "error": None, "links": [], "audio": [], "cut": 0}
    fields.update(change)
    payload = msgpack.packb([p.Report.TYPE, [list(fields.values())]], use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def bad_report(frame: Callable[[int, str], bytes]) -> tuple[Attack, Attack]:
    """The attacker holds the seed page's lease (it joined first, as node x) and reports it with a bad value
    once the real worker is in; the master closes that connection, and the page goes back to the frontier."""
    state: dict = {}

    async def join_and_take(addr: str, tmp: Path) -> None:
        evil = await RawPeer.join(addr, "x", 4, cluster.read_secret(tmp / "secret"))
        evil.keep_alive(0.5)
        evil.send(p.Credit(4))
        state["evil"], state["tasks"] = evil, await evil.first_tasks(timeout=30)

    async def report(addr: str, tmp: Path) -> None:
        evil, tasks = state["evil"], state["tasks"]
        evil.send_frames(b"".join(frame(t.lease, t.url) for t in tasks))
        assert await evil.closed_by_peer(30)
        evil.close()

    return join_and_take, report


def _uint64_size_frame(lease: int, url: str) -> bytes:
    # msgpack cannot carry 2**70 at all: the largest integer a peer can send is 2**64 - 1 (uint64, 0xcf).
    frame = _report_frame(lease, url, size=2**32)   # encoded as uint64 (0xcf + 8 bytes): patched below
    marker = b"\xcf" + struct.pack(">Q", 2**32)
    assert marker in frame
    return frame.replace(marker, b"\xcf" + struct.pack(">Q", 2**64 - 1))


async def test_nested_containers_before_auth(site, tmp_path):
    mlog = await crawl_under_attack(site, tmp_path, nested_containers_before_auth)
    assert "payload is not a message array" in mlog or "undecodable" in mlog


async def test_oversized_frames_before_auth(site, tmp_path):
    mlog = await crawl_under_attack(site, tmp_path, oversized_frames_before_auth)
    assert f"exceeds the limit of {p.PRE_AUTH_MAX_FRAME}" in mlog


async def test_many_idle_unauthenticated_connections(site, tmp_path):
    mlog = await crawl_under_attack(site, tmp_path, idle_unauthenticated_connections)
    assert "unauthenticated connections refused" in mlog
    assert "no handshake within" in mlog


async def test_wrong_secret(site, tmp_path):
    mlog = await crawl_under_attack(site, tmp_path, wrong_secret)
    assert mlog.count("failed authentication") == 20 and "worker x joined" not in mlog


async def test_replayed_handshake(site, tmp_path):
    mlog = await crawl_under_attack(site, tmp_path, replayed_handshake)
    assert "failed authentication" in mlog and "unexpected Hello" in mlog and "worker x joined" not in mlog


async def test_report_with_an_integer_past_64_bits(site, tmp_path):
    join, report = bad_report(_uint64_size_frame)
    mlog = await crawl_under_attack(site, tmp_path, report, before_worker=join)
    assert "worker x (" in mlog and f"outside 0..{p.INT64_MAX}" in mlog


async def test_report_with_nan_floats(site, tmp_path):
    audio = [{"url": "http://a/x.mp3", "page": "http://a/", "duration": math.nan, "extra": {"score": math.inf}}]
    join, report = bad_report(lambda lease, url: _report_frame(lease, url, audio=audio))
    mlog = await crawl_under_attack(site, tmp_path, report, before_worker=join)
    assert "not a finite number" in mlog


async def test_report_with_huge_strings(site, tmp_path):
    huge = {"links": ["http://127.0.0.1/" + "x" * (p.MAX_TEXT + 1)], "error": "e" * (p.MAX_TEXT + 1)}
    join, report = bad_report(lambda lease, url: _report_frame(lease, url, **huge))
    mlog = await crawl_under_attack(site, tmp_path, report, before_worker=join)
    assert "undecodable payload" in mlog
