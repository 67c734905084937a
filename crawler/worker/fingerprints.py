"""The worker's fingerprint pool: every audio file it stores is fingerprinted (crawler.identify.fingerprint_file)
off the event loop, in worker processes of its own, so the CPU it takes never holds the crawl.

The pool is bounded: at most `max_backlog` files wait for it or are being fingerprinted; past that a file is
skipped (counted, never waited for). A file's fingerprint is made once: files named by the same key (their
sha256) share one job, and recent fingerprints are kept (up to `cache_bytes`) for the same file stored again (a
revisit, a second address). A file that cannot be fingerprinted is logged once, and its future holds None: an
item never fails for it. That the file is to blame (too short, not audio, undecodable: common on the web, and
every file of the demo's site) is a DEBUG line and the metric's "error" count; the pool's own failures (a process
died, the pool would not start, the fingerprinter raised something else than IdentifyError) are WARNINGs. A
worker process that dies (a decoder crash, the OOM killer) takes its batch with it; the next file starts a new
pool, and the files of that batch are tried again there one at a time, so the file that killed it goes without
and the others do not.

Two things keep the pool's cost per file small (most files on the web are short clips, jingles, previews):

* A file known to be shorter than ``MIN_SECONDS`` (crawler/identify: no audio worth matching) is not
  sent at all. How long it plays is the caller's to say, from the file's own tags (``file_seconds``: its
  duration, else its size at its bitrate), so the decision costs no round trip to a pool process; such a file is
  counted as "short" and its future holds None at once. A file whose length is unknown is sent as before.
* Files go to a process in batches, not one call each: those submitted within ``gather`` seconds of the first
  (or until ``batch_files`` of them, or ``batch_bytes`` of files) go in one call, which answers per file; an
  error of one file is that file's, never its batch's. The files gathered are spread over the processes that
  have nothing to do, so a batch never leaves a process idle while another works through two.

The server decides how long an item waits for its fingerprint (see Worker._fingerprinted); the pool only runs the
jobs and says how many are in it (`backlog`, the crawler_fingerprint_backlog gauge and the heartbeat's field).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from crawler.config import non_negative, positive, setting
from crawler.identify import MAX_FINGERPRINT_BYTES, MIN_SECONDS, IdentifyError
from crawler.items import AudioItem

log = logging.getLogger("crawler.worker.fingerprints")

Fingerprinter = Callable[[Path], bytes]   # picklable (a module's function): it runs in the pool's processes

# A file's outcome, as the metric counts it: fingerprinted, not fingerprintable, not sent (the backlog was full),
# not sent (it is known to be too short to match).
DONE, ERROR, SKIPPED, SHORT = "done", "error", "skipped", "short"
OUTCOMES = (DONE, ERROR, SKIPPED, SHORT)
CACHE_BYTES = 32 * 1024 * 1024
GATHER = 0.05               # seconds a batch gathers files after its first ...
BATCH_FILES = 32            # ... unless it has this many files ...
BATCH_BYTES = 4 * 1024 * 1024   # ... or this many bytes of files (as the caller gave their sizes)
ERRORS_KEPT = 4096       # files whose error was logged, so a file stored again is not logged again
STOP_WAIT = 2.0          # seconds a stopping pool waits for a process told to end, before it is killed


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


def _run_batch(fingerprint: Fingerprinter, paths: list[Path]) -> list[bytes | IdentifyError]:
    """In a pool process: each file's fingerprint, or the IdentifyError that says why it has none, in order.
    One file's error is its own: the others of the batch are fingerprinted all the same. A fingerprint is cut
    to the wire's limit here, so no more than that crosses back."""
    out: list[bytes | IdentifyError] = []
    for path in paths:
        try:
            out.append(bytes(_run(fingerprint, path))[:MAX_FINGERPRINT_BYTES])
        except IdentifyError as e:
            out.append(e)
    return out


