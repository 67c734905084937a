"""The catalogue file: rows appended off the event loop keep their order, close() leaves every row in the file, and
a failed append (a full disk) is raised, not lost."""

import json

import pytest

from crawler.master.catalogue import CatalogueFile


def row(i: int) -> dict:
    return {"url": f"http://a/{i}.mp3", "page": "http://a/", "found_at": 1_700_000_000.0 + i, "status": "ok"}


def test_rows_appended_in_many_flushes_keep_their_order_and_close_waits_for_them(tmp_path):
    path = tmp_path / "catalog.jsonl"
    cat = CatalogueFile(path)
    assert cat.rewrite([row(0)]) == 1
    for i in range(1, 2001):
        cat.add([row(i)])
        if i % 7 == 0:
            cat.flush()     # often while the previous append is still being written: those rows wait for the next
    cat.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["url"] for r in lines] == [f"http://a/{i}.mp3" for i in range(2001)]
    assert lines[5]["first_seen"] == "2023-11-14T22:13:25Z"


def test_a_failed_append_is_raised(tmp_path):
    cat = CatalogueFile(tmp_path / "catalog.jsonl")
    cat.rewrite([])
    cat._fh.close()
    cat._fh = open("/dev/full", "a", encoding="utf-8")   # every write: no space left on device
    cat.add([row(1)])
    cat.flush()
    with pytest.raises(OSError):
        cat.close()
