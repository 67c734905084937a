"""What a worker keeps of a page fetch, by its settings: every fetch archived, the parsed HTML pages also stored."""

import pytest

from crawler.archive import NO_ARCHIVE
from crawler.archive.writer import ArchiveWriter, iter_index
from crawler.web.page import FetchedPage
from crawler.worker.config import WorkerConfig
from crawler.worker.pagestore import find_page, read_page
from crawler.worker.server import Worker
from testkit.cluster import write_secret


def fetched(path: str, body: bytes = b"<html>hi</html>", status: int = 200) -> FetchedPage:
    url = "http://site.test" + path
    return FetchedPage(url=url, final_url=url, status=status, content_type="text/html", headers={}, body=body,
                       raw_headers=((b"Content-Type", b"text/html"),),
                       sent=((b"Host", b"site.test"), (b"User-Agent", b"ua")), started=1_790_000_000.0)


def worker(tmp_path, **raw) -> Worker:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = WorkerConfig.build(None, {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path / "w"),
                                    "secret_file": str(write_secret(tmp_path / "s"))})
    cfg = WorkerConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, **raw})
    w = Worker(cfg)
    w.cfg.data_dir.mkdir(parents=True, exist_ok=True)
    w._open_archive()
    return w


def archived(tmp_path) -> list[tuple[str, str]]:
    return [(r.kind, r.target.removeprefix("http://site.test")) for r in iter_index(tmp_path / "w" / "archive")
            if r.kind != "warcinfo"]


@pytest.mark.parametrize("fmt", ["warc", "files"])
def test_every_fetch_is_archived_and_the_stored_pages_found_by_the_cli_lookup(tmp_path, fmt):
    from crawler.archive.writer import ArchiveConfig

    w = worker(tmp_path, page_format=fmt, archive=ArchiveConfig())
    assert isinstance(w.archive, ArchiveWriter)
    w._keep_page("http://site.test/a#x", fetched("/a"), True)
    w._keep_page("http://site.test/gone", fetched("/gone", b"no", 404), False)
    w.pages.close()
    w.archive_writer.close()
    assert archived(tmp_path) == [("response", "/a"), ("request", "/a"), ("response", "/gone"), ("request", "/gone")]
    pages = tmp_path / "w" / "pages"
    assert read_page(pages, find_page(pages, "http://site.test/a#x")) == b"<html>hi</html>"
    assert find_page(pages, "http://site.test/gone") is None


def test_with_archiving_off_warc_pages_alone_are_kept(tmp_path):
    from crawler.archive.writer import ArchiveConfig

    w = worker(tmp_path, archive=ArchiveConfig(enabled=False))
    assert w.archive is NO_ARCHIVE and w.archive_writer is not None
    w._keep_page("http://site.test/a", fetched("/a"), True)
    w._keep_page("http://site.test/gone", fetched("/gone", b"no", 404), False)
    w.pages.close()
    w.archive_writer.close()
    assert archived(tmp_path) == [("response", "/a"), ("request", "/a")]
    off = worker(tmp_path / "off", archive=ArchiveConfig(enabled=False), page_format="files")
    assert off.archive is NO_ARCHIVE and off.archive_writer is None
    off.pages.close()
    assert not (tmp_path / "off" / "w" / "archive").exists()
