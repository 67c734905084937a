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


def test_lines_read_as_the_objects_json_dumps_gave_on_varied_rows():
    import random

    from crawler.master.catalogue import catalogue_lines, export_row

    rnd = random.Random(7)
    texts = ["", "plain", "héllo wörld", "日本語の曲", "emoji 🎵", 'quote " and \\ backslash', "tab\tnew\nline",
             "\x00\x01\x1f\x7f", "\u2028\u2029", "</script>", "a/b"]
    numbers = [0, -1, 2**63 - 1, -2**63, 1.5, 1e16, 1e-7, 0.1, -0.0, 1_700_000_000.123456, 3.0]

    def value(depth: int = 0):
        kind = rnd.randrange(6 if depth < 3 else 4)
        if kind == 0:
            return rnd.choice(texts)
        if kind == 1:
            return rnd.choice(numbers)
        if kind == 2:
            return rnd.choice([None, True, False])
        if kind == 3:
            return rnd.choice(texts) + str(rnd.random())
        if kind == 4:
            return [value(depth + 1) for _ in range(rnd.randrange(4))]
        return {rnd.choice(texts) + str(i): value(depth + 1) for i in range(rnd.randrange(4))}

    rows = []
    for i in range(500):
        r = {"url": f"http://a/{i}.mp3", "page": rnd.choice(texts), "status": "ok", "found_at": 1_700_000_000.5 + i,
             "last_seen": rnd.choice([None, 1_700_000_100.25]), "removed_at": None, "size": rnd.choice(numbers),
             "extra": value(), "file_tags": {rnd.choice(texts): rnd.choice(texts) for _ in range(rnd.randrange(3))}}
        rows.append({k: v for k, v in r.items() if rnd.random() < 0.9 or k in ("url", "page")})
    text = catalogue_lines(rows)
    assert text.endswith("\n") and text.count("\n") == len(rows)
    before = [json.dumps(export_row(r), ensure_ascii=False, sort_keys=True) for r in rows]
    lines = text.split("\n")[:-1]      # not splitlines(): U+2028 is text in a line, raw here as before
    assert len(lines) == len(rows)
    for line, old in zip(lines, before):
        assert json.loads(line) == json.loads(old)
        assert list(json.loads(line)) == list(json.loads(old))          # keys in the same (sorted) order
