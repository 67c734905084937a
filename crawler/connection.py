"""The thin asyncio shell around protocol.py that both daemons use: read frames, write frames.

Socket errors are mapped here, once: whatever the OS or asyncio raises on a read or write becomes
ConnectionClosed, so the daemons tell only two peer failures apart: ConnectionClosed (gone) and
p.ProtocolError (broke the protocol).

Frames sent without waiting (send_nowait) are gathered until the event loop's turn ends and written in one
call: a master answering a burst of a worker's frames (grants, assignments) makes one write system call per
connection per turn, not one per frame.

Once the handshake is done, `start_session` turns on the frames' tags both ways (protocol.py computes and checks
them): each write is sealed as it is queued, so the tags follow the order the bytes go out in.
"""

from __future__ import annotations

import asyncio

from crawler import protocol as p

READ_CHUNK = 256 * 1024


class ConnectionClosed(ConnectionError):
    """The peer closed the connection or the socket failed."""


class FramedConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame: int,
                 recv_limit: int | None = None) -> None:
        """max_frame bounds what we send and, once `recv_limit` is lifted (None), what we read."""
        self.reader = reader
        self.writer = writer
        self.max_frame = max_frame
        self._decoder = p.FrameDecoder(max_frame)
        self.recv_limit = recv_limit
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._out: list[bytes] = []   # frames queued this turn of the loop, written by _flush at its end
        self._sealer: p.FrameSealer | None = None

    @property
    def recv_limit(self) -> int | None:
        return self._recv_limit

    @recv_limit.setter
    def recv_limit(self, limit: int | None) -> None:
        """A lower frame limit for reading (before the peer proved the secret); None: max_frame."""
        self._recv_limit = limit
        self._decoder.max_frame = self.max_frame if limit is None else min(limit, self.max_frame)

    def start_session(self, keys: p.SessionKeys) -> None:
        """Every frame from here on, both ways, carries its tag: call it right after the Welcome was sent (master)
        or checked (worker), before any other frame."""
        self._sealer = keys.sealer()
        keys.authenticate(self._decoder)

    async def recv(self) -> p.Message:
        """The next message; ProtocolError if the peer broke the protocol, ConnectionClosed at EOF.

        Messages are decoded one at a time, as asked for: bytes a peer sends ahead (before it may) are never
        turned into objects before the state that must refuse them has seen the first."""
        while (m := self._decoder.next_message()) is None:
            # Before authentication read no more than a frame or two at a time.
            chunk = READ_CHUNK if self._recv_limit is None else 2 * (self._recv_limit + p.HEADER_SIZE)
            try:
                data = await self.reader.read(chunk)
            except (OSError, ConnectionError) as e:
                raise ConnectionClosed(str(e) or type(e).__name__) from None
            if not data:
                raise ConnectionClosed("peer closed the connection")
            self._decoder.feed(data)
        return m

    async def send(self, *msgs: p.Message) -> None:
        self.send_nowait(*msgs)
        self._flush()
        await self.drain()

    async def send_bytes(self, frames: bytes) -> None:
        """Frames already encoded (the caller checked them against the limit)."""
        self._write(frames)
        self._flush()
        await self.drain()

    def send_bytes_nowait(self, frames: bytes) -> None:
        """send_bytes() without waiting for the peer."""
        self._write(frames)

    def send_nowait(self, *msgs: p.Message) -> None:
        """Queue bytes without waiting for the peer; callers bound what they queue (credit, batches)."""
        self._write(b"".join(p.encode(m, self.max_frame) for m in msgs))

    def _write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionClosed("connection is closing")
        if self._sealer is not None:
            data = self._sealer.seal(data)
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        """Write what this turn queued, in one call. A write that fails here has no caller left to tell: the
        connection's reader sees it end (a transport that a failed write or a reset closed makes uvloop raise
        RuntimeError, hence the check first)."""
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        if self.writer.is_closing():
            return
        try:
            self.writer.write(data)
        except (OSError, ConnectionError):
            self.writer.transport.abort()

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (OSError, ConnectionError) as e:
            raise ConnectionClosed(str(e) or type(e).__name__) from None

    def abort(self) -> None:
        """Drop the connection at once, without flushing (a peer we will not wait for)."""
        self.writer.transport.abort()

    async def close(self) -> None:
        if self.writer.is_closing():
            return
        self._flush()   # what was queued goes out before the close
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (TimeoutError, OSError, ConnectionError):
            pass
