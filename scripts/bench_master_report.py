"""The master's CPU per page on the page path, in one process, without sockets or workers.

    .venv/bin/python scripts/bench_master_report.py [--site bench-data/site-20000] [--repeat 3] [--profile F]

The crawl benchmark (bench_crawl.py) measures every process at once and moves with whatever else the machine is
doing. This one replays a crawl of a generated site (scripts/sitegen.py) through the master's own steps for each
report: the frame decoded (protocol.decode_payload), the crawl state's record of it (Crawl.complete, a part of
REPORT_PART results at a time, as Master._record does: the store's finish, catalogue rows, links through the Bloom
filter and the frontier), the next tasks taken (Crawl.take), a commit every --commit-every reports with the
catalogue file's append, on a real MasterStore in a temporary directory.

The results are the worker's for each page (its link extraction, resolver, link cache and normalisation), made
once per site and kept in --results (a msgpack file beside the site), so that every round replays the same pages;
only the master's steps are timed. Two nodes, each with --in-flight tasks, report --per-report results at a
time. Prints the master's CPU per page (process CPU time, the catalogue's writer thread included), the best of
--repeat rounds, and what the store holds at the end (to compare two trees: the same figures, the same store).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crawler import protocol as p
from crawler.bloom import GrowingBloomFilter
from crawler.master.catalogue import CatalogueFile
from crawler.master.config import MasterConfig
from crawler.master.crawl import Crawl
from crawler.master.dedup import Dedup
from crawler.master.server import report_parts
from crawler.master.store import MasterStore
from crawler.scheduler import NodeTable
from testkit import sitegen

BASE = "http://127.0.0.1:8080"
NODES = ("node1", "node2")


def _site_file(site: Path, path: str) -> Path:
    rel = path.lstrip("/")
    return site / (rel + "index.html" if path.endswith("/") or not rel else rel)


class WorkerSim:
    """A worker's results for pages of the site, made as a worker makes them (no fetch: the files are read)."""

    def __init__(self, site: Path) -> None:
        from crawler.resolvers.generic import GenericResolver
        from crawler.web.urls import NormalizeOptions
        from crawler.worker.linkcache import LinkCache

        self.site = site
        self.redirects: dict[str, Any] = json.loads((site / "_redirects.json").read_text())
        self.resolver = GenericResolver({})
        self.norm = NormalizeOptions()
        self.caches = {n: LinkCache(200_000) for n in NODES}
        self.loop = asyncio.new_event_loop()

    def result(self, node: str, task: p.Task) -> p.Result:
        from crawler.web.links import extract_links
        from crawler.web.page import FetchedPage
        from crawler.web.urls import normalize_many

        url = task.url
        path = url[len(BASE):] or "/"
        path = path.split("#", 1)[0]
        red = self.redirects.get(path.split("?", 1)[0])
        cache = self.caches[node]
        if red is not None:
            target = BASE + red["location"]
            links = [u for u in normalize_many(cache.fresh([target], task.depth), self.norm) if u]
            return p.Result(task.lease, url, p.DONE, red["status"], url, "text/html", 0, None, tuple(links))
        file = _site_file(self.site, path.split("?", 1)[0])
        if not file.is_file():
            return p.Result(task.lease, url, p.ERROR, 404, url, "text/html", 150, "HTTP 404")
        body = file.read_bytes()
        ctype = "text/html" if file.suffix == ".html" else "application/octet-stream"
        page = FetchedPage(url=url, final_url=url, status=200, content_type=ctype, headers={"content-type": ctype},
                           body=body, raw_headers=[])
        tree = page.tree() if ctype == "text/html" else None
        links = extract_links(tree, url, 20_000) if tree is not None else []
        resolution = self.loop.run_until_complete(self.resolver.resolve(url, page, None))
        items = list(resolution.items) if resolution else []
        if resolution and resolution.links:
            links.extend(resolution.links)
        audio = {i.url for i in items}
        fresh = cache.fresh(links, task.depth + 1)
        normed = list(dict.fromkeys(u for u in normalize_many(fresh, self.norm)
                                    if u and u not in audio and not self.resolver.audio_link(u)))[:5000]
        named: tuple[tuple[str, Any], ...] = ()
        if resolution and resolution.link_meta:
            wanted = set(normed)
            raw = list(resolution.link_meta)
            named = tuple((k, resolution.link_meta[u]) for u, k in zip(raw, normalize_many(raw, self.norm))
                          if k and k in wanted)
        return p.Result(task.lease, url, p.DONE, 200, url, ctype, len(body), None, tuple(normed), tuple(items),
                        link_meta=named)


