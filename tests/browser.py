"""A headless Chromium for the status page test: the system's browser, started so that it resolves no name and
connects nowhere but loopback, driven over the DevTools protocol with Playwright (connect_over_cdp)."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser")

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--no-pings",
    "--no-first-run", "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
)


def chromium_path() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no chromium on PATH: scripts/setup.sh installs it (apt-get install -y chromium)")


@asynccontextmanager
async def chromium(timeout: float = 60) -> AsyncIterator[str]:
    """Start Chromium with a fresh profile; yields its DevTools WebSocket URL; kills it and its profile after."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    proc = await asyncio.create_subprocess_exec(
        chromium_path(), *FLAGS, f"--user-data-dir={profile}", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        seen = []
        async with asyncio.timeout(timeout):
            while True:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise AssertionError(f"chromium exited before listening: {''.join(seen)[-2000:]}")
                seen.append(line)
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                if m:
                    break
        # Keep reading its stderr so the pipe never fills and stalls the browser.
        drain = asyncio.ensure_future(proc.stderr.read())
        yield m.group(1)
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
