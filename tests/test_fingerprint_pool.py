"""The worker's fingerprint pool (crawler/worker/fingerprints.py) with a fake fingerprinter (tests/fakes): files
fingerprinted off the event loop, a bounded backlog, errors logged once and never raised, and the worker's side of
it: an outcome waits a bounded time for its fingerprint, and one made later follows it."""

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from crawler import items as it
from crawler.identify import MAX_FINGERPRINT_BYTES
from crawler.worker.config import WorkerConfig
from crawler.worker.fingerprints import DONE, ERROR, SHORT, SKIPPED, FingerprintPool, file_seconds, process_pool
from crawler.worker.ledger import DownloadLedger
from crawler.worker.server import Worker
from testkit.cluster import write_secret
from tests.fakes.fingerprinter import expected, fake_fingerprint, huge_fingerprint


def _file(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _threads(n):
    return ThreadPoolExecutor(max_workers=n)


def _pool(**kw):
    outcomes = []
    kw.setdefault("executor", _threads)
    pool = FingerprintPool(kw.pop("fingerprint", fake_fingerprint), on_outcome=outcomes.append, **kw)
    return pool, outcomes


async def test_a_file_is_fingerprinted_in_a_process_of_the_pools_own(tmp_path):
    pool = FingerprintPool(fake_fingerprint, processes=1)     # the default executor: spawned processes
    try:
        pool.start()
        assert pool.backlog == 0
        job = pool.submit("k", _file(tmp_path, "a.mp3", b"audio"))
        assert pool.backlog == 1
        assert await asyncio.wait_for(job, 60) == expected(b"audio")
        assert pool.backlog == 0
        # The same bytes again: from the cache, at once.
        again = pool.submit("k", tmp_path / "a.mp3")
        assert again.done() and again.result() == expected(b"audio")
    finally:
        pool.close()


async def test_the_loop_turns_while_files_are_fingerprinted(tmp_path):
    pool, _ = _pool(processes=2)
    gaps, stop = [], False

    async def ticker():
        last = time.monotonic()
        while not stop:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", b"SLEEP 0.3\n%d" % i)) for i in range(4)]
    assert [await j for j in jobs] == [expected(b"SLEEP 0.3\n%d" % i) for i in range(4)]
    stop = True
    await tick
    assert len(gaps) > 20 and max(gaps) < 0.2
    pool.close()


async def test_the_backlog_is_bounded_and_a_file_past_it_is_skipped(tmp_path):
    pool, outcomes = _pool(processes=1, max_backlog=3)
    jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", b"SLEEP 0.2\n%d" % i)) for i in range(3)]
    assert pool.backlog == 3 and pool.busy()
    assert pool.submit("more", _file(tmp_path, "more.mp3", b"x")) is None
    assert outcomes == [SKIPPED]
    # The same bytes as one in the backlog share its job: nothing skipped.
    assert pool.submit("0", tmp_path / "0.mp3") is jobs[0]
    await asyncio.gather(*jobs)
    assert pool.backlog == 0 and outcomes.count(DONE) == 3
    assert await pool.submit("more", tmp_path / "more.mp3") == expected(b"x")
    pool.close()


@pytest.mark.parametrize("data, why, level", [(b"BAD", "not audio", logging.DEBUG),
                                               (b"BOOM", "ValueError: decoder exploded", logging.WARNING)])
async def test_an_error_is_logged_once_per_file_and_gives_no_fingerprint(tmp_path, caplog, data, why, level):
    """A file the fingerprinter refuses (IdentifyError: too short, not audio) is the file's business: a DEBUG
    line; anything else it raises is a fault worth a WARNING."""
    pool, outcomes = _pool(processes=1)
    path = _file(tmp_path, "x.mp3", data)
    with caplog.at_level(logging.DEBUG, "crawler.worker.fingerprints"):
        assert await pool.submit("x", path) is None
        assert await pool.submit("x", path) is None
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "crawler.worker.fingerprints"]
    assert len(lines) == 1 and why in lines[0][1] and "x.mp3" in lines[0][1]
    assert lines[0][0] == level
    assert outcomes == [ERROR, ERROR]
    pool.close()


