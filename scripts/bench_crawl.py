"""Crawl throughput against Scrapy, side by side on the same loopback site (tracker issue 8).

    .venv/bin/python scripts/bench_crawl.py [--songs 20000] [--concurrency 64,256] [--workers 2]
    .venv/bin/python scripts/bench_crawl.py --quick            # 2,000 songs, under a minute
    .venv/bin/python scripts/bench_crawl.py --profile py-spy   # also where the master's and a worker's CPU goes
    .venv/bin/python scripts/bench_crawl.py --repeat 3         # ours three times at each concurrency: median, range
    .venv/bin/python scripts/bench_crawl.py --download-audio --songs 5000 --concurrency 64   # downloads too

It generates the demo site (scripts/sitegen.py; kept under --out and reused while the song count is the same),
serves it with nginx (`apt-get install -y nginx-light`; without nginx it says so and falls back to
scripts/siteserver.py, which spends far more CPU per page and shares the two cores with the crawl), and for each
per-worker concurrency C runs to completion (ours at every C in turn, --repeat times, then Scrapy at each C,
so the levels of ours are compared on runs made close together):

  ours    one master and --workers workers (real daemons, one process each), C page fetches in flight per worker;
          pages are stored, audio is only catalogued (download_audio false: Scrapy does not download it either,
          and audio downloads are not pages);
  Scrapy  scripts/bench_scrapy_spider.py at the same total concurrency (workers x C), doing the same job.

Both obey robots.txt. Every process is reaped with os.wait4, whose rusage gives its CPU time (user + system),
interpreter start-up included; its peak RSS is its VmHWM, sampled until exit (see Child for why not ru_maxrss).
"pages" counts every page request answered (200s, 404s, redirects, playlists and extensionless streams, as the
master counts them; robots.txt excluded); pages/s divides it by the elapsed time each crawler reports itself (the
master's summary; Scrapy's elapsed_time_seconds). The site server's CPU is printed apart and counted for neither.
Each run also prints how busy the whole machine was: near 100% with our processes using less than all cores
means other work took the rest and pages/s is a lower bound; CPU per page is much less disturbed by that.

The master's CPU per reported link divides the master's CPU by the links the workers sent it, recounted after the
run from the pages the workers stored (each worker reports a link once: its link cache outlives this crawl).

Targets (issue 8): our pages/s at least 10x Scrapy's; at most 1.0 ms CPU per page over master and workers;
pages/s at 256 connections per worker within 10% of that at 64; the master not the bottleneck.

With --download-audio both crawlers also download the audio they find, at the same total concurrency: ours with
download_audio true, Scrapy with its FilesPipeline (the item's file_urls). Each also crawls once without
downloading, right before, so the CPU a file costs is the difference between the two crawls over the files
stored; files/s and MB/s divide the files stored (and their bytes) by the elapsed time of the crawl that
downloaded them. Scrapy's total concurrency then includes our workers' download slots (workers x (C +
downloads)): its file requests share its one limit with its pages, ours have slots of their own. Targets (issue
20): our files/s at least 10x Scrapy's; at most 0.5 ms CPU per small file over master and workers. With
--repeat, each downloading crawl is paired with the crawl without downloads made right before it; the median
pair by CPU per file is reported, with the range over all pairs, and beside it the median of the downloading
crawls' CPU less the median of the others', per file (steadier: one slow crawl moves it less than its pair).

Creating a small file is system time of the process that creates it, and on a disk shared with other work that
cost swings widely (0.02 to 0.65 ms per file was seen on one ext4 disk within minutes). Much of that swing was
the benchmark's own: deleting the last run's thousands of files right before the next made ext4 (without a
journal) scan past the freed inodes at every file created. So a run's directory is moved under <out>/trash and
emptied after the runs, of what is older than ten minutes (testkit/trash.py). --out on a tmpfs
(/dev/shm/...) puts both crawlers' stores, the master's state and the site there, which keeps the disk's
noise out of the comparison; both crawlers write the same files either way.

With --profile, one more crawl at the first concurrency runs under py-spy (sampling, not blocking the crawl) or
pyinstrument, after the measured runs so they are not disturbed. py-spy's samples of the master and of one worker
are printed as hot spots, in shares of their CPU time; pyinstrument writes its (wall-clock) call trees to files.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crawler.worker.config import SPEC as WORKER_SPEC
from testkit import cluster, sitegen
from testkit.trash import deletion_note, empty_trash, throw_away

PY = sys.executable
NGINX_HINT = "apt-get install -y nginx-light"
HWM_INTERVAL = 0.05   # seconds between peak-RSS samples of each child


# --- processes, reaped with their resource usage ------------------------------------------------------------------


@dataclass
class Usage:
    name: str
    rc: int
    cpu_s: float          # user + system
    peak_rss_mb: float    # the process's high-water mark
    system_s: float = 0.0   # of cpu_s, in the kernel (system calls: sockets, files)


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class Child:
    """A process whose exit status and CPU time are collected by os.wait4 in a thread, the moment it exits.

    Its peak RSS is not wait4's ru_maxrss: Linux carries the parent's resident size at fork into the child's
    maxrss across exec, so every child would show at least this script's size (the manifest of a big site
    included). VmHWM belongs to the new image alone; it is sampled until exit, and only the growth of the
    last sampling interval can be missed."""

    def __init__(self, name: str, args: list[str], *, log: Path, stdout: Path | int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log, "wb") as err, (open(stdout, "wb") if isinstance(stdout, Path)
                                      else contextlib.nullcontext(stdout)) as out:
            self.popen = subprocess.Popen(args, stdout=subprocess.DEVNULL if out is None else out, stderr=err,
                                          stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
        self.pid = self.popen.pid
        self.usage: Usage | None = None
        self._hwm_kib = 0
        self._exited = threading.Event()
        threading.Thread(target=self._sample_hwm, name=f"hwm {name}", daemon=True).start()
        threading.Thread(target=self._reap, name=f"reap {name}", daemon=True).start()

    def _sample_hwm(self) -> None:
        while not self._exited.wait(HWM_INTERVAL):
            kib = _vm_hwm_kib(self.pid)
            if kib:
                self._hwm_kib = max(self._hwm_kib, kib)

    def _reap(self) -> None:
        _, status, ru = os.wait4(self.pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        self.popen.returncode = rc   # reaped here: Popen must not wait for it again
        self.usage = Usage(self.name, rc, ru.ru_utime + ru.ru_stime, self._hwm_kib / 1024, ru.ru_stime)
        self._exited.set()

    def running(self) -> bool:
        return not self._exited.is_set()

    def wait(self, timeout: float) -> Usage:
        if not self._exited.wait(timeout):
            self.stop()
            raise RuntimeError(f"{self.name} did not exit within {timeout:.0f} s; its log: {self.log}")
        assert self.usage is not None
        return self.usage

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10) -> None:
        if self.running():
            os.kill(self.pid, sig)
            if not self._exited.wait(grace):
                os.kill(self.pid, signal.SIGKILL)
                self._exited.wait(grace)


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a running process and its children so far (nginx's work is done by its worker processes)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, ..., utime and stime are fields 14 and 15 of the whole line.
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return sum(cpu for pid, (ppid, cpu) in stats.items() if pid == root or ppid == root)


class MachineCpu:
    """The whole machine's busy share between start() and stop(), from /proc/stat: tells a crawl starved by other
    work (machine busy) from one stalled on itself (machine idle while the crawl waits)."""

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
        idle = values[3] + values[4]   # idle + iowait
        return sum(values[:8]), idle

    def __init__(self) -> None:
        self.total, self.idle = self._read()

    def busy_share(self) -> float:
        total, idle = self._read()
        dt = total - self.total
        return 1 - (idle - self.idle) / dt if dt else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, child: Child, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.running():
            raise RuntimeError(f"{child.name} exited at start; its log: {child.log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)   # nginx announces nothing when it is ready: poll its port
    raise RuntimeError(f"{child.name} is not listening on 127.0.0.1:{port} after {timeout:.0f} s")


# --- the site ------------------------------------------------------------------------------------------------------


def prepare_site(out: Path, songs: int) -> sitegen.Manifest:
    site = out / f"site-{songs}"
    if (site / sitegen.MANIFEST_FILE).is_file():
        manifest = sitegen.Manifest.load(site)
        if manifest.songs == songs:
            print(f"site: {site} (reused): {len(manifest.pages)} pages, {len(manifest.audio)} audio items")
            return manifest
    t0 = time.monotonic()
    manifest = sitegen.generate(site, songs=songs, replace=True)
    print(f"site: {site}: {len(manifest.pages)} pages, {len(manifest.audio)} audio items "
          f"(generated in {time.monotonic() - t0:.1f} s)")
    return manifest


@dataclass
class Site:
    url: str
    kind: str
    child: Child


def serve_site(site_dir: Path, run_dir: Path, prefer: str) -> Site:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if prefer == "nginx" and not nginx:
        raise SystemExit(f"nginx is not installed: {NGINX_HINT}")
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if nginx and prefer != "python":
        (run_dir / "tmp").mkdir(exist_ok=True)
        conf = run_dir / "nginx.conf"
        conf.write_text(sitegen.nginx_config(site_dir, port, run_dir))
        child = Child("nginx", [nginx, "-p", str(run_dir), "-c", str(conf)], log=run_dir / "nginx.log")
        wait_for_port(port, child)
        print(f"server: nginx ({nginx}) at http://127.0.0.1:{port}")
        return Site(f"http://127.0.0.1:{port}", "nginx", child)
    if prefer != "python":
        print(f"server: nginx not found ({NGINX_HINT} to install it); falling back to scripts/siteserver.py. "
              "It spends much more CPU per page than nginx and competes with the crawlers for the cores, "
              "so every figure below is lower than it would be behind nginx.")
    child = Child("siteserver", [PY, str(ROOT / "scripts" / "siteserver.py"), str(site_dir), "--port", str(port)],
                  log=run_dir / "siteserver.log", stdout=subprocess.PIPE)
    url = child.popen.stdout.readline().decode().strip()   # it prints its URL once it listens
    if not url:
        raise RuntimeError(f"scripts/siteserver.py did not start; its log: {child.log}")
    print(f"server: scripts/siteserver.py at {url}")
    return Site(url, "siteserver", child)


def expected_audio(manifest: sitegen.Manifest) -> set[tuple[str, str]]:
    return {(a.url, a.page) for a in manifest.audio}


def found_audio(rows: list[dict], origin: str) -> set[tuple[str, str]]:
    return {(r["url"].removeprefix(origin), (r.get("page") or "").removeprefix(origin)) for r in rows}


# --- one run of each crawler -----------------------------------------------------------------------------------------


@dataclass
class RunResult:
    label: str
    concurrency: int                     # total requests in flight allowed
    pages: int
    elapsed: float                       # as the crawler itself reports it
    wall: float                          # first process started to last process reaped
    procs: list[Usage]
    audio_found: int
    audio_expected: int
    links: int | None = None             # reported to the master (ours only)
    server_cpu_s: float | None = None    # the site server's CPU during the run
    proxy_cpu_s: float | None = None     # the loopback proxy's CPU during the run (--proxy)
    files: int | None = None             # audio files stored (downloading runs only)
    file_bytes: int = 0
    machine_busy: float | None = None    # share of all cores busy during the run, whoever used them
    loop_lag_ms: float | None = None     # the master's worst event-loop lag (ours only)
    notes: list[str] = field(default_factory=list)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def cpu_s(self) -> float:
        return sum(u.cpu_s for u in self.procs)

    @property
    def cpu_ms_per_page(self) -> float:
        return 1000 * self.cpu_s / self.pages if self.pages else float("nan")

    @property
    def files_per_s(self) -> float:
        return (self.files or 0) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.file_bytes / 1e6 / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def peak_rss_mb(self) -> float:
        return sum(u.peak_rss_mb for u in self.procs)


def _summary_figures(text: str) -> dict[str, float]:
    """The master's exit summary ("  pages fetched   123" ...) as numbers by label."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        for i in range(len(parts) - 1, 0, -1):
            try:
                value = float(parts[i])
            except ValueError:
                continue
            out[" ".join(parts[:i])] = value
            break
    return out


