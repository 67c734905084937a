"""Local faults: this node's disk cannot take what it fetches. The node's problem, never the URL's.

(A task no proxy could carry, every proxy that applies being out, is handed back the same way, without the fault
state: crawler/http/egress.py's ProxiesUnavailable, caught where the worker runs a task.)

A full disk, a read-only remount or a permission change on the data dir fails every task alike; counting those
failures against the URLs would burn the whole queue in seconds. The worker instead stops taking work, hands back
what it holds (protocol.Fault) and probes its data dir until it can write again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Errors that say "this machine's storage", whatever the URL. EIO is left out: a dying disk is not cured by waiting.
LOCAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
PROBE_BYTES = 4096
# After a fault the worker waits for this much more than min_free_bytes: resuming at the first free page would
# fill the disk again at once, and stop, and resume, for as long as the disk stays nearly full.
RESUME_HEADROOM = 32 * 1024 ** 2
PROBE_NAME = ".write-probe"


class LocalFault(Exception):
    """Storing a task's page or audio failed for a local reason: the task goes back to the master unfinished."""


def is_local(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS


def describe(exc: OSError) -> str:
    what = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"{what} ({exc.filename})" if exc.filename else what


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _probe(data_dir: Path) -> OSError | None:
    """Write and remove a small file: the local error that stops it, or None."""
    probe = data_dir / PROBE_NAME
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as e:
        if is_local(e):
            return e
        raise
    return None


def check_data_dir(data_dir: Path, min_free_bytes: int) -> str | None:
    """Why this data dir cannot take work now, or None when it can.

    Free space alone is not enough (a read-only or foreign-owned dir has plenty), so a small file is written
    and removed as well. Errors that are not local faults propagate: they are bugs or worse.
    """
    try:
        free = free_bytes(data_dir)
    except OSError as e:
        if is_local(e):
            return describe(e)
        raise
    if free < min_free_bytes:
        return f"{free} bytes free in {data_dir}, under min_free_bytes ({min_free_bytes})"
    error = _probe(data_dir)
    return None if error is None else describe(error)


def unusable_data_dir(data_dir: Path) -> str | None:
    """Why the worker cannot use this data dir at all (a mistake to fix, not a fault to wait out), or None.

    A full disk is not such a reason: the worker starts, takes no work, and resumes when space returns.
    """
    if data_dir.exists() and not data_dir.is_dir():
        return f"{data_dir} is not a directory"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        error = _probe(data_dir)
    except OSError as e:
        return f"cannot use {data_dir}: {e.strerror or e}"
    if error is not None and error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write in {data_dir}: {describe(error)}"
    return None
