"""The rights holder's reference works as `crawler-master references add` reads them: which files, under which
work ids and names (a CSV with the columns path,work,title,artist may say; else the work id is the file's stem),
their fingerprints computed in a process pool, and the add-references commands that carry them to the master
(crawler/master/steering.py), a bounded number of bytes per command.
"""

from __future__ import annotations

import base64
import csv
import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawler.identify import MAX_FINGERPRINT_BYTES, IdentifyError
from crawler.web.media import AUDIO_EXTENSIONS

# The fingerprinter, as module:function, when not crawler.identify.fingerprint_file (tests give a fake one).
FINGERPRINTER_ENV = "CRAWLER_FINGERPRINTER"
META_COLUMNS = ("path", "work", "title", "artist")
# What one add-references command carries at most (its file is read whole by the master).
COMMAND_BYTES = 4 << 20
COMMAND_WORKS = 64
MAX_WORK_ID = 1024


class ReferenceInputError(Exception):
    """The operator's paths or CSV cannot be used: one line saying why."""


@dataclass(frozen=True, slots=True)
class WorkFile:
    path: Path
    work: str
    title: str | None = None
    artist: str | None = None


def audio_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and the audio files (by extension) under the folders named, each once, in order."""
    out: dict[Path, None] = {}
    for p in paths:
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and not f.name.startswith(".") and f.suffix[1:].lower() in AUDIO_EXTENSIONS:
                    out.setdefault(f.resolve())
        elif p.is_file():
            out.setdefault(p.resolve())
        else:
            raise ReferenceInputError(f"{p}: no such file or folder")
    if not out:
        raise ReferenceInputError(f"no audio files in {', '.join(map(str, paths))}")
    return list(out)


def read_meta(csv_path: Path) -> dict[Path, dict[str, str]]:
    """The CSV's rows by the resolved path they name (relative paths are from the CSV's folder)."""
    try:
        with csv_path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or "path" not in reader.fieldnames or "work" not in reader.fieldnames:
                raise ReferenceInputError(f"{csv_path}: expected the columns {','.join(META_COLUMNS)}")
            out: dict[Path, dict[str, str]] = {}
            for n, row in enumerate(reader, 2):
                if not (row.get("path") or "").strip():
                    raise ReferenceInputError(f"{csv_path}:{n}: no path")
                out[(csv_path.parent / row["path"].strip()).resolve()] = {
                    k: (row.get(k) or "").strip() for k in META_COLUMNS}
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ReferenceInputError(f"{csv_path}: {getattr(e, 'strerror', None) or e}") from None
    return out


def work_files(paths: Sequence[Path], meta: dict[Path, dict[str, str]] | None = None) -> list[WorkFile]:
    """The works to add: one per file, the CSV's words over the file's stem. Two files under one work id are
    refused (which one would the work be?)."""
    out: list[WorkFile] = []
    seen: dict[str, Path] = {}
    for f in audio_files(paths):
        m = (meta or {}).get(f, {})
        work = m.get("work") or f.stem
        if len(work) > MAX_WORK_ID or not work.isprintable():
            raise ReferenceInputError(f"{f}: the work id {work[:40]!r} is too long or not printable")
        if work in seen:
            raise ReferenceInputError(f"work {work!r} named twice: {seen[work]} and {f}")
        seen[work] = f
        out.append(WorkFile(f, work, m.get("title") or None, m.get("artist") or None))
    return out


def fingerprinter() -> Callable[[Path], bytes]:
    """crawler.identify.fingerprint_file, or the function $CRAWLER_FINGERPRINTER names (module:function)."""
    name = os.environ.get(FINGERPRINTER_ENV)
    if not name:
        from crawler.identify import fingerprint_file
        return fingerprint_file
    module, _, attr = name.partition(":")
    fn: Callable[[Path], bytes] = getattr(importlib.import_module(module), attr)
    return fn


def _fingerprint(path: Path) -> bytes | str:
    try:
        fp = fingerprinter()(path)
    except IdentifyError as e:
        return str(e) or "cannot be fingerprinted"
    except OSError as e:
        return e.strerror or str(e)
    return fp[:MAX_FINGERPRINT_BYTES]


def fingerprint_all(files: Sequence[WorkFile], workers: int | None = None) -> list[bytes]:
    """The files' fingerprints, computed in a process pool (CPU-bound). ReferenceInputError naming the first file
    that cannot be fingerprinted."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(files)))
    if workers == 1:
        results = [_fingerprint(f.path) for f in files]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_fingerprint, [f.path for f in files]))
    out = []
    for f, r in zip(files, results, strict=True):
        if isinstance(r, str):
            raise ReferenceInputError(f"{f.path}: {r}")
        if not r:
            raise ReferenceInputError(f"{f.path}: empty fingerprint")
        out.append(r)
    return out


def commands(files: Sequence[WorkFile], fingerprints: Sequence[bytes]) -> Iterator[dict[str, Any]]:
    """add-references commands carrying the works, at most COMMAND_WORKS and about COMMAND_BYTES each."""
    batch: list[dict[str, Any]] = []
    size = 0
    for f, fp in zip(files, fingerprints, strict=True):
        encoded = base64.b64encode(fp).decode("ascii")
        ref = {"work": f.work, "title": f.title, "artist": f.artist, "source": str(f.path), "fingerprint": encoded}
        if batch and (len(batch) >= COMMAND_WORKS or size + len(encoded) > COMMAND_BYTES):
            yield {"command": "add-references", "references": batch}
            batch, size = [], 0
        batch.append(ref)
        size += len(encoded)
    if batch:
        yield {"command": "add-references", "references": batch}