def stored_files(folders: list[Path]) -> tuple[int, int]:
    """Files and bytes stored under folders (every file below them)."""
    files = size = 0
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                files += 1
                size += path.stat().st_size
    return files, size


def run_ours(args: argparse.Namespace, manifest: sitegen.Manifest, site: Site, per_worker: int, run_dir: Path,
             *, profile: str | None = None, download: bool = False) -> tuple[RunResult, dict[str, Path]]:
    throw_away(run_dir, run_dir.parent)     # not deleted: see testkit/trash.py (ext4's freed inodes)
    run_dir.mkdir(parents=True)
    nodes = [f"node{i + 1}" for i in range(args.workers)]
    # --proxy: every request of the crawl (the master's robots.txt too) through a loopback proxy of its own
    # process (testkit/proxyserver.py), whose CPU is counted apart, as the site server's is.
    proxy: Child | None = None
    proxy_port = 0
    if args.proxy != "none":
        proxy_port = free_port()
        proxy = Child("proxy", [PY, "-m", "testkit.proxyserver", "--kind", args.proxy, "--port", str(proxy_port)],
                      log=run_dir / "proxy.log")
        wait_for_port(proxy_port, proxy)
    config = cluster.master_config(
        run_dir, [site.url + "/"], nodes,
        # Scrapy has no depth limit; ours gets room to spare, because a URL keeps the depth of the path it was
        # first reported on, which concurrent workers do not always make the shortest.
        crawl={"max_depth": manifest.max_depth + 4},
        politeness={"obey_robots": True},
        scheduling={"heartbeat_interval": 2.0, "heartbeat_timeout": 20.0, "lease_timeout": 120.0},
        dedup={"expected_urls": max(100_000, 4 * len(manifest.pages)), "fp_rate": 1e-6},
        **({"proxies": [f"{args.proxy}://127.0.0.1:{proxy_port}"]} if proxy is not None else {}),
    )
    worker_yaml = run_dir / "worker.yaml"
    worker_yaml.write_text(yaml.safe_dump({"concurrency": per_worker, "store_pages": True,
                                           "download_audio": download,
                                           "archive": {"enabled": args.archive != "off",
                                                       "audio_payload": args.archive == "full"},
                                           "identify": {"enabled": args.identify == "on"},
                                           **({"downloads": args.downloads} if args.downloads else {})}))
    data_dir = Path(yaml.safe_load(config.read_text())["data_dir"])
    addr_file = data_dir / "master.addr"
    profiles: dict[str, Path] = {}
    spies: list[Child] = []

    def launch(name: str, module: str, argv: list[str], log: Path, stdout: Path | None = None) -> Child:
        if profile == "pyinstrument" and name in ("master", "node1"):
            out = run_dir / f"profile-{name}.txt"
            profiles[name] = out
            return Child(name, [PY, "-m", "pyinstrument", "--show-all", "-o", str(out), "-m", module, *argv],
                         log=log, stdout=stdout)
        child = Child(name, [PY, "-m", module, *argv], log=log, stdout=stdout)
        if profile == "py-spy" and name in ("master", "node1"):
            out = run_dir / f"profile-{name}.txt"
            profiles[name] = out
            spies.append(Child(f"py-spy {name}", [args.py_spy, "record", "--pid", str(child.pid), "--rate", "250",
                                                  "--nonblocking", "--function", "--format", "raw", "-o", str(out)],
                               log=run_dir / f"py-spy-{name}.log"))
        return child

    server_cpu0 = tree_cpu_s(site.child.pid)
    machine = MachineCpu()
    t0 = time.monotonic()
    master = launch("master", "crawler.master", ["--config", str(config), "--log-level", "warning"],
                    run_dir / "master.log", run_dir / "master.out")
    deadline = time.monotonic() + 30
    while not (addr_file.exists() and addr_file.read_text().strip()):
        if not master.running() or time.monotonic() > deadline:
            master.stop()
            raise RuntimeError(f"the master did not start; its log: {master.log}")
        time.sleep(0.02)   # the master's only sign of life is this file
    addr = addr_file.read_text().strip()
    workers = [launch(n, "crawler.worker",
                      ["--master", addr, "--id", n, "--data-dir", str(run_dir / f"worker-{n}"),
                       "--secret-file", str(run_dir / "secret"), "--config", str(worker_yaml),
                       "--log-level", "warning"], run_dir / f"worker-{n}.log")
               for n in nodes]
    try:
        usages = [master.wait(args.timeout)]
        usages += [w.wait(60) for w in workers]
    finally:
        for c in [master, *workers]:
            c.stop()
    wall = time.monotonic() - t0
    busy = machine.busy_share()
    server_cpu = tree_cpu_s(site.child.pid) - server_cpu0
    proxy_cpu = None
    if proxy is not None:
        proxy_cpu = tree_cpu_s(proxy.pid)
        proxy.stop()
    for s in spies:
        s.wait(60)
    summary = (run_dir / "master.out").read_text(errors="replace")
    if usages[0].rc != 0:
        raise RuntimeError(f"the master exited with {usages[0].rc}; its log: {master.log}\n{summary}")
    figures = _summary_figures(summary)
    catalogue = data_dir / "catalog.jsonl"
    rows = [json.loads(line) for line in catalogue.read_text().splitlines() if line.strip()] \
        if catalogue.exists() else []
    expected = expected_audio(manifest)
    result = RunResult(
        label=f"ours {args.workers}x{per_worker}" + (" dl" if download else ""),
        concurrency=args.workers * per_worker,
        pages=int(figures.get("pages fetched", 0)), elapsed=figures.get("elapsed", wall), wall=wall,
        procs=usages, audio_found=len(expected & found_audio(rows, site.url)), audio_expected=len(expected),
        server_cpu_s=server_cpu, machine_busy=busy, proxy_cpu_s=proxy_cpu)
    if args.proxy != "none":
        result.label += f" {args.proxy}"
    if download:
        # Finished files only: the content-addressed shards (two hex digits), not partial/ or done/ records.
        result.files, result.file_bytes = stored_files(
            [shard for n in nodes for shard in (run_dir / f"worker-{n}" / "audio").glob("[0-9a-f][0-9a-f]")])
    result.loop_lag_ms = figures.get("loop lag worst")
    if "links reported" in figures:   # printed by the master itself, when it does
        result.links = int(figures["links reported"])
    else:
        result.links = recount_reported_links([run_dir / f"worker-{n}" for n in nodes])
        result.notes.append("links recounted from the stored pages")
    return result, profiles


