"""One headless Chromium process: started by us, driven over the DevTools protocol, killed by us.

The worker starts Debian's ``chromium`` itself (rather than letting a driver start it) so that it owns the
process: its id, its process group, its fresh profile directory, and the exact switches it runs with. Playwright
then drives it over the DevTools protocol (``connect_over_cdp``); its own browser download is never used.

The switches keep the browser from talking to anybody on its own: no update checks, no sync, no metrics, no
first-run pages. Every connection of a page goes through the worker's proxy (``browserproxy.py``) when one is
given, else nowhere but direct (``--no-proxy-server``: the tests' own browsers). The DevTools endpoint listens on
loopback, on a port the OS picks, and the profile directory is new for every start and removed after.

Chromium's sandbox stays on: the browser runs as an unprivileged user (``BrowserUser``, dropped to between fork
and exec), never as root and never with ``--no-sandbox``; its renderers are confined by the namespace and
seccomp sandbox on top of that. A V8 heap cap (``--js-flags=--max-old-space-size``) ends a page whose script
hoards memory; the resolver watches the whole tree's memory besides (``memory``).

A crashed or hung browser is killed with its whole process tree (the group it leads, and any descendant that
left it) and a new one started; ``rss`` measures that tree, for the benchmark and the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import tempfile
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Always passed: headless, sandboxed, no network of its own, DevTools on loopback only.
BASE_ARGS = (
    "--headless", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--no-pings",
    "--no-first-run", "--no-default-browser-check", "--disable-extensions",
    "--disable-dev-shm-usage", "--mute-audio", "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
)
# Switches that would turn the sandbox off or take the browser past the proxy: never passed, never let through.
FORBIDDEN_ARGS = frozenset({
    "--no-sandbox", "--disable-setuid-sandbox", "--disable-namespace-sandbox", "--disable-seccomp-filter-sandbox",
    "--no-zygote", "--single-process", "--in-process-gpu", "--proxy-server", "--proxy-bypass-list",
    "--no-proxy-server", "--proxy-pac-url", "--proxy-auto-detect", "--js-flags", "--user-data-dir",
    "--remote-debugging-port", "--remote-debugging-pipe", "--remote-debugging-address",
})
DEFAULT_USER = "crawler-browser"
_DEVTOOLS_LINE = re.compile(rb"DevTools listening on ws://[^:/]+:(\d+)/")
# For a browser that must reach nothing but this machine (the test suite's and the benchmarks'): every name
# resolves to nothing, so only addresses given as 127.0.0.1 are reachable.
LOOPBACK_ONLY_ARGS = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",)
_PR_SET_PDEATHSIG = 1
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
PROFILE_PREFIX = "crawler-chromium-"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserStartError(Exception):
    """The browser could not be started or connected to: a fault of this node, not of any page."""


@dataclass(frozen=True)
class BrowserUser:
    """The account the browser runs as. Never root: a page's exploit of the browser process then owns only an
    account that can read nothing of the worker's (its secret, its data directory)."""

    name: str
    uid: int
    gid: int

    @classmethod
    def lookup(cls, name: str) -> BrowserUser:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise BrowserStartError(f"no user {name!r} to run the browser as (scripts/setup.sh creates "
                                    f"{DEFAULT_USER!r}; or name an unprivileged user in browser.user)") from None
        if entry.pw_uid == 0:
            raise BrowserStartError(f"user {name!r} is root: the browser never runs as root")
        return cls(name, entry.pw_uid, entry.pw_gid)

    @property
    def switches(self) -> bool:
        """Whether starting the browser changes user (the worker runs as someone else, root typically)."""
        return self.uid != os.geteuid()

    def drop(self) -> None:
        """In the child before exec: this user's ids and no supplementary groups of the worker's."""
        if self.switches:
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)
            # A worker that is not root switches users with capabilities it was given (the systemd unit's
            # ambient CAP_SETUID ...); a change between two non-root users keeps them, so they go here, before
            # the exec that would hand them to the browser.
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
                raise OSError(ctypes.get_errno(), "cannot drop ambient capabilities")


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


