"""The audio catalogue as JSON lines in the master's data dir: <data_dir>/catalog.jsonl.

The store's table is the source of truth; this file is its readable mirror. At start-up it is rewritten from the
store (atomically), so a crash between a commit and an append can neither lose nor duplicate a row; afterwards
new rows are appended once their transaction has committed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from crawler.logs import iso_utc
from crawler.master.store import AUDIO_TIMES


def export_row(row: dict[str, Any]) -> dict[str, Any]:
    """A catalogue row as exports show it: times as ISO-8601 UTC, not epoch seconds, and when the item first
    appeared also under the name first_seen."""
    row = {**row, **{k: iso_utc(row[k]) for k in AUDIO_TIMES if isinstance(row.get(k), (int, float))}}
    if "found_at" in row:
        row["first_seen"] = row["found_at"]
    return row


class CatalogueFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[dict[str, Any]] = []
        self._fh: TextIO | None = None

    def rewrite(self, rows: Iterable[dict[str, Any]]) -> int:
        tmp = self.path.with_suffix(".jsonl.tmp")
        n = 0
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(export_row(row), ensure_ascii=False, sort_keys=True) + "\n")
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        return n

    def add(self, rows: list[dict[str, Any]]) -> None:
        self._pending.extend(rows)

    def flush(self) -> None:
        """Call after the store committed the rows."""
        if not self._pending or self._fh is None:
            return
        self._fh.write("".join(json.dumps(export_row(r), ensure_ascii=False, sort_keys=True) + "\n"
                               for r in self._pending))
        self._fh.flush()
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
