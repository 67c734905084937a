"""The thin asyncio shell around protocol.py that both daemons use: read frames, write frames."""

from __future__ import annotations

import asyncio

from crawler import protocol as p

READ_CHUNK = 256 * 1024


class ConnectionClosed(Exception):
    pass


class FramedConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame: int) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame = max_frame
        self._decoder = p.FrameDecoder(max_frame)
        self._pending: list[p.Message] = []
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def recv(self) -> p.Message:
        """The next message; ProtocolError if the peer broke the protocol, ConnectionClosed at EOF."""
        while not self._pending:
            m = self._decoder.next_message()
            if m is not None:
                return m
            data = await self.reader.read(READ_CHUNK)
            if not data:
                raise ConnectionClosed("peer closed the connection")
            self._decoder.feed(data)
            self._pending = self._decoder.messages()
            self._pending.reverse()
        return self._pending.pop()

    async def send(self, *msgs: p.Message) -> None:
        self.send_nowait(*msgs)
        await self.writer.drain()

    async def send_bytes(self, frames: bytes) -> None:
        """Frames already encoded (the caller checked them against the limit)."""
        self.writer.write(frames)
        await self.writer.drain()

    def send_nowait(self, *msgs: p.Message) -> None:
        """Queue bytes without waiting for the peer; callers bound what they queue (credit, batches)."""
        self.writer.write(b"".join(p.encode(m, self.max_frame) for m in msgs))

    async def close(self) -> None:
        if self.writer.is_closing():
            return
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (TimeoutError, OSError, ConnectionError):
            pass