async def test_a_fingerprint_past_the_wire_limit_is_cut(tmp_path):
    pool, _ = _pool(fingerprint=huge_fingerprint)
    fp = await pool.submit("x", _file(tmp_path, "x.mp3", b"x"))
    assert len(fp) == MAX_FINGERPRINT_BYTES
    pool.close()


async def test_a_dead_process_costs_its_file_and_the_next_file_gets_a_new_pool(tmp_path, caplog):
    pool = FingerprintPool(fake_fingerprint, processes=1)
    try:
        with caplog.at_level(logging.WARNING, "crawler.worker.fingerprints"):
            assert await asyncio.wait_for(pool.submit("d", _file(tmp_path, "d.mp3", b"DIE")), 60) is None
        assert "died" in caplog.text
        assert await asyncio.wait_for(pool.submit("ok", _file(tmp_path, "ok.mp3", b"ok")), 60) == expected(b"ok")
    finally:
        pool.close()


async def test_a_file_that_kills_its_process_costs_only_itself_not_its_batch(tmp_path, caplog):
    pool, outcomes = _pool(executor=process_pool)     # real processes: one dies
    try:
        data = [b"first", b"DIE", b"second", b"third"]
        jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", d)) for i, d in enumerate(data)]
        with caplog.at_level(logging.WARNING, "crawler.worker.fingerprints"):
            got = await asyncio.wait_for(asyncio.gather(*jobs), 120)
        assert got == [expected(b"first"), None, expected(b"second"), expected(b"third")]
        assert "1.mp3" in caplog.text and "died" in caplog.text
        assert sorted(outcomes) == sorted([DONE, ERROR, DONE, DONE]) and pool.backlog == 0
    finally:
        pool.close()


async def test_closing_resolves_the_files_waiting_with_none(tmp_path):
    pool, _ = _pool(processes=1)
    jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", b"SLEEP 0.2\n%d" % i)) for i in range(3)]
    pool.close()
    assert [await j for j in jobs] == [None, None, None]
    assert pool.submit("after", tmp_path / "0.mp3") is None


async def test_closing_ends_the_processes_and_the_pools_thread_while_a_file_is_in_work(tmp_path):
    """Nothing of the pool is left for the interpreter's exit: its thread, still closing its wake-up pipe then,
    raced Python's exit hook, which wrote to that pipe ("Bad file descriptor" printed as a worker exited)."""
    pool = FingerprintPool(fake_fingerprint, processes=2)
    job = pool.submit("slow", _file(tmp_path, "slow.mp3", b"SLEEP 30\nslow"))
    deadline = time.monotonic() + 60
    while (executor := pool._executor) is None or not executor._processes:   # made for the first batch
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    processes = list(executor._processes.values())
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 10      # the file in work is not waited for
    assert await job is None
    assert not any(p.is_alive() for p in processes)
    assert not any(type(t).__name__ == "_ExecutorManagerThread" for t in threading.enumerate())


class _Counted(ThreadPoolExecutor):
    """A thread pool that keeps what each call was given: the batches the pool sent."""

    def __init__(self, n):
        super().__init__(max_workers=n)
        self.calls = []

    def submit(self, fn, /, *args, **kwargs):
        self.calls.append(args)
        return super().submit(fn, *args, **kwargs)


def _counted_pool(**kw):
    made = []

    def executor(n):
        made.append(_Counted(n))
        return made[-1]

    pool, outcomes = _pool(executor=executor, **kw)
    return pool, outcomes, made


async def test_a_batch_answers_per_file_and_one_bad_file_costs_only_itself(tmp_path, caplog):
    pool, outcomes, made = _counted_pool(processes=1)
    data = [b"one", b"BAD", b"two", b"BOOM", b"three"]
    with caplog.at_level(logging.DEBUG, "crawler.worker.fingerprints"):
        jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", d)) for i, d in enumerate(data)]
        assert pool.backlog == 5
        got = await asyncio.gather(*jobs)
    assert got == [expected(b"one"), None, expected(b"two"), None, expected(b"three")]
    assert len(made) == 1 and len(made[0].calls) == 1, "the five files went in one call"
    assert sorted(outcomes) == sorted([DONE, ERROR, DONE, ERROR, DONE]) and pool.backlog == 0
    lines = {r.getMessage(): r.levelno for r in caplog.records if r.name == "crawler.worker.fingerprints"}
    assert any("1.mp3" in m and "not audio" in m and lv == logging.DEBUG for m, lv in lines.items())
    assert any("3.mp3" in m and "decoder exploded" in m and lv == logging.WARNING for m, lv in lines.items())
    pool.close()


