"""The worker's fingerprint pool: every audio file it stores is fingerprinted (crawler.identify.fingerprint_file)
off the event loop, in worker processes of its own, so the CPU it takes never holds the crawl.

The pool is bounded: at most `max_backlog` files wait for it or are being fingerprinted; past that a file is
skipped (counted, never waited for). A file's fingerprint is made once: files named by the same key (their
sha256) share one job, and recent fingerprints are kept (up to `cache_bytes`) for the same file stored again (a
revisit, a second address). A file that cannot be fingerprinted is logged once, and its future holds None: an
item never fails for it. That the file is to blame (too short, not audio, undecodable: common on the web, and
every file of the demo's site) is a DEBUG line and the metric's "error" count; the pool's own failures (a process
died, the pool would not start, the fingerprinter raised something else than IdentifyError) are WARNINGs. A worker process that dies (a decoder crash, the OOM killer) costs the files in flight
with it; the next file starts a new pool.

The server decides how long an item waits for its fingerprint (see Worker._fingerprinted); the pool only runs the
jobs and says how many are in it (`backlog`, the crawler_fingerprint_backlog gauge and the heartbeat's field).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from crawler.config import non_negative, positive, setting
from crawler.identify import MAX_FINGERPRINT_BYTES, IdentifyError

log = logging.getLogger("crawler.worker.fingerprints")

Fingerprinter = Callable[[Path], bytes]   # picklable (a module's function): it runs in the pool's processes

DONE, ERROR, SKIPPED = "done", "error", "skipped"     # a file's outcome, as the metric counts it
CACHE_BYTES = 32 * 1024 * 1024
ERRORS_KEPT = 4096       # files whose error was logged, so a file stored again is not logged again


@dataclass(frozen=True, kw_only=True)
class IdentifyConfig:
    """The worker's `identify` section."""

    enabled: bool = setting("bool", True)
    processes: int = setting("int", 1, positive)          # worker processes fingerprinting, apart from the crawl
    max_backlog: int = setting("int", 1000, positive)     # files waiting or in work; more are skipped
    # Seconds a download's outcome waits for its file's fingerprint (when the pool is idle enough to start it
    # at once); past that it goes without, and again with it once it is made.
    wait: float = setting("float", 10.0, non_negative)


class FingerprinterFailed(IdentifyError):
    """The fingerprinter raised something else than IdentifyError: a fault of the code, not of the file."""


def _run(fingerprint: Fingerprinter, path: Path) -> bytes:
    """In a pool process: the fingerprint, or IdentifyError with one line saying why (anything else the
    fingerprinter raised, said the same way as FingerprinterFailed: the exception must cross back to the worker)."""
    try:
        return fingerprint(path)
    except IdentifyError:
        raise
    except Exception as e:
        raise FingerprinterFailed(f"{type(e).__name__}: {e}"[:300]) from None


