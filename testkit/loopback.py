"""An in-process loopback site: aiohttp's low-level server on 127.0.0.1 at a free port, its requests answered by
the subclass's ``_handle``. ``async with Site(...) as site`` serves it at ``site.url`` until the block ends."""

from __future__ import annotations

from typing import Self

from aiohttp import web


class LoopbackSite:
    url: str = ""
    _runner: web.ServerRunner | None = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError

    async def start(self) -> Self:
        server = web.Server(self._handle)
        self._runner = web.ServerRunner(server, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