async def test_a_batch_goes_when_full_before_its_gather_time(tmp_path):
    pool, _, made = _counted_pool(processes=1, gather=60.0, batch_files=3, batch_bytes=1000)
    jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", b"f%d" % i)) for i in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*jobs), 10) == [expected(b"f%d" % i) for i in range(3)]
    # By bytes: one file as large as a batch may be goes at once too.
    assert await asyncio.wait_for(pool.submit("big", _file(tmp_path, "big.mp3", b"big"), size=1000), 10) \
        == expected(b"big")
    assert [len(call[1]) for call in made[0].calls] == [3, 1]
    pool.close()


async def test_files_gathered_are_spread_over_the_idle_processes(tmp_path):
    pool, _, made = _counted_pool(processes=3)
    jobs = [pool.submit(str(i), _file(tmp_path, f"{i}.mp3", b"g%d" % i)) for i in range(7)]
    await asyncio.gather(*jobs)
    assert sorted(len(call[1]) for call in made[0].calls) == [2, 2, 3]
    pool.close()


async def test_a_file_known_too_short_is_not_sent_and_counted_short(tmp_path):
    pool, outcomes, made = _counted_pool(processes=1)
    path = _file(tmp_path, "jingle.mp3", b"jingle")
    job = pool.submit("j", path, seconds=1.5, size=24_000)
    assert job is not None and job.done() and job.result() is None
    assert outcomes == [SHORT] and pool.backlog == 0 and not made, "no pool, no round trip"
    # Long enough, or of no known length: fingerprinted.
    assert await pool.submit("l", path, seconds=2.0) == expected(b"jingle")
    assert await pool.submit("u", _file(tmp_path, "u.mp3", b"unknown")) == expected(b"unknown")
    assert outcomes == [SHORT, DONE, DONE]
    pool.close()


def test_a_files_length_is_what_the_file_says_never_the_page():
    item = it.AudioItem(url="http://cdn/a.mp3", page="http://site/", size=16_000)
    assert file_seconds(item) is None
    # The page's duration and bitrate are not the file's.
    paged = item.replace(duration=200.0, bitrate=128, meta_source={"duration": "page", "bitrate": "page"})
    assert file_seconds(paged) is None
    # The file's own, filling what the page left out, or beside a page that said otherwise.
    assert file_seconds(item.with_file_tags({"duration": 0.25, "bitrate": 128})) == 0.25
    assert file_seconds(paged.with_file_tags({"duration": 0.25})) == 0.25
    # No duration: the size at the file's bitrate.
    assert file_seconds(item.with_file_tags({"bitrate": 128})) == 16_000 * 8 / 128_000
    assert file_seconds(paged.with_file_tags({"bitrate": 64})) == 16_000 * 8 / 64_000
    assert file_seconds(item.replace(size=None).with_file_tags({"bitrate": 128})) is None
    assert file_seconds(item.with_file_tags({"duration": 0, "bitrate": 0})) is None


# ------------------------------------------------------------------ the worker's side
def _worker(tmp_path, wait=0.5, download_audio=True, **identify) -> Worker:
    raw = {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path), "secret_file": str(write_secret(tmp_path / "s")),
           "download_audio": download_audio, "identify": {"wait": wait, **identify}}
    w = Worker(WorkerConfig.build(None, raw), fingerprinter=fake_fingerprint)
    assert w.fingerprints is not None
    w.fingerprints._make_executor = _threads
    return w


def _stored(tmp_path, data: bytes, name="a.mp3") -> it.AudioItem:
    (tmp_path / "audio").mkdir(exist_ok=True)
    (tmp_path / "audio" / name).write_bytes(data)
    return it.AudioItem(url=f"http://cdn/{name}", page="http://site/", sha256=name * 8, size=len(data),
                        path=f"audio/{name}")


