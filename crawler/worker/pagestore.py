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
        self._root = str(self.root)
        self._index = open(self.root / "index.tsv", "a", encoding="utf-8")
        self._made: set[str] = set()

    def relative_path(self, url: str, content_type: str) -> str:
        h = hashlib.sha1(url.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{safe_host(url)}/{h[:2]}/{h}.{_EXT.get(content_type, 'bin')}"

    def path_for(self, url: str, content_type: str) -> Path:
        return self.root / self.relative_path(url, content_type)

    def save(self, url: str, final_url: str, status: int, content_type: str, body: bytes) -> Path:
        # Plain os calls on strings: this runs once per page, and pathlib's objects cost more than the write.
        rel = self.relative_path(url, content_type)
        directory, _, name = rel.rpartition("/")
        full_dir = f"{self._root}/{directory}"
        if directory not in self._made:
            os.makedirs(full_dir, exist_ok=True)
            if len(self._made) > 100_000:   # a broad crawl meets many hosts: stay bounded
                self._made.clear()
            self._made.add(directory)
        # Written in place, no temporary file and rename: a page cut short by a crash is simply fetched and
        # written again, and the rename was a tenth of the worker's CPU.
        fd = os.open(f"{full_dir}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        clean_url = url.replace("\t", " ").replace("\n", " ")
        clean_final = final_url.replace("\t", " ").replace("\n", " ")
        self._index.write(f"{rel}\t{clean_url}\t{clean_final}\t{status}\t{content_type}\t{time.time():.3f}\n")
        return Path(full_dir, name)

    def flush(self) -> None:
        self._index.flush()

    def close(self) -> None:
        self._index.close()
