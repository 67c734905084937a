"""CPU per page of the worker's work after the fetch, in one process, without network or other processes.

    .venv/bin/python scripts/bench_page_cpu.py [--site bench-data/site-20000] [--pages 5000] [--repeat 3]
        [--format warc|files] [--no-archive] [--profile STEP]

The crawl benchmark (bench_crawl.py) measures everything at once and moves with whatever else the machine is
doing. This one replays pages of a generated site (scripts/sitegen.py; generated under --site if missing)
through the same steps a worker takes for each page, and prints the CPU time of each step per page, the best of
--repeat rounds: bounds (the tag count and nesting check before parsing), parse (lexbor), links (extraction), resolve (the generic resolver), report (link cache,
normalisation, audio check, the page's content digest), store (the page store's save: with the archive on, the
worker's default, the page's request and response records appended to the node's archive and the index lines;
'files' for one file per page besides). Every round starts with empty caches (link cache, reference joins), as a
worker starts a crawl. Use it to compare a change before and after on the same pages.

--profile STEP runs one more round under cProfile and prints where that step's time goes (its 25 costliest
functions by internal time, the other steps' time excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crawler.resolvers.generic import GenericResolver
from crawler.web import html
from crawler.resolvers import generic as generic_module
from crawler.resolvers import pagemeta as pagemeta_module
from crawler.web import links as links_module
from crawler.web import urls as urls_module
from crawler.web.links import extract_links
from crawler.web.page import FetchedPage
from crawler.web.urls import NormalizeOptions, normalize_many
from crawler.archive import records as records_module
from crawler.archive.writer import ArchiveWriter
from crawler.worker.linkcache import LinkCache
from crawler.worker.pagestore import open_page_store
from crawler.worker.revisit import content_digest
from testkit import sitegen

# Every memory of the page path, emptied at each round's start.
_CACHES: list[Any] = [urls_module._resolve_link_cached, urls_module._PLAIN_ROOT_REFS, links_module._HINTS,
                      generic_module._INERT_HREFS, pagemeta_module._GENERIC_TEXTS, pagemeta_module._DURATIONS,
                      *records_module._WRITTEN,
                      records_module._ROLE_LINES]
HEADERS = [(b"Server", b"nginx/1.22.1"), (b"Date", b"Wed, 02 Dec 2026 13:00:00 GMT"),
           (b"Content-Type", b"text/html"), (b"Content-Length", b"4400"),
           (b"Last-Modified", b"Wed, 02 Dec 2026 12:00:00 GMT"), (b"Connection", b"keep-alive"),
           (b"ETag", b'"6929-1130"'), (b"Accept-Ranges", b"bytes")]
# What the worker's page fetch sends (crawler/worker/fetcher.py: Host, its client's headers, the Referer).
SENT = [(b"Host", b"127.0.0.1:8080"), (b"User-Agent", b"audio-crawler/0.1 (+https://example.org/bot)"),
        (b"Accept", b"text/html,application/xhtml+xml,*/*;q=0.8"), (b"Accept-Encoding", b"gzip, deflate, br"),
        (b"Referer", b"http://127.0.0.1:8080/list/1.html")]
BASE = "http://127.0.0.1:8080"
PROFILE_ORDER = os.environ.get("PROFILE_ORDER", "tottime")
T = TypeVar("T")
STEPS = ("bounds", "parse", "links", "resolve", "report", "store")
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


def one_round(pages: list[tuple[str, bytes]], fmt: str, data_dir: Path, archive: bool,
              profile: str = "") -> dict[str, float]:
    """CPU seconds per page of each step, in microseconds; profile: the step whose calls a profiler records."""
    for cached in _CACHES:      # every round starts cold, as a worker does
        if isinstance(cached, dict):
            cached.clear()
        else:
            cached.cache_clear()
    resolver = GenericResolver({})
    cache = LinkCache(200_000)
    norm = NormalizeOptions()
    # The worker's default: the node's archive, which the page store appends each page's exchange to.
    writer = ArchiveWriter(data_dir / "archive", "worker") if archive else None
    store = open_page_store(data_dir, fmt, archive=writer)
    spent = dict.fromkeys(STEPS, 0.0)
    clock = time.process_time
    loop = asyncio.new_event_loop()
    prof = cProfile.Profile() if profile else None
    on, off = (prof.enable, prof.disable) if prof is not None else (_nothing, _nothing)
    on_at = {s: (on if s == profile else _nothing) for s in STEPS}
    off_at = {s: (off if s == profile else _nothing) for s in STEPS}
    for url, body in pages:
        page = FetchedPage(url=url, final_url=url, status=200, content_type="text/html",
                           headers={"content-type": "text/html"}, body=body, raw_headers=HEADERS, sent=SENT,
                           started=time.time())
        on_at["bounds"]()
        tb = clock()
        refused, scan = html.precheck(body, max_tags=MAX_TAGS, max_depth=MAX_DEPTH)
        refused = refused or (scan and html.too_deep(body, MAX_DEPTH))
        assert not refused, (url, refused)
        t0 = clock()
        off_at["bounds"]()
        on_at["parse"]()
        tree = page.tree()
        off_at["parse"]()
        t1 = clock()
        on_at["links"]()
        links = extract_links(tree, page.final_url, MAX_LINK_ELEMENTS, source=page.text())
        off_at["links"]()
        t2 = clock()
        on_at["resolve"]()
        resolution = _run(loop, resolver.resolve(url, page, None))
        off_at["resolve"]()
        t3 = clock()
        on_at["report"]()
        audio = {i.url for i in resolution.items}
        found = links + resolution.links
        content_digest(found, [], resolution.items)
        fresh = cache.fresh(found)
        _reported = [u for u in normalize_many(fresh, norm) if u and u not in audio and not resolver.audio_link(u)]
        off_at["report"]()
        t4 = clock()
        on_at["store"]()
        store.save(url, url, 200, "text/html", body, HEADERS, sent=page.sent, started=page.started)
        off_at["store"]()
        t5 = clock()
        for key, a, b in (("bounds", tb, t0), ("parse", t0, t1), ("links", t1, t2), ("resolve", t2, t3),
                          ("report", t3, t4), ("store", t4, t5)):
            spent[key] += b - a
    store.close()
    if writer is not None:
        writer.close()
    loop.close()
    if prof is not None:
        print(f"profile of the step {profile!r}:")
        pstats.Stats(prof).sort_stats(PROFILE_ORDER).print_stats(25)
    return {k: v / len(pages) * 1e6 for k, v in spent.items()}


def _nothing() -> None:
    pass


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result: stepped once by hand when it finishes without waiting (an HTML page's resolution
    does), as a worker's task awaits it, so the step measures the resolver and not an event loop's turn."""
    try:
        waits = coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    if waits is not None:
        raise RuntimeError("the resolver waits on a future: run it on a loop")
    return loop.run_until_complete(coro)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path, default=ROOT / "bench-data" / "site-20000")
    ap.add_argument("--songs", type=int, default=20_000, help="songs of the site generated when --site is missing")
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--format", choices=["warc", "files"], default="warc")
    ap.add_argument("--no-archive", action="store_true",
                    help="archiving off (the page store keeps the pages alone); on by default, as in the worker")
    ap.add_argument("--profile", choices=STEPS, help="one more round, under cProfile, for this step")
    args = ap.parse_args()
    if not (args.site / sitegen.MANIFEST_FILE).is_file():
        print(f"generating {args.songs} songs under {args.site} ...")
        sitegen.generate(args.site, songs=args.songs, replace=True)
    pages = load_pages(args.site, args.pages)
    size = sum(len(b) for _, b in pages) / len(pages)
    print(f"{len(pages)} pages of {args.site} (mean {size / 1024:.1f} KiB), best of {args.repeat} rounds, "
          f"page store: {args.format}, archive {'off' if args.no_archive else 'on'}")
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="page-cpu-"))
        try:
            got = one_round(pages, args.format, tmp, not args.no_archive)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        best = {k: min(v, best.get(k, v)) for k, v in got.items()}
    for k, v in best.items():
        print(f"  {k:<8} {v:7.1f} us/page")
    print(f"  {'total':<8} {sum(best.values()):7.1f} us/page")
    if args.profile:
        tmp = Path(tempfile.mkdtemp(prefix="page-cpu-"))
        try:
            one_round(pages, args.format, tmp, not args.no_archive, args.profile)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