def test_the_identify_section_is_read_from_the_config(tmp_path):
    w = _worker(tmp_path, wait=3, processes=2, max_backlog=7)
    assert (w.cfg.identify.processes, w.cfg.identify.max_backlog, w.cfg.identify.wait) == (2, 7, 3.0)
    assert w.fingerprints.processes == 2 and w.fingerprints.max_backlog == 7
    off = Worker(WorkerConfig.build(None, {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path),
                                           "secret_file": str(tmp_path / "s"), "identify": {"enabled": False}}))
    assert off.fingerprints is None


@pytest.mark.parametrize("download_audio", [True, False])
async def test_the_pool_starts_with_a_worker_that_downloads_else_at_its_first_file(tmp_path, download_audio):
    w = _worker(tmp_path, download_audio=download_audio)
    serving = asyncio.create_task(w.serve())     # no master there: it keeps trying to connect
    try:
        for _ in range(500):
            if hasattr(w, "_tg") or serving.done():
                break
            await asyncio.sleep(0.01)
        assert hasattr(w, "_tg"), "the worker did not start"
        assert (w.fingerprints._executor is not None) == download_audio
        if not download_audio:   # a file it stores all the same (a download the master hands it) starts it
            job = w.fingerprints.submit("k", _file(tmp_path, "a.mp3", b"audio"))
            assert await asyncio.wait_for(job, 30) == expected(b"audio")
    finally:
        w.stop()
        await asyncio.wait_for(serving, 30)


async def test_an_outcome_carries_its_fingerprint_when_it_comes_in_time(tmp_path):
    w = _worker(tmp_path)
    done = _stored(tmp_path, b"song")
    got = await w._fingerprinted((done.page, done.url), done)
    assert got.fingerprint == expected(b"song")
    # A fingerprint the item came with (from the master, a page) is not the file's: the pool's own replaces it.
    assert (await w._fingerprinted((done.page, done.url), done.replace(fingerprint=b"other"))) == got
    # Failures, copies on other nodes and files not stored here are not fingerprinted.
    for other in (done.replace(status=it.FAILED), done.replace(extra={"stored_on": "w2"}), done.replace(path=None)):
        other = other.replace(fingerprint=b"other")
        assert (await w._fingerprinted((done.page, done.url), other)).fingerprint is None
    # Nor does a page report name a download pending with one.
    assert w.ledger.start(done.replace(fingerprint=b"other"))[0].fingerprint is None
    w.fingerprints.close()


async def test_a_file_its_tags_say_is_too_short_is_decided_on_the_worker(tmp_path):
    w = _worker(tmp_path)
    sent = []
    w.fingerprints._make_executor = lambda n: sent.append(n) or _threads(n)
    done = _stored(tmp_path, b"song").with_file_tags({"duration": 0.3})
    got = await w._fingerprinted((done.page, done.url), done)
    assert got.fingerprint is None and not sent and w.fingerprints.backlog == 0
    assert b'crawler_fingerprints_total{node="w",outcome="short"} 1.0' in w.metrics.render()
    longer = _stored(tmp_path, b"song2", name="b.mp3").with_file_tags({"duration": 180.0})
    assert (await w._fingerprinted((longer.page, longer.url), longer)).fingerprint == expected(b"song2")
    assert sent == [1]
    w.fingerprints.close()


async def test_an_outcome_waits_a_bounded_time_and_its_fingerprint_follows_it(tmp_path):
    w = _worker(tmp_path, wait=0.1)
    w.ledger = DownloadLedger(8)
    w.ledger.connect(0.0)
    done = _stored(tmp_path, b"SLEEP 0.4\nsong")
    key = (done.page, done.url)
    w.ledger.take(done.replace(status=it.PENDING), 0.0)    # a download handed over: no page report to wait for
    t0 = time.monotonic()
    got = await w._fingerprinted(key, done)
    assert got.fingerprint is None and time.monotonic() - t0 < 0.35
    w._ended_download(key, got)
    await asyncio.sleep(0)
    first = w.ledger.flush().outcomes
    assert [o.fingerprint for _, o in first] == [None]
    await asyncio.sleep(0.6)
    again = w.ledger.flush().outcomes
    assert [(u, o.fingerprint) for u, o in again] == [(done.url, expected(b"SLEEP 0.4\nsong"))]
    w.fingerprints.close()


