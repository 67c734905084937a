"""The worker's page store: pages as the archive's WARC records that standard tools read, and the
one-file-per-page layout."""

import base64
import gzip
import hashlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawler.worker.pagestore import FORMATS, FilePageStore, WarcPageStore, open_page_store, read_page

REPO = Path(__file__).resolve().parent.parent
HOSTILE_URLS = ["http://../../etc/passwd", "http://evil.example/../../../../tmp/x", "http://a%2F..%2F..%2Fb/",
                "http://[::1]:80/%2e%2e/%2e%2e/", "http://xn--e1a.example/" + "a" * 5000]
HEADERS = [(b"Server", b"nginx"), (b"Content-Type", b"text/html; charset=utf-8"),
           (b"Content-Encoding", b"gzip"), (b"Content-Length", b"123"), (b"Set-Cookie", b"a=1"),
           (b"Set-Cookie", b"b=2")]


def index_rows(root: Path) -> list[list[str]]:
    return [line.split("\t") for line in (root / "pages" / "index.tsv").read_text().splitlines()]


def records(path: Path, kind: str = "response") -> list:
    with open(path, "rb") as fh:
        return [(r.rec_headers, r.http_headers, r.content_stream().read())
                for r in ArchiveIterator(fh, check_digests="raise") if r.rec_type == kind]


