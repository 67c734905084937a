"""The master's door and the wire, against the real daemons as processes on loopback.

- A stranger that opens connections without end, from its own address (127.0.0.2), holds only its own share of
  the handshake slots: a worker that starts (or restarts) during the attack joins at once.
- A relay on the path between a real worker and the real master (a small TCP proxy on loopback) that injects a
  frame or replays one after the handshake: the frame fails its tag, that connection closes with one log line,
  the injected Assign is never fetched, and the worker connects again and finishes the crawl.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Callable

import pytest

from crawler import protocol as p
from crawler.master.server import ADMISSION
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(120)

ATTACKER = "127.0.0.2"      # loopback too: the whole 127.0.0.0/8 is this machine


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=6)


# ------------------------------------------------------------------------------------------ the handshake slots
class Flood:
    """Opens connections to addr from ATTACKER without pause, `width` at a time, and holds each one open saying
    nothing until the master closes it."""

    def __init__(self, addr: str, width: int = 8) -> None:
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.opened = 0
        self.held: set[asyncio.StreamWriter] = set()
        self._tasks = [asyncio.ensure_future(self._open_forever()) for _ in range(width)]

    async def _open_forever(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port, local_addr=(ATTACKER, 0))
            except OSError:
                await asyncio.sleep(0.001)     # refused: the attacker tries again at once, as a real one would
                continue
            self.opened += 1
            self.held.add(writer)
            asyncio.ensure_future(self._hold(reader, writer))

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.read()                 # until the master closes it
        self.held.discard(writer)
        writer.close()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in list(self.held):
            w.close()


async def test_a_worker_joins_at_once_while_one_source_floods_the_handshake_slots(tmp_path):
    config = cluster.master_config(tmp_path, ["http://127.0.0.1:9/"], ["w1"], exit_when_done=False)
    master = await cluster.start_master(config, tmp_path)
    addr = cluster.master_addr(config)
    flood = Flood(addr)
    worker = None
    try:
        # The attack is on: far more connections than there are slots in all, refused or evicted at once.
        await cluster.until(lambda: flood.opened > 4 * ADMISSION.total, 30, "the flood to open its connections")
        worker = await cluster.start_worker(addr, "w1", tmp_path)
        await cluster.until(lambda: master.log().count("worker w1 joined") == 1, 15,
                            "w1 to join during the flood")
        # A worker restarted during the attack gets back in as quickly.
        await worker.stop()
        await cluster.until(lambda: "worker w1 disconnected" in master.log(), 10, "w1 to leave")
        worker = await cluster.start_worker(addr, "w1", tmp_path)
        await cluster.until(lambda: master.log().count("worker w1 joined") == 2, 15,
                            "w1 to join again during the flood")
        opened = flood.opened
        await cluster.until(lambda: flood.opened > opened + 50, 30, "the flood to go on")
    finally:
        await flood.stop()
        if worker is not None:
            await worker.stop()
        await master.stop()
    mlog = master.log()
    assert master.proc.returncode == 0, mlog[-3000:]
    # Refusals and evictions are said once in a while, not once a connection: the lines naming the attacker are
    # the periodic count and those of the connections it still held at the end.
    assert 1 <= mlog.count("unauthenticated connections refused") <= 5, mlog[-3000:]
    assert mlog.count(ATTACKER) <= ADMISSION.per_source + 5, mlog[-3000:]


# ------------------------------------------------------------------------------------------ the relay
Tamper = Callable[[int, bytes, int, bytes], bytes]     # (connection, direction, frame number, frame) -> bytes out


class Relay:
    """A TCP proxy on loopback between workers and the master that passes whole frames on, each through
    `tamper`. It knows the framing: two handshake frames each way, then each frame followed by its tag."""

    def __init__(self, master: str, tamper: Tamper) -> None:
        host, port = master.rsplit(":", 1)
        self.master = (host, int(port))
        self.tamper = tamper
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _connection(self, wr: asyncio.StreamReader, ww: asyncio.StreamWriter) -> None:
        n, self.connections = self.connections, self.connections + 1
        mr, mw = await asyncio.open_connection(*self.master)
        pipes = [asyncio.ensure_future(self._pipe(n, p.TO_MASTER, wr, mw)),
                 asyncio.ensure_future(self._pipe(n, p.TO_WORKER, mr, ww))]
        self._pipes.update(pipes)
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for t in pipes:
            t.cancel()
        for w in (ww, mw):
            w.close()

    async def _pipe(self, n: int, direction: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        buf, count = bytearray(), 0
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                buf += data
                while len(buf) >= p.HEADER_SIZE:
                    size = p.HEADER_SIZE + struct.unpack_from(">I", buf)[0] + (p.TAG_SIZE if count >= 2 else 0)
                    if len(buf) < size:
                        break
                    frame = bytes(buf[:size])
                    del buf[:size]
                    writer.write(self.tamper(n, direction, count, frame))
                    count += 1
                await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._pipes:
            t.cancel()


INJECTED = "/injected-by-the-relay.html"


def inject_assign(site_url: str) -> Tamper:
    def tamper(n: int, direction: bytes, count: int, frame: bytes) -> bytes:
        if n == 0 and direction == p.TO_WORKER and count == 2:
            # After the first session frame, an Assign of the relay's own, tagged as well as it can.
            forged = p.encode(p.Assign((p.Task(2**40, site_url + INJECTED, 0),)))
            return frame + forged + os.urandom(p.TAG_SIZE)
        return frame
    return tamper


def replay_to(side: bytes) -> Tamper:
    def tamper(n: int, direction: bytes, count: int, frame: bytes) -> bytes:
        if n == 0 and direction == side and count == 2:
            return frame + frame            # the first session frame, twice
        return frame
    return tamper


@pytest.mark.parametrize("attack", ["inject an Assign", "replay to the worker", "replay to the master"])
async def test_a_relay_that_injects_or_replays_a_frame_is_cut_off_and_the_worker_reconnects(site, tmp_path,
                                                                                          attack):
    site_dir, manifest = site
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        tamper = {"inject an Assign": inject_assign(server.url), "replay to the worker": replay_to(p.TO_WORKER),
                  "replay to the master": replay_to(p.TO_MASTER)}[attack]
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"],
                                       crawl={"max_depth": manifest.max_depth + 3})
        master = await cluster.start_master(config, tmp_path)
        relay = Relay(cluster.master_addr(config), tamper)
        worker = await cluster.start_worker(await relay.start(), "w1", tmp_path)
        try:
            # The crawl ends (the master exits when it is done): through the relay's second connection.
            assert await master.wait(60) == 0, master.log()[-3000:]
        finally:
            await worker.stop()
            await master.stop()
            await relay.close()
        gets = [e.path for e in server.log if e.method == "GET"]
    mlog, wlog = master.log(), worker.log()
    assert relay.connections >= 2 and wlog.count("connected to master") >= 2, wlog[-3000:]
    assert INJECTED not in gets
    html = [path for path in manifest.pages if path.endswith(".html")]
    assert not [path for path in html if path not in gets]
    if attack == "replay to the master":
        said = [line for line in mlog.splitlines() if "wrong tag" in line]
        assert len(said) == 1 and "worker w1" in said[0] and "frame 1 of the session" in said[0], mlog[-3000:]
    else:
        said = [line for line in wlog.splitlines() if "wrong tag" in line]
        assert len(said) == 1 and "master broke the protocol" in said[0], wlog[-3000:]
        assert "frame 1 of the session" in said[0]
