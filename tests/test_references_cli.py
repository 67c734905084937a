"""`crawler-master references add|list|remove` and `export --matches` as an operator meets them, on a stopped and
on a running master; fingerprints by the fake fingerprinter (tests/fakes/identify.py) through $CRAWLER_FINGERPRINTER."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from crawler.master.references import FINGERPRINTER_ENV
from crawler.master.store import Checked, MasterStore
from tests.test_operator_cli import master_yaml, one_line, start_master

ROOT = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    return {**os.environ, FINGERPRINTER_ENV: "tests.fakes.identify:fake_fingerprint_file",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.master", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60, check=False, env=env())


def works(tmp: Path) -> Path:
    refs = tmp / "refs"
    (refs / "more").mkdir(parents=True)
    (refs / "song-one.wav").write_text("a b c d e")
    (refs / "more" / "song-two.mp3").write_text("f g h i")
    (refs / "notes.txt").write_text("not audio: skipped in a folder")
    (tmp / "works.csv").write_text("path,work,title,artist\nrefs/song-one.wav,W-001,Song One,Ann\n")
    return refs


def test_add_list_remove_on_a_stopped_master(tmp_path):
    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    refs = works(tmp_path)
    r = run(["references", "add", "--config", str(cfg), "--meta", str(tmp_path / "works.csv"), str(refs)], tmp_path)
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout.strip() == "added 2 reference works, 2 in all (applied to the stopped crawl)"
    r = run(["references", "list", "--config", str(cfg), "--json"], tmp_path)
    listed = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted((w["work"], w["title"], w["artist"]) for w in listed) == [("W-001", "Song One", "Ann"),
                                                                           ("song-two", None, None)]
    with MasterStore.open_readonly(tmp_path / "state" / "master.db") as s:
        assert sorted(f for _, _, f in s.reference_fingerprints()) == [b"a b c d e", b"f g h i"]
    r = run(["references", "list", "--config", str(cfg)], tmp_path)
    assert any(line.startswith("W-001\tAnn - Song One\t") for line in r.stdout.splitlines()), r
    r = run(["references", "remove", "--config", str(cfg), "W-001"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "removed W-001 (applied to the stopped crawl)", r
    one_line(run(["references", "remove", "--config", str(cfg), "W-001"], tmp_path), "no reference work 'W-001'")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    refs = works(tmp_path)
    one_line(run(["references", "add", "--config", str(cfg), str(tmp_path / "nowhere")], tmp_path),
             "no such file or folder")
    (tmp_path / "bad.csv").write_text("file,name\nx,y\n")
    one_line(run(["references", "add", "--config", str(cfg), "--meta", str(tmp_path / "bad.csv"), str(refs)],
                 tmp_path), "expected the columns path,work,title,artist")
    (tmp_path / "empty.wav").write_bytes(b"\xff\xfe")
    one_line(run(["references", "add", "--config", str(cfg), str(tmp_path / "empty.wav")], tmp_path), "not audio")
    (tmp_path / "dup").mkdir()
    (tmp_path / "dup" / "song-one.flac").write_text("x y z")
    one_line(run(["references", "add", "--config", str(cfg), str(refs), str(tmp_path / "dup")], tmp_path),
             "named twice")
    one_line(run(["references", "add", "--config", str(cfg)], tmp_path), "Missing argument")
    one_line(run(["export", "--matches", "--pages", "--config", str(cfg)], tmp_path), "choose one")
    with MasterStore.open_readonly(tmp_path / "state" / "master.db") as s:
        assert s.references() == []    # nothing half-added


def test_add_on_a_running_master_and_export_matches(tmp_path):
    cfg = master_yaml(tmp_path, exit_when_done=False)
    db = tmp_path / "state" / "master.db"
    with MasterStore(db) as s:
        s.add_audio([{"url": "http://x/copy.mp3", "page": "http://x/page", "status": "ok", "node": "w1",
                      "found_at": 100.0}])
    proc, _ = start_master(cfg, tmp_path)
    try:
        refs = works(tmp_path)
        r = run(["references", "add", "--config", str(cfg), str(refs / "song-one.wav")], tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == \
            "added 1 reference works, 1 in all (applied by the running master)", r
        r = run(["references", "list", "--config", str(cfg)], tmp_path)
        assert r.stdout.startswith("song-one\t"), r
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    with MasterStore(db) as s:   # a match as the matcher writes it
        s.add_fingerprints([("http://x/copy.mp3", b"q a b c")], 101.0)
        s.record_checked([Checked("http://x/copy.mp3", 1, 1, (("song-one", 3.0, 0.0),))], 102.0)
    for fmt in ("jsonl", "csv"):
        r = run(["export", "--matches", "--format", fmt, "--config", str(cfg)], tmp_path)
        assert r.returncode == 0, r
        if fmt == "jsonl":
            row = json.loads(r.stdout)
            assert (row["url"], row["work"], row["page"], row["score"], row["offset"], row["recording"]) == (
                "http://x/copy.mp3", "song-one", "http://x/page", 3.0, 0.0, 1)
            assert row["first_seen"] == "1970-01-01T00:01:40Z" and row["matched_at"].startswith("1970-01-01T00:01:42")
        else:
            lines = r.stdout.splitlines()
            assert lines[0] == ("url,work,title,artist,score,offset,page,first_seen,last_seen,matched_at,recording,"
                                "played_at,played_seconds,live,station,window,window_offset")
            assert lines[1].startswith("http://x/copy.mp3,song-one,")
    r = run(["export", "--config", str(cfg)], tmp_path)
    assert json.loads(r.stdout)["match"] == {"work": "song-one", "score": 3.0, "offset": 0.0}
    r = run(["status", "--json", "--config", str(cfg)], tmp_path)
    st = json.loads(r.stdout)["matches"]
    assert st["count"] == 1 and st["latest"][0]["work"] == "song-one"
