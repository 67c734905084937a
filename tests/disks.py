"""A disk that fills, for the full-disk tests: a small tmpfs (the suite runs as root, as CI does)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of this size (mount's size=, e.g. "1m") mounted at path, which is created."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (the test suite runs as root)")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(mnt: Path, leave: int = 0) -> None:
    """Write zeros until the file system says it is full, then give `leave` bytes back."""
    with open(mnt / "filler", "wb", buffering=0) as f:
        block = b"\0" * (64 * 1024)
        try:
            while True:
                f.write(block)
        except OSError:
            pass
    with open(mnt / "filler2", "wb", buffering=0) as f:   # and the last few pages a block did not fit in
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    if leave:
        filler = mnt / "filler"
        os.truncate(filler, max(0, filler.stat().st_size - leave))


def unfill(mnt: Path) -> None:
    """Give back what fill() took: space returns."""
    for name in ("filler", "filler2"):
        (mnt / name).unlink(missing_ok=True)
