"""One port on several loopback addresses: a fake site that must be more than one host (127.0.0.1 and 127.0.0.2)
listens at the same port on each."""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable, Sequence

TRIES = 20


async def on_one_port(hosts: Sequence[str], listen: Callable[[str, int], Awaitable[int]],
                      undo: Callable[[], Awaitable[None]]) -> int:
    """``listen(host, port)`` on every host at one port, and that port: the first host at a port the kernel picks
    (port 0; listen returns the one it got), the others at the same. The kernel's pick on the first address can be
    another test's on the next: then ``undo()`` closes what was opened and another port is tried, TRIES times
    at most."""
    for attempt in range(TRIES):
        port = 0
        try:
            for host in hosts:
                port = await listen(host, port)
            return port
        except OSError as e:
            await undo()
            if e.errno != errno.EADDRINUSE or attempt == TRIES - 1:
                raise
    raise AssertionError("not reached")