def recount_reported_links(worker_dirs: list[Path]) -> int | None:
    """The links the workers reported to the master, from the pages they stored: each worker sends a link once
    (its link cache holds more links than this site has), audio links aside, so it reported the distinct
    followable links of its own pages. Redirect targets (a handful on this site) are not in the stored pages."""
    from selectolax.lexbor import LexborHTMLParser

    from crawler.web.links import extract_links
    from crawler.web.media import is_audio_url
    from crawler.web.urls import NormalizeOptions, normalize_many
    from crawler.worker.pagestore import read_page

    opts = NormalizeOptions()
    total = 0
    for wd in worker_dirs:
        index = wd / "pages" / "index.tsv"
        if not index.exists():
            return None
        seen: set[str] = set()
        for line in index.read_text(encoding="utf-8").splitlines():
            rel, _url, final_url, *_ = line.split("\t")
            tree = LexborHTMLParser(read_page(wd / "pages", rel))
            seen.update(u for u in normalize_many(extract_links(tree, final_url), opts)
                        if u and not is_audio_url(u))
        total += len(seen)
    return total


def run_scrapy(args: argparse.Namespace, manifest: sitegen.Manifest, site: Site, total: int,
               run_dir: Path, *, download: bool = False) -> RunResult:
    throw_away(run_dir, run_dir.parent)     # not deleted: see testkit/trash.py (ext4's freed inodes)
    run_dir.mkdir(parents=True)
    items, stats_path = run_dir / "items.jsonl", run_dir / "stats.json"
    server_cpu0 = tree_cpu_s(site.child.pid)
    machine = MachineCpu()
    t0 = time.monotonic()
    child = Child("scrapy", [PY, str(ROOT / "scripts" / "bench_scrapy_spider.py"), site.url + "/",
                             "--concurrency", str(total), "--items", str(items), "--stats", str(stats_path),
                             "--log-level", "WARNING"]
                  + (["--files-store", str(run_dir / "files")] if download else []), log=run_dir / "scrapy.log")
    usage = child.wait(args.timeout)
    wall = time.monotonic() - t0
    busy = machine.busy_share()
    server_cpu = tree_cpu_s(site.child.pid) - server_cpu0
    if usage.rc != 0 or not stats_path.exists():
        raise RuntimeError(f"the Scrapy spider exited with {usage.rc}; its log: {child.log}")
    stats = json.loads(stats_path.read_text())
    pages = stats.get("downloader/response_count", 0) - stats.get("robotstxt/response_count", 0)
    rows = [json.loads(line) for line in items.read_text().splitlines() if line.strip()] if items.exists() else []
    expected = expected_audio(manifest)
    if download:   # the FilesPipeline's requests are answered responses too, not pages
        pages -= stats.get("file_status_count/downloaded", 0)
    result = RunResult(label=f"Scrapy {total}" + (" files" if download else ""), concurrency=total, pages=pages,
                       elapsed=float(stats.get("elapsed_time_seconds", wall)), wall=wall, procs=[usage],
                       audio_found=len(expected & found_audio(rows, site.url)), audio_expected=len(expected),
                       server_cpu_s=server_cpu, machine_busy=busy)
    if download:
        result.files, result.file_bytes = stored_files([run_dir / "files"])
    return result


