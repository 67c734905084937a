"""Pages on the worker's disk, under names a hostile URL cannot steer.

A page is stored at pages/<host>/<h[:2]>/<h>.<ext>, where h is the SHA-1 of its URL and <host> keeps only
[a-z0-9.-] (the port joins with "_"). Nothing of the URL's path reaches the file system, so no URL can name a
file outside the data dir. pages/index.tsv maps each file back to its URL.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

_UNSAFE = re.compile(r"[^a-z0-9.-]")
_EXT = {"text/html": "html", "application/xhtml+xml": "html", "application/json": "json", "text/plain": "txt",
        "application/xml": "xml", "text/xml": "xml"}


def safe_host(url: str) -> str:
    s = urlsplit(url)
    host = _UNSAFE.sub("_", (s.hostname or "unknown").lower()).strip(".") or "unknown"
    if s.port:
        host += f"_{s.port}"
    return host[:200]


class PageStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "pages"
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = open(self.root / "index.tsv", "a", encoding="utf-8")
        self._made: set[Path] = set()

    def path_for(self, url: str, content_type: str) -> Path:
        h = hashlib.sha1(url.encode("utf-8", "surrogatepass")).hexdigest()
        return self.root / safe_host(url) / h[:2] / f"{h}.{_EXT.get(content_type, 'bin')}"

    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes) -> Path:
        path = self.path_for(url, content_type)
        parent = path.parent
        if parent not in self._made:
            parent.mkdir(parents=True, exist_ok=True)
            self._made.add(parent)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, path)
        clean = [x.replace("\t", " ").replace("\n", " ") for x in (url, final_url)]
        self._index.write(f"{path.relative_to(self.root)}\t{clean[0]}\t{clean[1]}\t{status}\t{content_type}\t"
                          f"{time.time():.3f}\n")
        return path

    def flush(self) -> None:
        self._index.flush()

    def close(self) -> None:
        self._index.close()