async def test_behind_a_backlog_an_outcome_does_not_wait(tmp_path):
    w = _worker(tmp_path, wait=5.0)
    pool = w.fingerprints
    ahead = pool.submit("ahead", _file(tmp_path, "ahead.mp3", b"SLEEP 0.3\n"))
    done = _stored(tmp_path, b"song")
    t0 = time.monotonic()
    got = await w._fingerprinted((done.page, done.url), done)
    assert got.fingerprint is None and time.monotonic() - t0 < 0.1
    # Both wait: the backlog on the worker's /metrics.
    assert b'crawler_fingerprint_backlog{node="w"} 2.0' in w.metrics.render()
    await ahead
    pool.close()


def test_a_late_fingerprint_replaces_an_outcome_still_held_or_unsent():
    cache = {}
    ledger = DownloadLedger(8, fingerprint_of=cache.get)
    ledger.connect(0.0)
    item = it.AudioItem(url="http://cdn/a.mp3", page="http://site/", sha256="ab" * 32, path="audio/a.mp3")
    key = (item.page, item.url)
    # Held for its page's report: replaced there, nothing more goes.
    reported, _ = ledger.start(item)
    ledger.ended(key, item, 1.0)
    assert ledger.refined(key, item.replace(fingerprint=b"fp"), 2.0) is None
    assert ledger.reported([key], 3.0) is not None
    assert [o.fingerprint for _, o in ledger.flush().outcomes] == [b"fp"]
    # Sent already: it goes again, and the download handed back later answers with it.
    assert ledger.refined(key, item.replace(fingerprint=b"fp2"), 4.0) is not None
    assert [o.fingerprint for _, o in ledger.flush().outcomes] == [b"fp2"]
    # Outcomes remembered keep no fingerprint (each may be as large as a frame): one sent again takes the
    # pool's, while the pool still has it.
    assert ledger._settled[key].fingerprint is None
    fresh, _ = ledger.take(reported, 5.0)
    assert not fresh and [o.fingerprint for _, o in ledger.flush().outcomes] == [None]
    cache[item.sha256] = b"fp2"
    ledger.take(reported, 6.0)
    assert [o.fingerprint for _, o in ledger.flush().outcomes] == [b"fp2"]


def test_a_late_fingerprint_of_an_outcome_a_page_report_carries_waits_for_that_report():
    ledger = DownloadLedger(8)
    ledger.connect(0.0)
    item = it.AudioItem(url="http://cdn/a.mp3", page="http://site/", sha256="ab" * 32, path="audio/a.mp3")
    key = (item.page, item.url)
    ledger.start(item)
    ledger.ended(key, item, 1.0)
    assert list(ledger.outcomes_of([key])) == [key]       # the page's result carries it
    # The fingerprint comes before that result is sent: it must not reach the master first.
    assert ledger.refined(key, item.replace(fingerprint=b"fp"), 2.0) is None
    assert ledger.flush().outcomes == ()
    assert ledger.reported([key], 3.0) is not None
    assert [o.fingerprint for _, o in ledger.flush().outcomes] == [b"fp"]


_SCRIPT = '''
import asyncio, sys
from pathlib import Path

if __name__ == "__mp_main__":     # this program imported again, in a pool process
    Path(sys.argv[1]).write_text("imported again")

from crawler.worker.fingerprints import FingerprintPool
from tests.fakes.fingerprinter import fake_fingerprint


async def main():
    pool = FingerprintPool(fake_fingerprint, processes=1)
    try:
        pool.start()
        print((await asyncio.wait_for(pool.submit("k", Path(sys.argv[2])), 60)).hex())
    finally:
        pool.close()


if __name__ == "__main__":
    asyncio.run(main())
'''


def test_a_pool_process_does_not_import_the_program_that_started_it_again(tmp_path):
    """The worker runs as a script (the crawler-worker console script), which a spawned process imports again
    before anything else, and with it the whole crawler: the pool's processes start without it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    program = tmp_path / "program.py"
    program.write_text(_SCRIPT)
    marker = tmp_path / "marker"
    audio = _file(tmp_path, "a.mp3", b"audio")
    repo = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, str(program), str(marker), str(audio)], capture_output=True, text=True,
                       timeout=120, cwd=repo, env=dict(os.environ, PYTHONPATH=repo))
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(r.stdout.strip()) == expected(b"audio")
    assert not marker.exists(), "the pool's process imported the program again"
