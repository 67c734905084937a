"""CPU per page of the worker's work after the fetch, in one process, without network or other processes.

    .venv/bin/python scripts/bench_page_cpu.py [--site bench-data/site-20000] [--pages 5000] [--repeat 3]

The crawl benchmark (bench_crawl.py) measures everything at once and moves with whatever else the machine is
doing. This one replays pages of a generated site (scripts/sitegen.py; generated under --site if missing)
through the same steps a worker takes for each page, and prints the CPU time of each step per page, the best of
--repeat rounds: bounds (the tag count and nesting check before parsing), parse (lexbor), links (extraction), resolve (the generic resolver), report (link cache,
normalisation, audio check), store (WARC append and index line; 'files' for one file per page). Every round
starts with empty caches (link cache, reference joins), as a worker starts a crawl. Use it to compare a change
before and after on the same pages.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crawler.resolvers.generic import GenericResolver
from crawler.web import html
from crawler.web import urls as urls_module
from crawler.web.links import extract_links
from crawler.web.page import FetchedPage
from crawler.web.urls import NormalizeOptions, normalize_many
from crawler.worker.linkcache import LinkCache
from crawler.worker.pagestore import open_page_store
from testkit import sitegen

_CACHES = [urls_module._resolve_link_cached]
HEADERS = [(b"Server", b"nginx/1.22.1"), (b"Date", b"Wed, 02 Dec 2026 13:00:00 GMT"),
           (b"Content-Type", b"text/html"), (b"Content-Length", b"4400"),
           (b"Last-Modified", b"Wed, 02 Dec 2026 12:00:00 GMT"), (b"Connection", b"keep-alive"),
           (b"ETag", b'"6929-1130"'), (b"Accept-Ranges", b"bytes")]
BASE = "http://127.0.0.1:8080"
# The worker's defaults (crawler/worker/config.py).
MAX_TAGS, MAX_DEPTH, MAX_LINK_ELEMENTS = 100_000, 512, 4 * 5000


def load_pages(site: Path, count: int) -> list[tuple[str, bytes]]:
    """count pages spread evenly over the site's pages (lists, artists, albums and songs in their shares)."""
    manifest = sitegen.Manifest.load(site)
    paths = [p for p in manifest.pages if p.endswith((".html", "/"))]
    step = max(1, len(paths) // count)
    out = []
    for path in paths[::step][:count]:
        file = site / (path.lstrip("/") + "index.html" if path.endswith("/") else path.lstrip("/"))
        if file.is_file():
            out.append((BASE + path, file.read_bytes()))
    return out


def one_round(pages: list[tuple[str, bytes]], fmt: str, data_dir: Path) -> dict[str, float]:
    for cached in _CACHES:      # every round starts cold, as a worker does
        cached.cache_clear()
    resolver = GenericResolver({})
    cache = LinkCache(200_000)
    norm = NormalizeOptions()
    store = open_page_store(data_dir, fmt)
    spent = dict.fromkeys(("bounds", "parse", "links", "resolve", "report", "store"), 0.0)
    clock = time.process_time
    loop = asyncio.new_event_loop()
    for url, body in pages:
        page = FetchedPage(url=url, final_url=url, status=200, content_type="text/html",
                           headers={"content-type": "text/html"}, body=body, raw_headers=HEADERS)
        tb = clock()
        refused, scan = html.precheck(body, max_tags=MAX_TAGS, max_depth=MAX_DEPTH)
        refused = refused or (scan and html.too_deep(body, MAX_DEPTH))
        assert not refused, (url, refused)
        t0 = clock()
        tree = page.tree()
        t1 = clock()
        links = extract_links(tree, page.final_url, MAX_LINK_ELEMENTS)
        t2 = clock()
        resolution = loop.run_until_complete(resolver.resolve(url, page, None))
        t3 = clock()
        audio = {i.url for i in resolution.items}
        fresh = cache.fresh(links + resolution.links)
        _reported = [u for u in normalize_many(fresh, norm) if u and u not in audio and not resolver.audio_link(u)]
        t4 = clock()
        store.save(url, url, 200, "text/html", body, HEADERS)
        t5 = clock()
        for key, a, b in (("bounds", tb, t0), ("parse", t0, t1), ("links", t1, t2), ("resolve", t2, t3), ("report", t3, t4),
                          ("store", t4, t5)):
            spent[key] += b - a
    store.close()
    loop.close()
    return {k: v / len(pages) * 1e6 for k, v in spent.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path, default=ROOT / "bench-data" / "site-20000")
    ap.add_argument("--songs", type=int, default=20_000, help="songs of the site generated when --site is missing")
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--format", choices=["warc", "files"], default="warc")
    args = ap.parse_args()
    if not (args.site / sitegen.MANIFEST_FILE).is_file():
        print(f"generating {args.songs} songs under {args.site} ...")
        sitegen.generate(args.site, songs=args.songs, replace=True)
    pages = load_pages(args.site, args.pages)
    size = sum(len(b) for _, b in pages) / len(pages)
    print(f"{len(pages)} pages of {args.site} (mean {size / 1024:.1f} KiB), best of {args.repeat} rounds, "
          f"page store: {args.format}")
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="page-cpu-"))
        try:
            got = one_round(pages, args.format, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        best = {k: min(v, best.get(k, v)) for k, v in got.items()}
    for k, v in best.items():
        print(f"  {k:<8} {v:7.1f} us/page")
    print(f"  {'total':<8} {sum(best.values()):7.1f} us/page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
