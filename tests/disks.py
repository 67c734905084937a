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