def warcs(root: Path) -> list[Path]:
    files = sorted((root / "archive").glob("*.warc.gz"))
    done = subprocess.run([str(Path(sys.executable).parent / "warcio"), "check", *map(str, files)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return files


def test_warc_records_open_in_a_standard_reader(tmp_path):
    store = WarcPageStore(tmp_path, clock=lambda: 1_790_000_000.0)
    pages = [(f"http://site.test/p{i}", f"<html>page {i}</html>".encode() * (i + 1)) for i in range(5)]
    locations = [store.save(u, u, 200, "text/html", body, HEADERS) for u, body in pages]
    store.save("http://site.test/gone#frag", "http://site.test/gone", 404, "text/html", b"no", ())
    store.close()

    files = warcs(tmp_path)
    assert [f.name for f in files] == ["worker-20260921141320-00000.warc.gz"]
    assert records(files[0], "warcinfo")
    responses = records(files[0])
    # A store with a writer of its own (the node archives nothing else) keeps pages, not exchanges: no request
    # records (the node's archive keeps both: test_pages_share_the_nodes_archive_and_files_are_an_extra_copy).
    assert records(files[0], "request") == []
    assert [r[0].get_header("WARC-Target-URI") for r in responses] == [u for u, _ in pages] + ["http://site.test/gone"]
    assert [r[2] for r in responses[:5]] == [body for _, body in pages]
    warc_headers, http_headers, _ = responses[0]
    assert warc_headers.get_header("WARC-Date") == "2026-09-21T14:13:20Z"
    digest = base64.b32encode(hashlib.sha1(pages[0][1]).digest()).decode()
    assert warc_headers.get_header("WARC-Payload-Digest") == f"sha1:{digest}"
    assert uuid.UUID(warc_headers.get_header("WARC-Record-ID")[10:-1]).version == 4
    assert http_headers.get_statuscode() == "200"
    # The body is stored decoded: the wire's encoding and length are kept aside, the length is the stored one.
    assert http_headers.get_header("Content-Encoding") is None
    assert http_headers.get_header("X-Archive-Orig-Content-Encoding") == "gzip"
    assert http_headers.get_header("Content-Length") == str(len(pages[0][1]))
    assert [v for k, v in http_headers.headers if k == "Set-Cookie"] == ["a=1", "b=2"]
    assert responses[5][1].get_statuscode() == "404"
    # The index says where each page is, and read() gives back its body.
    rows = index_rows(tmp_path)
    assert [r[0] for r in rows[:5]] == locations and rows[5][1] == "http://site.test/gone#frag"
    reader = WarcPageStore(tmp_path)
    assert [reader.read(loc) for loc in locations] == [body for _, body in pages]


def test_warc_files_roll_over_and_restarts_start_a_new_file(tmp_path):
    store = WarcPageStore(tmp_path, file_bytes=4096, clock=lambda: 1_790_000_000.0)
    for i in range(20):
        store.save(f"http://site.test/{i}", f"http://site.test/{i}", 200, "text/html",
                   os.urandom(1000).hex().encode())     # what gzip cannot shrink away
    store.close()
    again = WarcPageStore(tmp_path, file_bytes=4096, clock=lambda: 1_790_000_000.0)   # same second
    again.save("http://site.test/after", "http://site.test/after", 200, "text/html", b"y")
    again.close()
    files = warcs(tmp_path)
    assert len(files) >= 6 and all(f.stat().st_size <= 4096 for f in files)
    uris = [r[0].get_header("WARC-Target-URI") for f in files for r in records(f)]
    assert sorted(uris) == sorted([f"http://site.test/{i}" for i in range(20)] + ["http://site.test/after"])
    assert all(len(records(f, "warcinfo")) == 1 for f in files)


def test_truncated_pages_say_so_and_headers_cannot_forge_records(tmp_path):
    store = WarcPageStore(tmp_path)
    evil = [(b"X-Evil", b"a\r\n\r\nWARC/1.1\r\nWARC-Type: response")]
    store.save("http://site.test/big\nWARC-Type: x", "http://site.test/big\r\nX:y", 200, "text/html",
               b"z" * 100, evil, truncated=True)
    store.close()
    [(warc_headers, http_headers, body)] = records(warcs(tmp_path)[0])
    assert warc_headers.get_header("WARC-Truncated") == "length"
    assert warc_headers.get_header("WARC-Target-URI") == "http://site.test/bigX:y"
    assert http_headers.get_header("X-Evil") == "a WARC/1.1 WARC-Type: response" and body == b"z" * 100


def test_no_url_names_a_file_in_either_format(tmp_path):
    for fmt in ("warc", "files"):
        root = tmp_path / fmt
        store = open_page_store(root, fmt)
        for u in HOSTILE_URLS:
            location = store.save(u, u, 200, "text/html", b"<html></html>")
            assert store.read(location) == b"<html></html>"
        store.close()
        for path in root.rglob("*"):
            assert path.resolve().is_relative_to((root / "pages").resolve()) or path.resolve().is_relative_to(
                (root / "archive").resolve()), path
        assert all(f.name.startswith("worker-") for f in (root / "archive").glob("*")) if fmt == "warc" else True
        assert len(index_rows(root)) == len(HOSTILE_URLS)
    for location in ("../../etc/passwd.warc:0:10", "../../etc/passwd", "/etc/passwd", "../x.warc.gz:0:10",
                     "x.warc.gz:0:-1"):
        with pytest.raises(ValueError):
            read_page(tmp_path / "warc" / "pages", location)
    assert isinstance(open_page_store(tmp_path / "f", "files"), FilePageStore)


_CHILD = r"""
import sys, time
from pathlib import Path
from crawler.worker.pagestore import WarcPageStore
store = WarcPageStore(Path(sys.argv[1]))
for i in range(200):
    store.save(f"http://site.test/{i}", f"http://site.test/{i}", 200, "text/html", b"<html>%d</html>" % i)
print("saved", flush=True)
time.sleep(60)      # alive, its store still open, until the test kills it
"""


def test_pages_survive_a_killed_worker(tmp_path):
    """Appends are unbuffered: what save() returned for is in the file when the process is killed."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline() == b"saved\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    [warc] = warcs(tmp_path)
    bodies = [r[2] for r in records(warc)]
    assert bodies == [b"<html>%d</html>" % i for i in range(200)]


def test_a_gzip_body_is_stored_as_read(tmp_path):
    """What the fetcher hands over is already decoded; the archive keeps those bytes, not a second encoding."""
    store = WarcPageStore(tmp_path)
    body = b"<html>" + b"a" * 5000 + b"</html>"
    loc = store.save("http://s.test/", "http://s.test/", 200, "text/html", body,
                     [(b"Content-Encoding", b"gzip"), (b"Content-Length", str(len(gzip.compress(body))).encode())])
    store.close()
    assert store.read(loc) == body


@pytest.mark.parametrize("fmt", ["warc", "files"])
def test_operators_read_a_stored_page_with_the_worker_cli(tmp_path, fmt):
    store = open_page_store(tmp_path, fmt)
    store.save("http://s.test/a", "http://s.test/a", 200, "text/html", b"<html>first</html>")
    store.save("http://s.test/b#x", "http://s.test/b", 200, "text/html", b"<html>b</html>")
    store.save("http://s.test/a", "http://s.test/a", 200, "text/html", b"<html>refetched</html>")
    store.close()

    def run(*args):
        argv = [sys.executable, "-m", "crawler.worker", "page", "--data-dir", str(tmp_path), *args]
        return subprocess.run(argv, capture_output=True, check=False, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    latest = run("http://s.test/a")
    assert latest.returncode == 0 and latest.stdout == b"<html>refetched</html>"
    assert run("http://s.test/b").stdout == b"<html>b</html>"        # found by its fetched address too
    missing = run("http://s.test/never")
    assert missing.returncode == 1 and missing.stdout == b""
    assert missing.stderr.decode().count("\n") == 1 and "not in" in missing.stderr.decode()


def test_index_times_are_iso_8601_utc(tmp_path):
    times = iter([1_790_000_000.25, 1_790_000_000.999, 1_790_000_061.0])
    store = FilePageStore(tmp_path, clock=lambda: next(times))
    for i in range(3):
        store.save(f"http://site.test/{i}", f"http://site.test/{i}", 200, "text/html", b"<html></html>")
    store.close()
    assert [r[5] for r in index_rows(tmp_path)] == ["2026-09-21T14:13:20.250Z", "2026-09-21T14:13:20.999Z",
                                                    "2026-09-21T14:14:21.000Z"]


def test_pages_of_the_store_before_the_archive_are_still_read(tmp_path):
    """An uncompressed WARC file in pages/ and its index line, as the page store wrote them before."""
    pages = tmp_path / "pages"
    pages.mkdir()
    body = b"<html>old</html>"
    http = b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n" + body
    record = (b"WARC/1.1\r\nWARC-Type: response\r\nContent-Length: " + str(len(http)).encode() + b"\r\n\r\n"
              + http + b"\r\n\r\n")
    (pages / "pages-20260101000000-00000.warc").write_bytes(b"x" * 10 + record)
    assert read_page(pages, f"pages-20260101000000-00000.warc:10:{len(record)}") == body


def test_pages_share_the_nodes_archive_and_files_are_an_extra_copy(tmp_path):
    from crawler.archive.writer import ArchiveWriter, iter_index

    writer = ArchiveWriter(tmp_path / "archive", "worker")
    sent = ((b"Host", b"s.test"), (b"User-Agent", b"ua"))
    for fmt in FORMATS:
        store = open_page_store(tmp_path, fmt, archive=writer)
        loc = store.save("http://s.test/" + fmt, "http://s.test/" + fmt, 200, "text/html", b"<html></html>",
                         sent=sent, started=1_790_000_000.0)
        assert store.read(loc) == b"<html></html>"
        store.close()
    writer.close()
    refs = [r for r in iter_index(tmp_path / "archive") if r.kind != "warcinfo"]
    assert [(r.kind, r.target) for r in refs] == [("response", "http://s.test/warc"), ("request", "http://s.test/warc"),
                                                  ("response", "http://s.test/files"),
                                                  ("request", "http://s.test/files")]
    [request] = records(warcs(tmp_path)[0], "request")[:1]
    assert request[1].get_header("User-Agent") == "ua" and request[1].get_header("Host") == "s.test"
    assert request[0].get_header("WARC-Date") == "2026-09-21T14:13:20Z"
