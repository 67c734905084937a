"""A fake fingerprinter for the worker's fingerprint pool: module-level functions (picklable, so they run in the
pool's spawned processes), whose behaviour the file's own first bytes choose:

    SLEEP <seconds>\\n...   fingerprints after sleeping that long
    BAD...                 IdentifyError (not audio)
    BOOM...                any other exception
    DIE...                 the process dies
    anything else          b"FP" + the file's sha256
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from crawler.identify import IdentifyError


def fake_fingerprint(path: Path) -> bytes:
    data = Path(path).read_bytes()
    if data.startswith(b"SLEEP "):
        time.sleep(float(data.split(b"\n", 1)[0].split()[1]))
    elif data.startswith(b"BAD"):
        raise IdentifyError("not audio")
    elif data.startswith(b"BOOM"):
        raise ValueError("decoder exploded")
    elif data.startswith(b"DIE"):
        os._exit(3)
    return b"FP" + hashlib.sha256(data).digest()


def expected(data: bytes) -> bytes:
    return b"FP" + hashlib.sha256(data).digest()


def huge_fingerprint(path: Path) -> bytes:
    """More than a fingerprint may hold on the wire: the pool cuts it."""
    return b"\x07" * (2 * 1024 * 1024)
