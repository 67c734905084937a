"""Benchmark run directories thrown away without freeing inodes while a benchmark measures.

On an ext4 disk without a journal (this machine's /work) the kernel does not reuse an inode freed in the last
minute, or six while its inode table block is dirty (fs/ext4/ialloc.c, recently_deleted): after thousands of
deletions, every file created in the same block group scans past all of them, up to 0.6 ms of system time per
file, more than a download costs. A benchmark that deleted the last run's files right before the next run
measured that scan, not the crawler. So a run's directory is renamed into <out>/trash (a rename frees no inode),
and the trash is emptied only after the measured runs, of what has lain there longer than TRASH_AGE.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

TRASH_AGE = 600.0   # seconds: past ext4's longest wait before it reuses a deleted inode (360 s)
_EMPTIED = ".emptied"


def throw_away(path: Path, out: Path) -> None:
    """Move path (if it exists) under out/trash, stamped with the time."""
    if path.exists():
        trash = out / "trash"
        trash.mkdir(parents=True, exist_ok=True)
        path.rename(trash / f"{path.name}-{time.time_ns()}")


def empty_trash(out: Path) -> None:
    """Delete what was thrown away longer than TRASH_AGE ago; call it after the measured runs."""
    trash = out / "trash"
    if not trash.is_dir():
        return
    removed = False
    for old in trash.iterdir():
        stamp = old.name.rsplit("-", 1)
        if len(stamp) == 2 and stamp[1].isdigit() and time.time() - int(stamp[1]) / 1e9 > TRASH_AGE:
            shutil.rmtree(old, ignore_errors=True)
            removed = True
    if removed:
        (trash / _EMPTIED).write_text(f"{time.time()}\n")


def deletion_note(out: Path) -> str | None:
    """A benchmark's note when the trash was emptied within TRASH_AGE (its figures may carry the scan), else None."""
    try:
        ago = time.time() - float((out / "trash" / _EMPTIED).read_text())
    except (OSError, ValueError):
        return None
    if ago >= TRASH_AGE:
        return None
    return (f"note: old runs were deleted {ago:.0f} s ago: on an ext4 disk without a journal, files created in "
            "the next minutes can cost more system time (testkit/trash.py)")