def file_seconds(item: AudioItem) -> float | None:
    """How long a stored file plays by what the file itself says (its tags, as read into the item by
    AudioItem.with_file_tags): its duration, else its size at its bitrate; None when it says neither. A page's
    values are not the file's and are never used (the page may describe another cut of the song)."""

    def own(name: str) -> float | None:
        value = item.file_tags.get(name) if name in item.file_tags else (
            getattr(item, name) if item.meta_source.get(name) == "file" else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return None
        return float(value)

    duration = own("duration")
    if duration is not None:
        return duration
    bitrate = own("bitrate")     # kbit/s
    if bitrate is not None and item.size:
        return item.size * 8 / (bitrate * 1000)
    return None


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


@contextlib.contextmanager
def _apart_from_main(fingerprint: Fingerprinter) -> Iterator[None]:
    """Pool processes started within this block do not import this process's main module. A spawned process
    imports it again (as __mp_main__) before it unpickles anything; the worker's is its command line, with the
    whole crawler behind it: about 0.2 s of CPU for every pool process started, for nothing its jobs need (they
    are functions of importable modules). Kept as ever when the fingerprinter itself is defined in it."""
    main = sys.modules.get("__main__")
    if main is None or getattr(fingerprint, "__module__", None) == "__main__":
        yield
        return
    spec, file = main.__dict__.get("__spec__"), main.__dict__.get("__file__")
    main.__spec__ = None
    if file is not None:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if file is not None:
            main.__file__ = file


def process_pool(processes: int) -> Executor:
    # Spawned, not forked: a fork of the worker would copy its event loop, sockets and threads.
    return ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with, initargs=(os.getpid(),))


@dataclass
class _Batch:
    """Files sent to a pool process in one call, each with its key and its job."""

    files: list[tuple[str, Path, asyncio.Future[bytes | None]]]
    executor: Executor | None = None      # the one it was sent to
    suspect: bool = False                 # one file of a batch whose process died, tried again alone


