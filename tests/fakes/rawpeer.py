"""A peer that speaks the wire protocol by hand to a real master: for flow-control and attack tests.

It sends whatever it is told, frames or raw bytes, in any order, and reads frames back with the same
sans-IO decoder the daemons use (no limits of its own beyond the default frame size). Once it has joined, its
frames carry their tags as a worker's do (send, send_frames); send_raw still writes bytes as they are.
"""

from __future__ import annotations

import asyncio
import time

from crawler import protocol as p


class RawPeer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = p.FrameDecoder()
        self._beats: asyncio.Task | None = None
        self.welcome: p.Welcome | None = None
        self.sealer: p.FrameSealer | None = None

    @classmethod
    async def connect(cls, addr: str, source: str | None = None) -> RawPeer:
        """`source`: the local address to connect from (another loopback address is another source to the
        master's handshake slots)."""
        host, port = addr.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port),
                                                  local_addr=None if source is None else (source, 0)))

    @classmethod
    async def join(cls, addr: str, node: str, capacity: int, secret: bytes,
                   keep_fragment: tuple[str, ...] = ()) -> RawPeer:
        """Connect and complete the handshake as `node` (checking the master's proof); its Welcome is kept."""
        w = await cls.connect(addr)
        hs = p.WorkerHandshake(secret, node, capacity, keep_fragment=keep_fragment)
        w.send(hs.hello())
        w.send(hs.receive_challenge(await w.recv()))
        w.welcome = hs.receive_welcome(await w.recv())
        keys = hs.session_keys()
        w.sealer = keys.sealer()
        keys.authenticate(w.decoder)
        return w

    def send(self, *msgs: p.Message) -> None:
        self.send_frames(b"".join(p.encode(m) for m in msgs))

    def send_frames(self, frames: bytes) -> None:
        """Whole frames, tagged once the peer has joined: what a worker holding the secret could send."""
        self.writer.write(frames if self.sealer is None else self.sealer.seal(frames))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = 10) -> p.Message:
        while (m := self.decoder.next_message()) is None:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed")
            self.decoder.feed(data)
        return m

    async def closed_by_peer(self, timeout: float) -> bool:
        """True once the master has closed the connection (reads EOF or a reset) within timeout."""
        try:
            while True:
                if not await asyncio.wait_for(self.reader.read(65536), timeout):
                    return True
        except TimeoutError:       # before OSError, of which it is a subclass
            return False
        except (ConnectionError, OSError):
            return True

    def keep_alive(self, interval: float) -> None:
        """Send heartbeats every `interval` seconds until closed, as a live worker does."""
        async def beat() -> None:
            while not self.writer.is_closing():
                self.send(p.Heartbeat(time.time(), ()))
                await asyncio.sleep(interval)
        self._beats = asyncio.ensure_future(beat())

    async def first_tasks(self, timeout: float) -> tuple[p.Task, ...]:
        """The tasks of the next Assign (heartbeats skipped)."""
        while not isinstance(m := await self.recv(timeout), p.Assign):
            pass
        return m.tasks

    async def tasks(self, quiet: float) -> list[p.Task]:
        """Every task the master sends until it has been quiet for `quiet` seconds (heartbeats ignored)."""
        out = []
        while True:
            try:
                m = await self.recv(timeout=quiet)
            except TimeoutError:
                return out
            if isinstance(m, p.Assign):
                out.extend(m.tasks)

    def close(self) -> None:
        if self._beats is not None:
            self._beats.cancel()
        self.writer.close()