# --- profiles --------------------------------------------------------------------------------------------------------


def _frame_name(frame: str) -> str:
    """ "save (crawler/worker/pagestore.py:41)" -> "crawler/worker/pagestore.py:save" """
    func, _, where = frame.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path.removeprefix(str(ROOT) + '/')}:{func}"


STARTUP = "(start-up: imports)"
# Frames every sample passes through; listing them as inclusive hot spots says nothing.
_ENTRY_POINTS = ("/__main__.py:", "/cli.py:main", "/cli.py:<module>", ":Worker.serve", ":Master.serve")


def hot_spots(raw: Path, top: int) -> str:
    """py-spy's collapsed stacks, summed three ways: the function on CPU (self); the innermost function of our own
    package on the stack (what of ours the time is spent for, the libraries it calls included); and our
    functions anywhere on the stack (inclusive). Samples taken while importing modules count as start-up."""
    selfs: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [_frame_name(f) for f in stack.split(";")]
        if any("importlib._bootstrap" in f for f in frames):
            selfs[STARTUP] += count
            ours[STARTUP] += count
            continue
        selfs[frames[-1]] += count
        mine = [f for f in frames if f.startswith("crawler/")]
        ours[mine[-1] if mine else "(outside crawler/: event loop, libraries)"] += count
        for name in set(mine):
            if not any(e in name for e in _ENTRY_POINTS):
                incl[name] += count
    if not total:
        return "    no samples"
    lines = [f"    {total} samples of CPU"]
    for title, counter in (("on CPU (self)", selfs), ("innermost crawler/ function on the stack", ours),
                           ("crawler/ functions anywhere on the stack (inclusive)", incl)):
        lines.append(f"    {title}:")
        for name, count in counter.most_common(top):
            lines.append(f"      {100 * count / total:5.1f}%  {name}")
    return "\n".join(lines)


