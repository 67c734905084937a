"""A node's archive on disk: files rotated by size and age, old ones retired, an index that survives a crash."""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from crawler.archive import Exchange
from crawler.archive.records import http_payload, iter_records, parse_member
from crawler.archive.writer import ArchiveConfig, ArchiveWriter, iter_index, open_archive, read_record
from tests.disks import small_tmpfs

REPO = Path(__file__).resolve().parent.parent
WARCIO = Path(sys.executable).parent / "warcio"     # the venv's script, beside its python
T = 1_790_000_000.0


class Clock:
    def __init__(self, now: float = T) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def page(i: int, size: int = 100, started: float = T) -> Exchange:
    return Exchange(role="page", method="GET", url=f"http://site.test/{i}",
                    request_headers=((b"Host", b"site.test"), (b"User-Agent", b"ua")), status=200,
                    response_headers=((b"Content-Type", b"text/html"),),
                    body=os.urandom(size // 2).hex().encode()[:size], started=started)


def check(directory: Path) -> None:
    files = sorted(directory.glob("*.warc.gz"))
    assert files
    done = subprocess.run([str(WARCIO), "check", *map(str, files)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_record_is_indexed_and_read_back_by_its_entry(tmp_path):
    w = ArchiveWriter(tmp_path, "worker", clock=Clock())
    response, request = w.exchange_refs(page(1))
    meta = w.metadata("http://cdn.test/a.mp3", (("sha256", "ab" * 32),), refers_to=response.record_id,
                      page="http://site.test/1", role="audio", now=T, sha256="AB" * 32)
    w.close()
    check(tmp_path)
    refs = list(iter_index(tmp_path))
    assert [r.kind for r in refs] == ["warcinfo", "response", "request", "metadata"]
    assert refs[1:3] == [response, request]
    assert request.refers_to == response.record_id and response.role == request.role == "page"
    assert refs[3].record_id == meta and refs[3].sha256 == "ab" * 32 and refs[3].refers_to == response.record_id
    assert response.file == w.files()[0] == "worker-20260921141320-00000.warc.gz"
    for ref in refs:
        headers, block = parse_member(read_record(tmp_path, ref))
        assert dict(headers)["WARC-Record-ID"] == ref.record_id
        assert dict(headers).get("WARC-Target-URI", "") == ref.target
        assert dict(headers).get("WARC-Payload-Digest", "") == ref.digest
    _, payload = http_payload(parse_member(read_record(tmp_path, response))[1])
    assert payload == page(1).body or len(payload) == 100
    with pytest.raises(ValueError):
        read_record(tmp_path, response.__class__(**{**vars_of(response), "file": "../x.warc.gz"}))


def vars_of(ref):
    return {f: getattr(ref, f) for f in ref.__slots__}


def test_files_roll_over_by_size_and_each_start_begins_a_new_one(tmp_path):
    clock = Clock()
    w = ArchiveWriter(tmp_path, "worker", file_bytes=4096, clock=clock)
    for i in range(30):
        w.exchange(page(i, 1000))
    w.close()
    again = ArchiveWriter(tmp_path, "worker", file_bytes=4096, clock=clock)     # same second
    again.exchange(page(99))
    again.close()
    files = sorted(tmp_path.glob("*.warc.gz"))
    assert len(files) >= 6 and all(f.stat().st_size <= 4096 for f in files)
    assert {f.name.rsplit("-", 1)[0] for f in files} == {"worker-20260921141320"}
    check(tmp_path)
    targets = [r.target for r in iter_index(tmp_path) if r.kind == "response"]
    assert sorted(targets) == sorted([f"http://site.test/{i}" for i in range(30)] + ["http://site.test/99"])
    assert all(next(iter_records(f)).header("WARC-Type") == "warcinfo" for f in files)
    # An exchange bigger than a file is written whole, alone in its file.
    big = ArchiveWriter(tmp_path / "big", "worker", file_bytes=1000, clock=clock)
    big.exchange(page(1, 50_000))
    big.exchange(page(2, 50_000))
    big.close()
    assert len(list((tmp_path / "big").glob("*.warc.gz"))) == 2
    check(tmp_path / "big")


def test_files_roll_over_by_age(tmp_path):
    clock = Clock()
    w = ArchiveWriter(tmp_path, "master", file_seconds=60, clock=clock)
    w.exchange(page(1))
    clock.now += 59
    w.exchange(page(2))
    assert len(w.files()) == 1
    clock.now += 1
    w.exchange(page(3))
    assert w.files() == ["master-20260921141320-00000.warc.gz", "master-20260921141420-00001.warc.gz"]
    w.close()
    check(tmp_path)


def test_retention_removes_the_oldest_files_past_the_byte_budget_never_the_current(tmp_path):
    clock = Clock()
    w = ArchiveWriter(tmp_path, "worker", file_bytes=3000, keep_bytes=10_000, clock=clock)
    for i in range(40):
        clock.now += 1
        w.exchange(page(i, 1000))
    files = sorted(tmp_path.glob("*.warc.gz"))
    total = sum(f.stat().st_size for f in tmp_path.iterdir())
    assert total <= 10_000 + 3000 + 2000       # the budget, the current file and its index
    assert files[-1].name == w.files()[-1] and [f.name for f in files] == w.files()
    assert len(list(tmp_path.glob("*.index.tsv"))) == len(files)     # an index goes with its file
    kept = {r.target for r in iter_index(tmp_path) if r.kind == "response"}
    assert "http://site.test/39" in kept and "http://site.test/0" not in kept
    w.close()
    # A budget smaller than one file still keeps the file being written.
    tiny = ArchiveWriter(tmp_path / "tiny", "worker", file_bytes=10_000, keep_bytes=1, clock=clock)
    for i in range(5):
        tiny.exchange(page(i, 1000))
    assert len(list((tmp_path / "tiny").glob("*.warc.gz"))) == 1
    tiny.close()
    again = ArchiveWriter(tmp_path / "tiny", "worker", file_bytes=10_000, keep_bytes=1, clock=clock)
    again.exchange(page(9))
    assert len(list((tmp_path / "tiny").glob("*.warc.gz"))) == 1     # the last start's file is old now
    again.close()


def test_retention_by_age_counts_a_file_to_the_start_of_the_next(tmp_path):
    clock = Clock()
    w = ArchiveWriter(tmp_path, "worker", file_seconds=100, keep_seconds=250, clock=clock)
    for _ in range(6):
        w.exchange(page(0))
        clock.now += 100
    # Files started at T, T+100, ..., T+500: when the last starts, the first ended (T+100) 400 s ago, the
    # second 300 s ago: both removed; the third ended 200 s ago.
    names = w.files()
    assert len(names) == 4 and names[0] == "worker-20260921141640-00002.warc.gz"
    w.close()
    keep_all = ArchiveWriter(tmp_path / "all", "worker", file_seconds=1, clock=clock)
    for _ in range(5):
        keep_all.exchange(page(0))
        clock.now += 10
    assert len(keep_all.files()) == 5
    keep_all.close()
    assert open_archive(ArchiveConfig(enabled=False), tmp_path / "off", "worker") is None
    on = open_archive(ArchiveConfig(), tmp_path / "on", "worker")
    assert isinstance(on, ArchiveWriter)
    on.close()


def test_an_index_line_a_crash_cut_is_skipped_and_a_torn_record_cut_off_at_the_next_start(tmp_path):
    w = ArchiveWriter(tmp_path, "worker", clock=Clock())
    for i in range(3):
        w.exchange(page(i))
    w.close()
    [index] = tmp_path.glob("*.index.tsv")
    [warc] = tmp_path.glob("*.warc.gz")
    whole = warc.stat().st_size
    # The crash: the last exchange's records half written, its index lines never, a line cut short.
    extra = ArchiveWriter(tmp_path / "x", "worker", clock=Clock())
    torn = b"".join(read_record(tmp_path / "x", r) for r in [extra.exchange_refs(page(7))][0])
    extra.close()
    with open(warc, "ab") as fh:
        fh.write(torn[: len(torn) // 2])
    lines = index.read_bytes()
    index.write_bytes(lines + lines.splitlines(keepends=True)[-1][:40])
    assert [r.target for r in iter_index(tmp_path) if r.kind == "response"] == [f"http://site.test/{i}"
                                                                                for i in range(3)]
    after = ArchiveWriter(tmp_path, "worker", clock=Clock(T + 5))
    after.exchange(page(3))
    after.close()
    assert warc.stat().st_size == whole
    check(tmp_path)
    assert len([r for r in iter_index(tmp_path) if r.kind == "response"]) == 4


def test_records_written_but_not_indexed_are_indexed_at_the_next_start_and_an_index_can_be_rebuilt(tmp_path):
    from crawler.archive.writer import rebuild_index

    clock = Clock()
    w = ArchiveWriter(tmp_path, "worker", clock=clock)
    w.exchange(page(1))
    w.metadata("http://cdn.test/a.mp3", (("k", "v"),), refers_to="<urn:uuid:x>", page="http://site.test/1 \t2",
               role="au dio\r\n", now=T, sha256="cd" * 32)
    w.exchange(Exchange(role="audio", method="GET", url="http://cdn.test/a.mp3", request_headers=(), status=200,
                        response_headers=(), body=b"", started=T, page="http://site.test/1",
                        payload_digest="sha256:" + "ef" * 32, payload_size=10))
    w.close()
    [index] = tmp_path.glob("*.index.tsv")
    whole = index.read_bytes()
    assert rebuild_index(next(tmp_path.glob("*.warc.gz"))) == 6 and index.read_bytes() == whole
    # A crash after the last exchange's records were written, in the write of their index lines.
    lines = whole.splitlines(keepends=True)
    index.write_bytes(b"".join(lines[:-2]) + lines[-2][:25])
    assert len(list(iter_index(tmp_path))) == 4
    ArchiveWriter(tmp_path, "worker", clock=clock).close()
    assert index.read_bytes() == whole
    assert [r.sha256 for r in iter_index(tmp_path)][-3:] == ["cd" * 32, "ef" * 32, ""]


_CHILD = r"""
import sys, time
from pathlib import Path
from crawler.archive import Exchange
from crawler.archive.writer import ArchiveWriter
w = ArchiveWriter(Path(sys.argv[1]), "worker")
for i in range(200):
    w.exchange(Exchange(role="page", method="GET", url=f"http://site.test/{i}", request_headers=(), status=200,
                        response_headers=(), body=b"<html>%d</html>" % i, started=time.time()))
print("saved", flush=True)
time.sleep(60)      # alive, its files still open, until the test kills it
"""


def test_records_survive_a_killed_process(tmp_path):
    """Appends are unbuffered: what exchange() returned for is in the file and the index when the process dies."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline() == b"saved\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    check(tmp_path)
    refs = [r for r in iter_index(tmp_path) if r.kind == "response"]
    assert [r.target for r in refs] == [f"http://site.test/{i}" for i in range(200)]
    assert http_payload(parse_member(read_record(tmp_path, refs[7]))[1])[1] == b"<html>7</html>"


def test_a_full_disk_leaves_no_half_record(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        w = ArchiveWriter(disk, "worker", clock=Clock())
        written = 0
        with pytest.raises(OSError) as e:
            for i in range(1000):
                w.exchange(page(i, 4000))
                written += 1
        assert e.value.errno == errno.ENOSPC and written > 10
        files = sorted(disk.glob("*"))
        sizes = [f.stat().st_size for f in files]
        for _ in range(5):      # the disk stays full: appends (bigger than the room the failed one left) fail,
            with pytest.raises(OSError):                  # and leave nothing behind
                w.exchange(page(0, 40_000))
        assert sorted(disk.glob("*")) == files and [f.stat().st_size for f in files] == sizes
        w.close()
        check(disk)
        assert len([r for r in iter_index(disk) if r.kind == "response"]) == written
        full = ArchiveWriter(disk, "worker", clock=Clock(T + 10))     # a restart on the full disk
        for _ in range(3):
            with pytest.raises(OSError):
                full.exchange(page(0, 100_000))
        full.close()
        assert len(set(disk.glob("*")) - set(files)) <= 2     # at most one new file (and its index)...
        check(disk)                                            # ...and no half record anywhere


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_master_opens_its_archive_in_its_data_dir(tmp_path, enabled):
    import asyncio

    from crawler.archive import NO_ARCHIVE
    from crawler.master.config import MasterConfig
    from crawler.master.server import Master
    from testkit.cluster import write_secret

    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(write_secret(tmp_path / "s")),
           "exit_when_done": False, "politeness": {"obey_robots": False}, "web": {"listen": "off"},
           "dedup": {"expected_urls": 1000}, "archive": {"enabled": enabled}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait({serving, asyncio.create_task(listening.wait())}, return_when=asyncio.FIRST_COMPLETED)
    assert not serving.done()
    if enabled:
        assert isinstance(master.archive, ArchiveWriter) and master.archive.directory == tmp_path / "m" / "archive"
        master.archive.exchange(page(1))
    else:
        assert master.archive is NO_ARCHIVE
    master.stop()
    await serving
    files = list((tmp_path / "m" / "archive").glob("master-*.warc.gz"))
    assert len(files) == (1 if enabled else 0)
    if enabled:
        check(tmp_path / "m" / "archive")


def test_the_index_lines_written_are_those_the_records_rebuild_and_the_refs_returned(tmp_path):
    """The writer prints its index lines from the records it makes; they are the lines rebuild_index derives from
    the records' own headers, and the entries exchange_refs returns."""
    from crawler.archive.writer import _line, rebuild_index

    writer = ArchiveWriter(tmp_path)
    refs = []
    urls = ["http://a.test/p", "http://a.test/é?q=1#f", "http://a.test/\udcff", "http://a.test/ sp\r\nace",
            "http://a.test/\t"]
    for n, url in enumerate(urls):
        ex = Exchange(role=["page", "api", "odd role\t", "", "audio"][n], method="GET", url=url,
                      request_headers=((b"Host", b"a.test"),), status=200,
                      response_headers=((b"Content-Type", b"text/html"),), body=b"x" * n, started=1_790_000_000.0 + n,
                      page="" if n % 2 else urls[-1 - n],
                      payload_digest="sha256:" + "ab" * 32 if n == 4 else "",
                      payload_size=5 if n == 4 else -1)
        refs += writer.exchange_refs(ex)
        location = writer.exchange_at(ex)
        writer.response_ref(ex)
        assert location[0] == writer.name and location[2] > 0
    writer.metadata("http://a.test/m", (("k", "v"),), refers_to=refs[0].record_id, page=urls[1], role="audio",
                    now=1_790_000_009.0, sha256="CD" * 32)
    writer.close()
    index = tmp_path / (writer.name[: -len(".warc.gz")] + ".index.tsv")
    written = index.read_bytes()
    assert all((_line(r).encode("utf-8", "surrogatepass") in written) for r in refs)
    rebuild_index(tmp_path / writer.name)
    assert index.read_bytes() == written