class FingerprintPool:
    def __init__(self, fingerprint: Fingerprinter, *, processes: int = 1, max_backlog: int = 1000,
                 executor: Callable[[int], Executor] = process_pool,
                 on_outcome: Callable[[str], None] | None = None, cache_bytes: int = CACHE_BYTES,
                 gather: float = GATHER, batch_files: int = BATCH_FILES, batch_bytes: int = BATCH_BYTES) -> None:
        """fingerprint: the fingerprinter (crawler.identify.fingerprint_file; tests pass a fake); executor:
        makes the pool's executor for `processes` workers, at the first file (a process pool by default);
        gather, batch_files, batch_bytes: how long a batch gathers files, and when it goes before that."""
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
        self._gather, self._batch_files, self._batch_bytes = gather, batch_files, batch_bytes
        self._gathered: list[tuple[str, Path, asyncio.Future[bytes | None]]] = []   # the next batch's files
        self._gathered_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._running = 0       # batches sent to the executor and not ended
        # The files of batches whose process died, to be tried again one at a time, and the one in work.
        self._suspects: deque[tuple[str, Path, asyncio.Future[bytes | None]]] = deque()
        self._suspect: _Batch | None = None

    def start(self) -> None:
        """Start the pool's processes now: a spawned process takes a while to start (its imports), which the
        first stored file would otherwise wait for."""
        if self._executor is not None or self._closed:
            return
        try:
            self._executor = self._make_executor(self.processes)
            with _apart_from_main(self.fingerprint):
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

    def submit(self, key: str, path: Path, *, seconds: float | None = None,
               size: int | None = None) -> asyncio.Future[bytes | None] | None:
        """The future fingerprint of the file at path (None in it: it has none, the error is logged), or None
        when the backlog is full (the file is skipped). key names the file's bytes (its sha256): the same
        bytes are fingerprinted once. seconds: how long the file plays, when its tags say (file_seconds); a file
        shorter than MIN_SECONDS is not sent, and its future holds None at once. size: the file's bytes, which
        bound a batch (unknown: counted as none)."""
        loop = asyncio.get_running_loop()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return _ready(loop, cached)
        job = self._jobs.get(key)
        if job is not None:
            return job
        if seconds is not None and seconds < MIN_SECONDS:
            self._on_outcome(SHORT)
            return _ready(loop, None)
        if self._closed or len(self._jobs) >= self.max_backlog:
            self._on_outcome(SKIPPED)
            return None
        job = loop.create_future()
        self._jobs[key] = job
        self._gathered.append((key, path, job))
        self._gathered_bytes += max(0, size or 0)
        if len(self._gathered) >= self._batch_files or self._gathered_bytes >= self._batch_bytes:
            self._send(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self._gather, self._send, loop)
        return job

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        """The files gathered go, in one batch, or spread over the processes with nothing to do."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        files, self._gathered, self._gathered_bytes = self._gathered, [], 0
        if not files:
            return
        parts = max(1, min(len(files), self.processes - self._running))
        for i in range(parts):
            self._dispatch(loop, _Batch(files[i::parts]))

    def _dispatch(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        try:
            if self._executor is None:
                self._executor = self._make_executor(self.processes)
            batch.executor = self._executor
            with _apart_from_main(self.fingerprint):   # a process (re)started for it
                running = loop.run_in_executor(self._executor, _run_batch, self.fingerprint,
                                               [path for _, path, _ in batch.files])
        except (RuntimeError, OSError) as e:     # the executor is shut down, or no process could start
            self._ended_all(batch, f"the pool cannot take it: {e}")
            return
        self._running += 1
        running.add_done_callback(functools.partial(self._ended, batch))

    def _next_suspect(self) -> None:
        """The next file of a batch whose process died goes alone, once the one before it has ended."""
        if self._suspect is not None or not self._suspects or self._closed:
            return
        self._suspect = _Batch([self._suspects.popleft()], suspect=True)
        self._dispatch(asyncio.get_running_loop(), self._suspect)

    def _ended(self, batch: _Batch, running: asyncio.Future[list[bytes | IdentifyError]]) -> None:
        self._running -= 1
        try:
            self._ended_batch(batch, running)
        finally:
            if batch is self._suspect:
                self._suspect = None
            self._next_suspect()

    def _ended_batch(self, batch: _Batch, running: asyncio.Future[list[bytes | IdentifyError]]) -> None:
        if running.cancelled():
            self._ended_all(batch, None)
            return
        e = running.exception()
        if isinstance(e, BrokenProcessPool):
            # A process died: the pool is of no more use. The next file makes a new one (each batch the dead
            # pool held says so: only the first, while the pool is still this one's, drops it).
            if batch.executor is not None and batch.executor is self._executor:
                self._executor = None
                batch.executor.shutdown(wait=False, cancel_futures=True)
            if batch.suspect or self._closed:
                self._ended_all(batch, "a fingerprinting process died")
            else:
                # Which file killed it is not known: each is tried again alone, one after the other, so only
                # that file goes without (a file that died alone is that file).
                self._suspects.extend(batch.files)
            return
        if e is not None:     # the call itself failed (the batch could not cross to the process, or back)
            self._ended_all(batch, f"{type(e).__name__}: {e}"[:300])
            return
        results = running.result()
        for (key, path, job), result in zip(batch.files, results, strict=True):
            self._jobs.pop(key, None)
            fp: bytes | None = None
            if isinstance(result, IdentifyError):
                # The file cannot be fingerprinted, which is the file's business, not the pool's.
                file_only = not isinstance(result, FingerprinterFailed)
                self._failed(key, path, str(result) or type(result).__name__,
                             level=logging.DEBUG if file_only else None)
            elif result:
                fp = bytes(result)[:MAX_FINGERPRINT_BYTES]
                self._on_outcome(DONE)
                self._keep(key, fp)
            else:
                self._failed(key, path, "empty fingerprint")
            if not job.done():
                job.set_result(fp)

    def _ended_all(self, batch: _Batch, why: str | None) -> None:
        """Every file of the batch without a fingerprint: why is logged (None: the pool was closed)."""
        for key, path, job in batch.files:
            self._jobs.pop(key, None)
            if why is not None:
                self._failed(key, path, why)
            if not job.done():
                job.set_result(None)

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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._gathered, self._gathered_bytes = [], 0
        self._suspects.clear()
        for job in self._jobs.values():
            if not job.done():
                job.set_result(None)
        self._jobs.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            # Taken before shutdown, which lets go of both (the pool offers no public way to end a file in work).
            processes = list((getattr(executor, "_processes", None) or {}).values())
            thread = getattr(executor, "_executor_manager_thread", None)
            executor.shutdown(wait=False, cancel_futures=True)
            # A file in work is not waited for: a stopping worker must not wait on a long (or stuck) decode.
            for proc in processes:
                proc.terminate()
            for proc in processes:
                proc.join(STOP_WAIT)
                if proc.is_alive():
                    proc.kill()
                    proc.join(STOP_WAIT)
            # With its processes gone the pool's thread ends at once. Joined here, it is not still closing its
            # wake-up pipe when the interpreter exits and writes to that pipe (Python 3.11 races the two, and
            # printed "Bad file descriptor" as a worker exited).
            if thread is not None:
                thread.join(STOP_WAIT)


def _ready(loop: asyncio.AbstractEventLoop, value: bytes | None) -> asyncio.Future[bytes | None]:
    ready: asyncio.Future[bytes | None] = loop.create_future()
    ready.set_result(value)
    return ready