# --- the report ------------------------------------------------------------------------------------------------------


def print_result(r: RunResult) -> None:
    print(f"  {r.label:<14} {r.pages:>7} pages in {r.elapsed:6.1f} s = {r.pages_per_s:7.0f} pages/s   "
          f"CPU {r.cpu_ms_per_page:5.2f} ms/page ({r.cpu_s:.1f} s)   peak RSS {r.peak_rss_mb:6.0f} MB   "
          f"audio {r.audio_found}/{r.audio_expected}   wall {r.wall:.1f} s")
    extras = []
    if r.machine_busy is not None:
        extras.append(f"machine {100 * r.machine_busy:.0f}% busy during the run (all processes)")
    if r.server_cpu_s is not None:
        extras.append(f"site server {1000 * r.server_cpu_s / max(r.pages, 1):.2f} ms/page (not counted above)")
    if r.proxy_cpu_s is not None:
        extras.append(f"proxy {1000 * r.proxy_cpu_s / max(r.pages, 1):.2f} ms/page (not counted above)")
    if r.loop_lag_ms is not None:
        extras.append(f"master event loop held at most {r.loop_lag_ms:.0f} ms")
    if extras:
        print(f"  {'':<14}   " + "; ".join(extras))
    if len(r.procs) > 1:
        for u in r.procs:
            print(f"  {'':<14}   {u.name:<8} CPU {1000 * u.cpu_s / max(r.pages, 1):5.2f} ms/page "
                  f"({u.cpu_s:.1f} s, {100 * u.cpu_s / r.elapsed:3.0f}% of a core, "
                  f"{100 * u.system_s / max(u.cpu_s, 1e-9):2.0f}% in the kernel)   peak RSS {u.peak_rss_mb:5.0f} MB")
    if r.files is not None:
        print(f"  {'':<14}   {r.files} audio files stored, {r.file_bytes / 1e6:.1f} MB: {r.files_per_s:.0f} files/s, "
              f"{r.mb_per_s:.1f} MB/s")
    if r.links is not None:
        master = r.procs[0].cpu_s
        print(f"  {'':<14}   master CPU per reported link {1e6 * master / max(r.links, 1):.1f} us "
              f"({r.links} links; {r.links / max(r.pages, 1):.1f} per page" + (f"; {'; '.join(r.notes)})" if r.notes
                                                                             else ")"))