def _die_with(parent: int) -> None:
    """In a pool process, first: it dies with the worker, even a killed one (a pool process outliving it would
    hold its pipes and files open, and wait on its queue for ever)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)      # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:      # the worker died before the line above
        os._exit(0)


def _warm() -> None:
    """Nothing: run once in each pool process as the worker starts, so that it is up before the first file."""


def process_pool(processes: int) -> Executor:
    # Spawned, not forked: a fork of the worker would copy its event loop, sockets and threads.
    return ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with, initargs=(os.getpid(),))


class FingerprintPool:
    def __init__(self, fingerprint: Fingerprinter, *, processes: int = 1, max_backlog: int = 1000,
                 executor: Callable[[int], Executor] = process_pool,
                 on_outcome: Callable[[str], None] | None = None, cache_bytes: int = CACHE_BYTES) -> None:
        """fingerprint: the fingerprinter (crawler.identify.fingerprint_file; tests pass a fake); executor:
        makes the pool's executor for `processes` workers, at the first file (a process pool by default)."""
        self.fingerprint = fingerprint
        self.processes = processes
        self.max_backlog = max_backlog
        self.cache_bytes = cache_bytes
        self._make_executor = executor
        self._on_outcome = on_outcome or (lambda outcome: None)
        self._executor: Executor | None = None
        self._jobs: dict[str, asyncio.Future[bytes | None]] = {}     # by key: waiting or in work
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._errors: OrderedDict[str, None] = OrderedDict()
        self._closed = False

    def start(self) -> None:
        """Start the pool's processes now: a spawned process takes a while to start (its imports), which the
        first stored file would otherwise wait for."""
        if self._executor is not None or self._closed:
            return
        try:
            self._executor = self._make_executor(self.processes)
            for _ in range(self.processes):
                self._executor.submit(_warm)
        except (RuntimeError, OSError) as e:
            log.warning("fingerprint pool not started: %s (it is tried again at the first file)", e)
            self._executor = None

    @property
    def backlog(self) -> int:
        """Files waiting for the pool or being fingerprinted."""
        return len(self._jobs)

    def cached(self, key: str) -> bytes | None:
        """The fingerprint of these bytes, when it is still in the cache."""
        return self._cache.get(key)

    def busy(self) -> bool:
        """A file submitted now would wait for others (every process has one already)."""
        return len(self._jobs) >= self.processes

    def submit(self, key: str, path: Path) -> asyncio.Future[bytes | None] | None:
        """The future fingerprint of the file at path (None in it: it has none, the error is logged), or None
        when the backlog is full (the file is skipped). key names the file's bytes (its sha256): the same
        bytes are fingerprinted once."""
        loop = asyncio.get_running_loop()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            ready: asyncio.Future[bytes | None] = loop.create_future()
            ready.set_result(cached)
            return ready
        job = self._jobs.get(key)
        if job is not None:
            return job
        if self._closed or len(self._jobs) >= self.max_backlog:
            self._on_outcome(SKIPPED)
            return None
        job = loop.create_future()
        self._jobs[key] = job
        try:
            if self._executor is None:
                self._executor = self._make_executor(self.processes)
            running = loop.run_in_executor(self._executor, _run, self.fingerprint, path)
        except (RuntimeError, OSError) as e:     # the executor is shut down, or no process could start
            self._failed(key, path, f"the pool cannot take it: {e}")
            del self._jobs[key]
            job.set_result(None)
            return job
        running.add_done_callback(lambda f: self._ended(key, path, f, job))
        return job

    def _ended(self, key: str, path: Path, running: asyncio.Future[bytes], job: asyncio.Future[bytes | None]) -> None:
        self._jobs.pop(key, None)
        fp: bytes | None = None
        if running.cancelled():
            pass
        elif (e := running.exception()) is not None:
            if isinstance(e, BrokenProcessPool):
                # A process died: the pool is of no more use. The next file makes a new one.
                broken, self._executor = self._executor, None
                if broken is not None:
                    broken.shutdown(wait=False, cancel_futures=True)
                self._failed(key, path, "a fingerprinting process died")
            else:
                # IdentifyError: the file cannot be fingerprinted, which is the file's business, not the pool's.
                file_only = isinstance(e, IdentifyError) and not isinstance(e, FingerprinterFailed)
                self._failed(key, path, str(e) or type(e).__name__, level=logging.DEBUG if file_only else None)
        else:
            fp = bytes(running.result())[:MAX_FINGERPRINT_BYTES]
            if fp:
                self._on_outcome(DONE)
                self._keep(key, fp)
            else:
                self._failed(key, path, "empty fingerprint")
                fp = None
        if not job.done():
            job.set_result(fp)

    def _failed(self, key: str, path: Path, why: str, level: int | None = None) -> None:
        """level: DEBUG when the file is to blame; a WARNING (the default) otherwise."""
        self._on_outcome(ERROR)
        if key in self._errors:
            return
        self._errors[key] = None
        if len(self._errors) > ERRORS_KEPT:
            self._errors.popitem(last=False)
        log.log(logging.WARNING if level is None else level, "no fingerprint for %s: %s", path, why)

    def _keep(self, key: str, fp: bytes) -> None:
        if len(fp) > self.cache_bytes:
            return
        self._cache[key] = fp
        self._cached += len(fp)
        while self._cached > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old)

    def close(self) -> None:
        """Stop: files waiting are dropped (their futures hold None), those in work are not waited for."""
        self._closed = True
        for job in self._jobs.values():
            if not job.done():
                job.set_result(None)
        self._jobs.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
            # A file in work is not waited for: a stopping worker must not wait on a long (or stuck) decode.
            for proc in list((getattr(executor, "_processes", None) or {}).values()):
                proc.terminate()
