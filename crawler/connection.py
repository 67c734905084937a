"""The thin asyncio shell around protocol.py that both daemons use: read frames, write frames."""

from __future__ import annotations

import asyncio

from crawler import protocol as p

READ_CHUNK = 256 * 1024


class ConnectionClosed(ConnectionError):
    """The connection ended (the peer closed it, or it was closed already): caught wherever a ConnectionError is."""


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
        self._write(frames)
        await self.writer.drain()

    def send_nowait(self, *msgs: p.Message) -> None:
        """Queue bytes without waiting for the peer; callers bound what they queue (credit, batches)."""
        self._write(b"".join(p.encode(m, self.max_frame) for m in msgs))

    def _write(self, data: bytes) -> None:
        # A transport that a failed write or the peer's reset already closed makes uvloop raise RuntimeError,
        # not a connection error: turn it into the error every caller handles.
        if self.writer.is_closing():
            raise ConnectionClosed("connection closed")
        self.writer.write(data)

    async def close(self) -> None:
        if self.writer.is_closing():
            return
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (TimeoutError, OSError, ConnectionError):
            pass