def memory_by_process(pids: Sequence[int]) -> dict[int, int]:
    """Private memory (anonymous and shared-memory RSS: what scripts, decoded media and buffers take, not the
    binary's pages that every process maps) of each process."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                used = 0
                for line in fh:
                    if line.startswith((b"RssAnon:", b"RssShmem:")):
                        used += int(line.split()[1]) * 1024
                out[pid] = used
        except (OSError, ValueError):
            continue
    return out


def is_renderer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"--type=renderer" in fh.read()      # helpers rewrite their command line as one string
    except OSError:
        return False


class ChromiumProcess:
    """A started browser and the Playwright Browser connected to it. ``profile`` is the worker's directory for
    this browser: its log, and the user data directory (``profile/profile``) that belongs to the browser user."""

    def __init__(self, proc: asyncio.subprocess.Process, profile: Path, browser: Any,
                 user: BrowserUser | None = None) -> None:
        self.proc, self.profile, self.browser, self.user = proc, profile, browser, user
        self.pages = 0                # pages opened in it, for recycling
        self.worn = False             # a page crashed in it or was killed for memory: replace it
        self.closed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None and self.browser.is_connected()

    def rss(self) -> int:
        return rss_bytes(tree_pids(self.pid))

    def memory(self) -> dict[int, int]:
        """Private memory of each process of the tree (blocking: /proc; run it in a thread)."""
        return memory_by_process(tree_pids(self.pid)) if self.proc.returncode is None else {}

    def kill_process(self, pid: int) -> None:
        """Kill one process of this browser (a renderer over the memory bound). Blocking."""
        if self.proc.returncode is None and pid in tree_pids(self.pid):
            _signal([pid], None, self.user)

    @classmethod
    async def start(cls, playwright: Any, executable: str, extra_args: Sequence[str], *,
                    user: BrowserUser | None = None, proxy_port: int | None = None,
                    js_heap_mib: int | None = None, timeout: float = 30.0) -> ChromiumProcess:
        """Start the browser as ``user`` (None: the worker's own user, which must not be root), with every
        connection through the proxy on ``proxy_port`` (None: direct) and each page's V8 heap capped at
        ``js_heap_mib``."""
        if user is None and os.geteuid() == 0:
            raise BrowserStartError("the browser will not run as root: name an unprivileged user to run it as "
                                    f"(browser.user, default {DEFAULT_USER!r})")
        for arg in extra_args:
            if arg.split("=", 1)[0] in FORBIDDEN_ARGS:
                raise BrowserStartError(f"{arg!r} is not a switch the worker lets through")
        base = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=PROFILE_PREFIX))
        try:
            profile, child_makes = await asyncio.to_thread(_make_profile, base, user)
        except OSError as exc:
            await asyncio.to_thread(_remove, base, user)
            raise BrowserStartError(f"cannot prepare the browser's profile: {exc}") from None
        network = ([f"--proxy-server=http://127.0.0.1:{proxy_port}", "--proxy-bypass-list=<-loopback>"]
                   if proxy_port else ["--no-proxy-server"])
        heap = [f"--js-flags=--max-old-space-size={js_heap_mib}"] if js_heap_mib else []
        args = [executable, *BASE_ARGS, *network, *heap, f"--user-data-dir={profile}", *extra_args, "about:blank"]
        # Its own small environment: nothing of the worker's (variables, home directory) reaches the browser.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(profile), "LANG": "C.UTF-8",
               "XDG_CONFIG_HOME": str(profile / ".config"), "XDG_CACHE_HOME": str(profile / ".cache")}
        try:
            stderr = await asyncio.to_thread(open, base / "chromium.log", "wb")
            try:
                proc = await asyncio.create_subprocess_exec(
                    *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
                    env=env, cwd=base,
                    start_new_session=True,   # its own process group: one signal reaches every helper
                    preexec_fn=lambda: _child_setup(user, profile if child_makes else None))
            finally:
                stderr.close()
        except (OSError, subprocess.SubprocessError) as exc:
            await asyncio.to_thread(_remove, base, user)
            raise BrowserStartError(f"cannot start {executable} as {user.name if user else 'this user'}: "
                                    f"{exc}") from None
        try:
            port = await _devtools_port(proc, base / "chromium.log", timeout)
            browser = await playwright.chromium.connect_over_cdp(f"http://127.0.0.1:{port}",
                                                                 timeout=timeout * 1000)
        except BaseException as exc:
            tail = await asyncio.to_thread(_log_tail, base / "chromium.log")
            await _kill(proc, base, user)
            if isinstance(exc, Exception):
                raise BrowserStartError(f"{executable} did not come up: {exc}; log: {tail}") from None
            raise
        log.info("browser started: %s (pid %d, user %s)", executable, proc.pid, user.name if user else os.geteuid())
        return cls(proc, base, browser, user)

    async def close(self, timeout: float = 5.0) -> None:
        """Polite close first; whatever is left (a hung browser, helpers) is killed. Once."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.browser.close(), timeout)
        await _kill(self.proc, self.profile, self.user)


def _make_profile(base: Path, user: BrowserUser | None) -> tuple[Path, bool]:
    """base (the worker's: the log) may be passed through by the browser user, not listed; the user data
    directory inside it is the browser user's alone. Root gives it to that user; a worker that is not root (and
    holds no CAP_CHOWN) lets the browser make it itself as its first act (_child_setup), in a base it may
    write to but not list. Returns the profile's path and whether the browser is to make it."""
    profile = base / "profile"
    open(base / "chromium.log", "xb").close()     # before base opens to others (sticky: nobody else replaces it)
    if user is None or not user.switches:
        os.mkdir(profile, 0o700)
        return profile, False
    if os.geteuid() == 0:
        os.mkdir(profile, 0o700)
        os.chown(profile, user.uid, user.gid)
        os.chmod(base, 0o711)
        return profile, False
    os.chmod(base, 0o1733)
    return profile, True


def _child_setup(user: BrowserUser | None, make: Path | None) -> None:
    if user is not None:
        user.drop()
    if make is not None:
        os.mkdir(make, 0o700)        # fails if anybody else made it first: no start then
    _die_with_parent()      # after the drop: a change of user clears the parent-death signal


async def _devtools_port(proc: asyncio.subprocess.Process, log_file: Path, timeout: float) -> int:
    # Chromium prints the port it bound to on stderr (our log file) once DevTools is listening; there is no
    # event to await from another process's file, so it is polled, briefly.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise BrowserStartError(f"exited with status {proc.returncode}")
        m = _DEVTOOLS_LINE.search(await asyncio.to_thread(_read_bytes, log_file))
        if m:
            return int(m.group(1))
        try:
            await asyncio.wait_for(proc.wait(), 0.05)
        except TimeoutError:
            pass
    raise BrowserStartError(f"no DevTools port within {timeout:.0f} s")


def _signal(pids: Sequence[int], group: int | None, user: BrowserUser | None) -> None:
    """SIGKILL to a process group and to single processes. A worker that is not root (and lacks CAP_KILL) may
    not signal the browser user's processes: then the browser user sends it."""
    denied = False
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            denied = True
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            denied = True
    if denied and user is not None and user.switches:
        targets = ([f"-{group}"] if group is not None else []) + [str(p) for p in pids]
        _as_user(user, ["kill", "-KILL", "--", *targets])


def _as_user(user: BrowserUser, argv: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, preexec_fn=user.drop, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30, check=False, env={"PATH": "/usr/bin:/bin"})


def _remove(base: Path, user: BrowserUser | None) -> None:
    profile = base / "profile"
    if user is not None and user.switches and os.geteuid() != 0 and profile.is_dir():
        _as_user(user, ["rm", "-rf", "--", str(profile)])    # its files are the browser user's
    shutil.rmtree(base, ignore_errors=True)


async def _kill(proc: asyncio.subprocess.Process, base: Path, user: BrowserUser | None = None) -> None:
    # Only while the browser is not yet reaped: until then its id (and so its group's) cannot be anybody
    # else's. Helpers of a browser that already died notice it and exit by themselves.
    if proc.returncode is None:
        pids = tree_pids(proc.pid)
        await asyncio.to_thread(_signal, pids, proc.pid, user)    # the group, then helpers that left it
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()
    await asyncio.to_thread(_remove, base, user)


def sweep_stale_profiles(root: Path | None = None, *, max_age: float = 3600.0,
                         user: BrowserUser | None = None) -> int:
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
            lock = path / "profile" / "SingletonLock"
            if lock.is_symlink():
                lock_host, _, pid = os.readlink(lock).rpartition("-")
                if lock_host != host or not pid.isdigit() or _alive(int(pid)):
                    continue
            elif time.time() - path.stat().st_mtime < max_age:
                continue
        except OSError:
            continue
        _remove(path, user)
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


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 20)
    except OSError:
        return b""


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path) -> str:
    return " | ".join(_read(path).strip().splitlines()[-3:])[-500:]
