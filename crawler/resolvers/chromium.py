"""One headless Chromium process: started by us, driven over the DevTools protocol, killed by us.

The worker starts Debian's ``chromium`` itself (rather than letting a driver start it) so that it owns the
process: its id, its process group, its fresh profile directory, and the exact switches it runs with. Playwright
then drives it over the DevTools protocol (``connect_over_cdp``); its own browser download is never used.

The switches keep the browser from talking to anybody on its own: no update checks, no sync, no metrics, no
proxy discovery, no first-run pages. The DevTools endpoint listens on loopback, on a port the OS picks, and the
profile directory is new for every start and removed after.

A crashed or hung browser is killed with its whole process tree (the group it leads, and any descendant that
left it) and a new one started; ``rss`` measures that tree, for the benchmark and the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Always passed: headless, no network of its own, DevTools on loopback only.
BASE_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--no-pings",
    "--no-first-run", "--no-default-browser-check", "--no-proxy-server", "--disable-extensions",
    "--disable-dev-shm-usage", "--mute-audio", "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
)
# For a browser that must reach nothing but this machine (the test suite's and the benchmarks'): every name
# resolves to nothing, so only addresses given as 127.0.0.1 are reachable.
LOOPBACK_ONLY_ARGS = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",)
_PR_SET_PDEATHSIG = 1
PROFILE_PREFIX = "crawler-chromium-"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserStartError(Exception):
    """The browser could not be started or connected to: a fault of this node, not of any page."""


def find_executable(configured: str | None) -> str:
    """The configured executable (a path or a name on PATH), else the first Chromium found on PATH."""
    for name in ([configured] if configured else EXECUTABLES):
        found = shutil.which(name)
        if found:
            return found
    wanted = configured or " or ".join(EXECUTABLES)
    raise BrowserStartError(f"no browser executable: {wanted} not found (install Debian's chromium)")


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc (Linux); [] when root is gone."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after its last ")" are fixed.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    if not os.path.exists(f"/proc/{root}"):
        return []
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
    return total


class ChromiumProcess:
    """A started browser and the Playwright Browser connected to it."""

    def __init__(self, proc: asyncio.subprocess.Process, profile: Path, browser: Any) -> None:
        self.proc, self.profile, self.browser = proc, profile, browser
        self.pages = 0                # pages opened in it, for recycling
        self.closed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None and self.browser.is_connected()

    def rss(self) -> int:
        return rss_bytes(tree_pids(self.pid))

    @classmethod
    async def start(cls, playwright: Any, executable: str, extra_args: Sequence[str], *,
                    timeout: float = 30.0) -> ChromiumProcess:
        profile = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=PROFILE_PREFIX))
        args = [executable, *BASE_ARGS, f"--user-data-dir={profile}", *extra_args, "about:blank"]
        try:
            stderr = await asyncio.to_thread(open, profile / "chromium.log", "wb")
            try:
                proc = await asyncio.create_subprocess_exec(
                    *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
                    start_new_session=True,   # its own process group: one signal reaches every helper
                    preexec_fn=_die_with_parent)
            finally:
                stderr.close()
        except OSError as exc:
            await asyncio.to_thread(shutil.rmtree, profile, True)
            raise BrowserStartError(f"cannot start {executable}: {exc}") from None
        try:
            port = await _devtools_port(proc, profile, timeout)
            browser = await playwright.chromium.connect_over_cdp(f"http://127.0.0.1:{port}",
                                                                 timeout=timeout * 1000)
        except BaseException as exc:
            tail = await asyncio.to_thread(_log_tail, profile / "chromium.log")
            await _kill(proc, profile)
            if isinstance(exc, Exception):
                raise BrowserStartError(f"{executable} did not come up: {exc}; log: {tail}") from None
            raise
        log.info("browser started: %s (pid %d)", executable, proc.pid)
        return cls(proc, profile, browser)

    async def close(self, timeout: float = 5.0) -> None:
        """Polite close first; whatever is left (a hung browser, helpers) is killed. Once."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.browser.close(), timeout)
        await _kill(self.proc, self.profile)


async def _devtools_port(proc: asyncio.subprocess.Process, profile: Path, timeout: float) -> int:
    # Chromium writes the port it bound to this file once DevTools is listening; there is no event to await
    # from another process's file, so it is polled, briefly.
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise BrowserStartError(f"exited with status {proc.returncode}")
        text = await asyncio.to_thread(_read, port_file)
        first = text.split("\n", 1)[0].strip()
        if first.isdigit():
            return int(first)
        try:
            await asyncio.wait_for(proc.wait(), 0.05)
        except TimeoutError:
            pass
    raise BrowserStartError(f"no DevTools port within {timeout:.0f} s")


async def _kill(proc: asyncio.subprocess.Process, profile: Path) -> None:
    # Only while the browser is not yet reaped: until then its id (and so its group's) cannot be anybody
    # else's. Helpers of a browser that already died notice it and exit by themselves.
    if proc.returncode is None:
        pids = tree_pids(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:       # helpers that left the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()
    await asyncio.to_thread(shutil.rmtree, profile, True)


def sweep_stale_profiles(root: Path | None = None, *, max_age: float = 3600.0) -> int:
    """Remove the profile directories of browsers that died without their worker cleaning up (a worker killed
    by SIGKILL or a power cut). Chromium's SingletonLock names the host and the browser's process id; a
    directory is stale when that process is gone, or, with no lock, when it is older than ``max_age``.
    Returns how many were removed. Blocking: run it in a thread."""
    root = Path(root or tempfile.gettempdir())
    host = socket.gethostname()
    removed = 0
    for path in root.glob(f"{PROFILE_PREFIX}*"):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            lock = path / "SingletonLock"
            if lock.is_symlink():
                lock_host, _, pid = os.readlink(lock).rpartition("-")
                if lock_host != host or not pid.isdigit() or _alive(int(pid)):
                    continue
            elif time.time() - path.stat().st_mtime < max_age:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills the browser if the worker dies, even by SIGKILL, so no
    headless browser outlives the process that started it (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path) -> str:
    return " | ".join(_read(path).strip().splitlines()[-3:])[-500:]