def make_crawl(data: Path, secret: Path) -> tuple[Crawl, MasterStore, CatalogueFile]:
    raw = {"listen": "127.0.0.1:1", "data_dir": str(data), "secret_file": str(secret), "nodes": list(NODES),
           "seeds": [BASE + "/"], "crawl": {"max_depth": 9}}
    cfg = MasterConfig.from_mapping(raw, data)
    table = NodeTable(cfg.nodes, key=cfg.scheduling.key)
    store = MasterStore(cfg.store_location, max_attempts=cfg.crawl.max_attempts, slot_of=table.slot_of)
    d = cfg.dedup
    bloom = GrowingBloomFilter(d.expected_urls, d.fp_rate, bits_per_item=d.bits_per_url, hashes=d.hashes)
    crawl = Crawl(cfg, store, Dedup(bloom, d.whitelist, store.known), table, None, None, first_lease=1)
    crawl.seed(cfg.seeds)
    for n in NODES:
        crawl.node_up(n)
    store.commit()
    catalogue = CatalogueFile(data / "catalog.jsonl")
    catalogue.rewrite(store.catalogue(settled=True))
    return crawl, store, catalogue


def one_round(recorded: dict[str, list[Any]], sim: WorkerSim | None, args: argparse.Namespace,
              profile: cProfile.Profile | None) -> tuple[float, int, dict[str, Any]]:
    """Replays the crawl; returns (master CPU seconds, pages, what the store holds)."""
    tmp = Path(tempfile.mkdtemp(prefix="master-report-", dir=args.tmp))
    try:
        secret = tmp / "secret"
        secret.write_text(secrets.token_hex(32))
        secret.chmod(0o600)
        crawl, store, catalogue = make_crawl(tmp, secret)
        clock = time.process_time
        now = 1_000_000.0
        inflight: dict[str, list[p.Task]] = {n: [] for n in NODES}
        spent, pages, reports = 0.0, 0, 0
        while True:
            busy = False
            for node in NODES:
                t0 = clock()
                if profile:
                    profile.enable()
                tasks = crawl.take(node, args.in_flight - len(inflight[node]), now)
                if profile:
                    profile.disable()
                spent += clock() - t0
                inflight[node].extend(tasks)
                if not inflight[node]:
                    continue
                busy = True
                batch, inflight[node] = inflight[node][:args.per_report], inflight[node][args.per_report:]
                results = []
                for task in batch:          # the worker's part: not timed
                    wire = recorded.get(task.url)
                    if wire is None:
                        if sim is None:
                            raise SystemExit(f"{task.url}: not in the recorded results (record them again)")
                        r = sim.result(node, task)
                        recorded[task.url] = r.to_wire()
                    else:
                        r = p.Result.from_wire([task.lease, *wire[1:]])
                    results.append(r)
                frame = p.encode(p.Report(tuple(results)), 1 << 26)
                now += 0.005
                t0 = clock()
                if profile:
                    profile.enable()
                msg = p.decode_payload(frame[p.HEADER_SIZE:])
                assert isinstance(msg, p.Report)
                for part in report_parts(msg.results):
                    rows = crawl.complete(node, part, now)
                    if rows:
                        catalogue.add([r for r in rows if r.get("status") != "pending"])
                reports += 1
                if reports % args.commit_every == 0:
                    store.count_discards(crawl.take_discards())
                    store.commit()
                    catalogue.flush()
                if profile:
                    profile.disable()
                spent += clock() - t0
                pages += len(batch)
            if not busy:
                break
        t0 = clock()
        store.count_discards(crawl.take_discards())
        store.commit()
        catalogue.close()
        spent += clock() - t0
        status = store.status()
        held = {"states": status["states"], "audio": status["audio"], "discards": status["discards"],
                "catalogue_lines": sum(1 for _ in open(tmp / "catalog.jsonl", encoding="utf-8"))}
        # What the store and the catalogue file hold, row for row: two trees that behave alike give the same.
        digest = hashlib.sha256()
        for table in ("url_state", "pages", "origins", "audio", "audio_refs", "audio_history", "link_meta",
                      "pending_downloads", "counts", "node_stats"):
            for row in sorted(map(repr, store.db.execute(f"SELECT * FROM {table}"))):
                digest.update(row.encode())
        with open(tmp / "catalog.jsonl", encoding="utf-8") as fh:
            for line in fh:
                digest.update(repr(sorted(json.loads(line).items())).encode())
        held["digest"] = digest.hexdigest()[:16]
        store.close()
        return spent, pages, held
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def count_sql(recorded: dict[str, list[Any]], args: argparse.Namespace) -> dict[str, float]:
    """Calls into the database per page over a round: execute(), executemany() and the rows these carried."""
    from crawler.master import backend

    counts = dict.fromkeys(("execute", "executemany", "executemany rows"), 0)
    cls = backend.SqliteBackend
    execute, executemany = cls.execute, cls.executemany

    def counted_execute(self: Any, sql: str, a: Any = ()) -> Any:
        counts["execute"] += 1
        return execute(self, sql, a)

    def counted_executemany(self: Any, sql: str, rows: Any) -> int:
        rows = list(rows)
        counts["executemany"] += 1
        counts["executemany rows"] += len(rows)
        return executemany(self, sql, rows)

    cls.execute, cls.executemany = counted_execute, counted_executemany   # type: ignore[method-assign]
    try:
        _, pages, _ = one_round(recorded, None, args, None)
    finally:
        cls.execute, cls.executemany = execute, executemany   # type: ignore[method-assign]
    return {k: v / pages for k, v in counts.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path, default=ROOT / "bench-data" / "site-20000")
    ap.add_argument("--songs", type=int, default=20_000, help="songs of the site generated when --site is missing")
    ap.add_argument("--results", type=Path, default=None,
                    help="the recorded worker results (default: master-report-results.msgpack beside the site)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=64, help="tasks each node holds")
    ap.add_argument("--per-report", type=int, default=16, help="results in a report")
    ap.add_argument("--commit-every", type=int, default=8, help="reports between commits")
    ap.add_argument("--tmp", type=Path, default=None, help="where the store goes (default: the system's temp dir)")
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the master's steps (last round)")
    ap.add_argument("--count-sql", action="store_true",
                    help="one more round that counts the store's statements per page (not timed)")
    args = ap.parse_args()
    if not (args.site / sitegen.MANIFEST_FILE).is_file():
        print(f"generating {args.songs} songs under {args.site} ...")
        sitegen.generate(args.site, songs=args.songs, replace=True)
    results = args.results or args.site.parent / f"{args.site.name}.master-report-results.msgpack"
    recorded: dict[str, list[Any]] = {}
    sim = None
    if results.is_file():
        recorded = msgspec.msgpack.decode(results.read_bytes())
    else:
        print(f"recording the workers' results into {results} (once) ...")
        sim = WorkerSim(args.site)
        one_round(recorded, sim, args, None)
        results.write_bytes(msgspec.msgpack.encode(recorded))
    best, held0 = None, None
    for i in range(args.repeat):
        prof = cProfile.Profile(time.thread_time) if args.profile and i == args.repeat - 1 else None
        spent, pages, held = one_round(recorded, None, args, prof)
        if prof is not None:
            prof.dump_stats(str(args.profile))
        print(f"  round {i + 1}: {pages} pages, master CPU {spent:.3f} s, {spent / pages * 1e6:.1f} us/page")
        best = spent / pages if best is None else min(best, spent / pages)
        if held0 is None:
            held0 = held
        elif held != held0:
            print("  the store differs between rounds!", held, held0)
    print(f"best of {args.repeat}: {best * 1e6:.1f} us of master CPU per page")
    if args.count_sql:
        calls = count_sql(recorded, args)
        print("store statements per page: " + ", ".join(f"{k} {v:.2f}" for k, v in calls.items()))
    print("store at the end:", json.dumps(held0, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
