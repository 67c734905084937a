"""Steering a crawl from the command line: pause, resume, seed, retry, add and remove reference works, evidence.

A command is a small JSON file in ``<data_dir>/commands/``, written under a temporary name and renamed, so a reader
never sees half of one. The running master applies waiting commands on its next tick (a fraction of a heartbeat),
commits, writes ``<name>.done`` with what it did and removes the command; the command line waits for that answer.
When no master holds the crawl state, the command line applies the waiting commands itself through the same code
(``Master.apply_offline``), so every command works the same on a stopped crawl, and a master that was stopped
applies whatever is still waiting when it starts.

Why files rather than a table in master.db: the running master holds SQLite's write lock for most of every commit
window, so a second writer would queue behind it for an unpredictable time; a rename into a directory never waits.
Applying a command twice (a crash between its commit and the file's removal) does no harm: each is idempotent.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

COMMANDS_DIR = "commands"
KINDS = ("pause", "resume", "seed", "retry", "add-references", "remove-reference", "evidence")
# Commands read per tick: a flood of them cannot stall the master's loop.
MAX_PER_TICK = 16
_SUFFIX = ".json"
_DONE = ".done"


class CommandError(Exception):
    """A command file the master cannot use (hand-written, truncated): answered with the error, then dropped."""


def commands_dir(data_dir: Path) -> Path:
    return data_dir / COMMANDS_DIR


def submit(data_dir: Path, command: dict[str, Any]) -> Path:
    """Queue a command for the master; returns its path (the name orders commands by submission time)."""
    folder = commands_dir(data_dir)
    folder.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(command, ensure_ascii=False))
    path = folder / (name + _SUFFIX)
    tmp.rename(path)
    return path


def pending(data_dir: Path, limit: int = MAX_PER_TICK) -> list[Path]:
    """Waiting commands, oldest first."""
    try:
        names = sorted(e.name for e in os.scandir(commands_dir(data_dir))
                       if e.name.endswith(_SUFFIX) and not e.name.startswith("."))
    except FileNotFoundError:
        return []
    return [commands_dir(data_dir) / n for n in names[:limit]]


def read(path: Path) -> dict[str, Any]:
    try:
        cmd = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CommandError(f"unreadable command {path.name}: {e}") from None
    if not isinstance(cmd, dict) or cmd.get("command") not in KINDS:
        raise CommandError(f"{path.name}: not a command ({', '.join(KINDS)})")
    return cmd


def answer(path: Path, result: dict[str, Any]) -> None:
    """Record what a command did (for the command line waiting on it) and remove the command."""
    done = path.with_suffix(_DONE)
    tmp = path.with_name(f".{done.name}.tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False, sort_keys=True))
    tmp.rename(done)
    path.unlink(missing_ok=True)


def take_answer(path: Path) -> dict[str, Any] | None:
    """The answer to a command, once it was applied (the answer file is removed), else None."""
    done = path.with_suffix(_DONE)
    try:
        result: dict[str, Any] = json.loads(done.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    done.unlink(missing_ok=True)
    return result
