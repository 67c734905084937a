"""The audio catalogue as JSON lines in the master's data dir: <data_dir>/catalog.jsonl.

The store's table is the source of truth; this file is its readable mirror. At start-up it is rewritten from the
store (atomically), so a crash between a commit and an append can neither lose nor duplicate a row; afterwards
new rows are appended once their transaction has committed, by a writer thread of their own: encoding a busy
commit window's rows took the master's event loop for 15-25 ms.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import msgspec

from crawler.logs import iso_utc
from crawler.master.store import AUDIO_TIMES


def export_row(row: dict[str, Any]) -> dict[str, Any]:
    """A catalogue row as exports show it: times as ISO-8601 UTC, not epoch seconds, and when the item first
    appeared also under the name first_seen."""
    row = {**row, **{k: iso_utc(row[k]) for k in AUDIO_TIMES if isinstance(row.get(k), (int, float))}}
    if "found_at" in row:
        row["first_seen"] = row["found_at"]
    return row


# One JSON object a line, keys sorted, text as UTF-8 (not as \u escapes); msgspec's encoder, several times as fast
# as json.dumps, which the master ran for every row: the lines read as the same objects json.dumps gave, only
# without the blanks after ',' and ':'. Every value a row holds is strict JSON (protocol.check_json_value).
_ENCODER = msgspec.json.Encoder(order="sorted")


def catalogue_lines(rows: Iterable[dict[str, Any]]) -> str:
    """Rows as the catalogue file's lines (export_row applied), each ended by a newline."""
    encode = _ENCODER.encode
    return b"".join([encode(export_row(r)) + b"\n" for r in rows]).decode("utf-8")


class CatalogueFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[dict[str, Any]] = []
        self._fh: TextIO | None = None
        # One writer thread and one append at a time, so rows keep the order of their commits and what waits for
        # the disk is this list, not a queue of writes. A failed append is raised by the next flush.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalogue")
        self._last: Future[None] | None = None
        self._error: BaseException | None = None

    def rewrite(self, rows: Iterable[dict[str, Any]]) -> int:
        tmp = self.path.with_suffix(".jsonl.tmp")
        n = 0
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(catalogue_lines((row,)))
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        return n

    def add(self, rows: list[dict[str, Any]]) -> None:
        self._pending.extend(rows)

    def flush(self) -> None:
        """Call after the store committed the rows: they are appended off the caller's thread, in order."""
        if self._error is not None:
            raise self._error   # a full disk is the master's error, as it was when this wrote inline
        if not self._pending or self._fh is None:
            return
        if self._last is not None and not self._last.done():
            return               # the disk is behind: these rows go with the next flush
        rows, self._pending = self._pending, []
        self._last = self._writer.submit(self._append, self._fh, rows)

    def _append(self, fh: TextIO, rows: list[dict[str, Any]]) -> None:
        try:
            fh.write(catalogue_lines(rows))
            fh.flush()
        except BaseException as e:
            self._error = e

    def close(self) -> None:
        """Every row added is in the file when this returns (or the append's error is raised)."""
        try:
            if self._last is not None:
                self._last.result()
            if self._error is None and self._pending and self._fh is not None:
                self._append(self._fh, self._pending)   # the writer is idle: the rest inline
                self._pending = []
        finally:
            self._writer.shutdown(wait=True)
            self._last = None
            if self._fh is not None:
                self._fh.close()
                self._fh = None
        if self._error is not None:
            raise self._error