def pooled_marginal_ms(pairs: list[tuple[RunResult, RunResult]]) -> float:
    """The same from all pairs at once: the median CPU of the crawls with downloads less the median of those
    without, per file. One slow crawl moves a pair's difference by all of its slowness; it moves a median less."""
    def median(values: list[float]) -> float:
        values = sorted(values)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    files = median([float(w.files) for _, w in pairs])
    if not files:
        return float("nan")
    return (median([w.cpu_s for _, w in pairs]) - median([b.cpu_s for b, _ in pairs])) * 1000 / files


def marginal_ms(without: RunResult, with_dl: RunResult) -> float:
    """CPU ms one file cost: the downloading crawl's CPU less the same crawl's without downloads, per file."""
    return (with_dl.cpu_s - without.cpu_s) * 1000 / with_dl.files if with_dl.files else float("nan")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--songs", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true", help="2,000 songs, Scrapy at the first concurrency only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", default="64,256", help="page fetches in flight per worker, comma separated")
    ap.add_argument("--server", choices=["auto", "nginx", "python"], default="auto")
    ap.add_argument("--scrapy", choices=["each", "first", "none"], default=None,
                    help="run Scrapy at each concurrency (default), the first only, or not at all")
    ap.add_argument("--download-audio", action="store_true",
                    help="both crawlers also download the audio (Scrapy with FilesPipeline), each after a crawl "
                         "without, so the CPU a file costs is measured")
    ap.add_argument("--downloads", type=int, default=None,
                    help="the workers' downloads in flight (their `downloads` key; default: the worker's default)")
    ap.add_argument("--archive", choices=["on", "off", "full"], default="on",
                    help="the workers' archive: on (the default: every exchange, audio bytes kept apart), off (only "
                         "the stored pages), full (audio bytes in the WARC too)")
    ap.add_argument("--identify", choices=["on", "off"], default="on",
                    help="the workers' fingerprints of downloaded audio: on (the default) or off, so the CPU a file "
                         "costs with and without them is measured")
    ap.add_argument("--proxy", choices=["none", "http", "socks5"], default="none",
                    help="crawl through a loopback proxy of this kind (testkit/proxyserver.py, its CPU printed "
                         "apart): the cost per page of a proxy")
    ap.add_argument("--profile", choices=["py-spy", "pyinstrument"], default=None)
    ap.add_argument("--top", type=int, default=15, help="hot spots printed per profile view")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-data")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed for one crawl")
    ap.add_argument("--repeat", type=int, default=1,
                    help="crawls of ours at each concurrency; the results use the median one by CPU per page "
                         "and print the range (this machine's speed varies from run to run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.songs = min(args.songs, 2000)
        args.scrapy = args.scrapy or "first"
    args.scrapy = args.scrapy or "each"
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.profile == "py-spy":
        args.py_spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
        if not os.access(args.py_spy, os.X_OK):
            raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    if args.scrapy != "none":
        try:
            import scrapy  # noqa: F401
        except ImportError:
            raise SystemExit("Scrapy is not installed: .venv/bin/pip install -e '.[bench]'") from None

    # The daemons' modules compiled first, as an installed package's are (Scrapy's were when pip installed it):
    # where PYTHONDONTWRITEBYTECODE is set, a module edited since setup.sh compiled it would otherwise be compiled
    # again at every daemon's start, CPU that counts in ours and in no real deployment.
    compileall.compile_dir(ROOT / "crawler", quiet=1)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    downloads_per_worker = args.downloads or WORKER_SPEC["downloads"].default
    manifest = prepare_site(out, args.songs)
    site = serve_site(out / f"site-{args.songs}", out / "server", args.server)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the runs (other work "
          "on the machine lowers pages/s more than CPU per page)")
    if (note := deletion_note(out)) is not None:
        print(note)
    print(f"ours: {args.workers} workers, download_audio "
          f"{'false, then true' if args.download_audio else 'false'}, store_pages true, archive {args.archive}"
          + (f", {downloads_per_worker} downloads in flight per worker, fingerprints {args.identify}"
             if args.download_audio else "") + "; Scrapy "
          f"{'without, then with FilesPipeline' if args.download_audio else 'without downloads'}; "
          "robots.txt obeyed by both\n")
    ours: dict[int, RunResult] = {}
    spread: dict[int, list[RunResult]] = {}     # every run of ours at a concurrency, by CPU per page
    theirs: dict[int, RunResult] = {}
    ours_dl: dict[int, RunResult] = {}
    ours_base: dict[int, RunResult] = {}        # the crawl without downloads right before ours_dl's
    dl_pairs: dict[int, list[tuple[RunResult, RunResult]]] = {}   # every (without, with downloads) of ours
    theirs_dl: dict[int, RunResult] = {}
    try:
        # Ours at every concurrency in turn, --repeat times, then Scrapy: the levels are compared on runs made
        # close together, not minutes apart while the machine's speed drifts.
        for _ in range(max(1, args.repeat)):
            for c in levels:
                spread.setdefault(c, []).append(run_ours(args, manifest, site, c, out / f"ours-{c}")[0])
                print_result(spread[c][-1])
                if args.download_audio:
                    with_dl = run_ours(args, manifest, site, c, out / f"ours-dl-{c}", download=True)[0]
                    dl_pairs.setdefault(c, []).append((spread[c][-1], with_dl))
                    print_result(with_dl)
            print()
        for c, runs in spread.items():
            runs.sort(key=lambda r: r.cpu_ms_per_page)
            ours[c] = runs[(len(runs) - 1) // 2]     # the median; of two, the better
        for c, pairs in dl_pairs.items():
            # Each downloading crawl is judged against the crawl without downloads made right before it.
            pairs.sort(key=lambda pair: marginal_ms(*pair))
            ours_base[c], ours_dl[c] = pairs[(len(pairs) - 1) // 2]
        for i, c in enumerate(levels):
            if args.scrapy == "each" or (args.scrapy == "first" and i == 0):
                # The same total in flight as ours: with downloads, our workers' download slots count too
                # (Scrapy's file requests share its one limit with its pages).
                total = args.workers * (c + (downloads_per_worker if args.download_audio else 0))
                s = run_scrapy(args, manifest, site, total, out / f"scrapy-{total}")
                theirs[c] = s
                print_result(s)
                if args.download_audio:
                    theirs_dl[c] = run_scrapy(args, manifest, site, total, out / f"scrapy-dl-{total}",
                                              download=True)
                    print_result(theirs_dl[c])
                print()
        profiles: dict[str, Path] = {}
        if args.profile:
            c = levels[0]
            r, profiles = run_ours(args, manifest, site, c, out / f"profile-{c}", profile=args.profile,
                                   download=args.download_audio)
            print(f"profiled run ({args.profile}; not one of the measured figures):")
            print_result(r)
            print()
    finally:
        site.child.stop(signal.SIGQUIT if site.kind == "nginx" else signal.SIGTERM)
        empty_trash(out)

    print(f"results ({len(manifest.pages)}-page site behind {site.kind}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at the end):")
    print(f"  {'':<14} {'pages/s':>8} {'CPU ms/page':>12} {'peak RSS MB':>12} {'ratio pages/s':>14} "
          f"{'ratio CPU':>10} {'ratio RSS':>10}")
    for c in levels:
        r = ours[c]
        s = theirs.get(c)
        print(f"  {r.label:<14} {r.pages_per_s:8.0f} {r.cpu_ms_per_page:12.2f} {r.peak_rss_mb:12.0f}", end="")
        if s:
            print(f" {r.pages_per_s / s.pages_per_s:13.1f}x {s.cpu_ms_per_page / r.cpu_ms_per_page:9.1f}x "
                  f"{r.peak_rss_mb / s.peak_rss_mb:9.2f}x")
            print(f"  {s.label:<14} {s.pages_per_s:8.0f} {s.cpu_ms_per_page:12.2f} {s.peak_rss_mb:12.0f}")
        else:
            print()
    print("  (ratio pages/s: ours over Scrapy's; ratio CPU: Scrapy's CPU per page over ours; ratio RSS: ours "
          "summed over all processes, over Scrapy's)")
    if args.repeat > 1:
        print(f"  (ours: the median of {args.repeat} runs by CPU per page; all runs:")
        for c in levels:
            runs = spread[c]
            rates = sorted(r.pages_per_s for r in runs)
            print(f"   {c} per worker: CPU {runs[0].cpu_ms_per_page:.2f}-{runs[-1].cpu_ms_per_page:.2f} ms/page, "
                  f"{rates[0]:.0f}-{rates[-1]:.0f} pages/s)")
    print()
    print("targets (issue 8):")
    for c in levels:
        r, s = ours[c], theirs.get(c)
        if s:
            print(f"  {verdict(r.pages_per_s >= 10 * s.pages_per_s):>7}  pages/s at least 10x Scrapy's at "
                  f"{r.concurrency} in flight: {r.pages_per_s / s.pages_per_s:.1f}x")
        print(f"  {verdict(r.cpu_ms_per_page <= 1.0):>7}  at most 1.0 ms CPU per page at {c} per worker: "
              f"{r.cpu_ms_per_page:.2f} ms")
        master_share = r.procs[0].cpu_s / r.elapsed
        print(f"  {'':>7}  master busy {100 * master_share:.0f}% of a core at {c} per worker "
              f"({1000 * r.procs[0].cpu_s / max(r.pages, 1):.2f} ms per page)")
    if 64 in ours and 256 in ours:
        a, b = ours[64].pages_per_s, ours[256].pages_per_s
        print(f"  {verdict(b >= 0.9 * a):>7}  pages/s at 256 per worker within 10% of that at 64: "
              f"{b:.0f} vs {a:.0f} ({100 * (b / a - 1):+.1f}%)")
    if args.download_audio:
        print()
        print("downloads (CPU per file: the crawl's CPU with downloads minus that without, over the files stored):")
        print(f"  {'':<18} {'pages/s':>8} {'files/s':>8} {'MB/s':>7} {'files':>6} {'CPU ms/file':>12} "
              f"{'total CPU ms/file':>18}")
        for c in levels:
            pairs = [(ours_dl.get(c), ours_base.get(c))]
            if c in theirs_dl:
                pairs.append((theirs_dl[c], theirs.get(c)))
            for with_dl, without in pairs:
                if with_dl is None or not with_dl.files:
                    continue
                marginal = marginal_ms(without, with_dl) if without else float("nan")
                print(f"  {with_dl.label:<18} {with_dl.pages_per_s:8.0f} {with_dl.files_per_s:8.0f} "
                      f"{with_dl.mb_per_s:7.1f} {with_dl.files:6d} {marginal:12.2f} "
                      f"{with_dl.cpu_s * 1000 / with_dl.files:18.2f}")
        for c, pairs in dl_pairs.items():
            if len(pairs) > 1:
                rates = sorted(w.files_per_s for _, w in pairs)
                print(f"  (ours at {c} per worker: the median of {len(pairs)} pairs of crawls by CPU per file; all "
                      f"pairs: {marginal_ms(*pairs[0]):.2f}-{marginal_ms(*pairs[-1]):.2f} ms/file, "
                      f"{rates[0]:.0f}-{rates[-1]:.0f} files/s;")
                print(f"   the median downloading crawl's CPU less the median of those without, per file: "
                      f"{pooled_marginal_ms(pairs):.2f} ms)")
        print("targets (issue 20):")
        for c in levels:
            r, s, base = ours_dl.get(c), theirs_dl.get(c), ours_base.get(c)
            if r is None or not r.files:
                print(f"  NOT met  ours stored no audio at {c} per worker")
                continue
            if s and s.files:
                print(f"  {verdict(r.files_per_s >= 10 * s.files_per_s):>7}  files/s at least 10x Scrapy's "
                      f"(FilesPipeline) at {s.concurrency} in flight: {r.files_per_s / s.files_per_s:.1f}x")
            if base is not None:
                per_file = marginal_ms(base, r)
                print(f"  {verdict(per_file <= 0.5):>7}  at most 0.5 ms CPU per small file over master and "
                      f"workers at {c} per worker: {per_file:.2f} ms")
    for name, path in profiles.items():
        print()
        if args.profile == "py-spy":
            print(f"hot spots of {name} ({path}):")
            print(hot_spots(path, args.top) if path.exists() else "    (no profile written)")
        else:
            print(f"profile of {name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
