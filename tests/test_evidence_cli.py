"""`crawler-worker evidence` on a node's data dir: a WACZ of the items' chains (--out) or their text (--show),
one-line errors, exit 2 on bad use. The archive is written by warcio (tests/fakes/warcs.py) and read through the
evidence Index seam."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from crawler.archive import evidence
from crawler.worker.cli import main
from tests.fakes.warcs import WarcArchive, crawl_song

PAGE = "http://music.test/song/1"
AUDIO = "http://cdn.music.test/a/1.mp3"
WACZ = Path(sys.executable).parent / "wacz"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    data = tmp_path / "data"
    archive = WarcArchive(data / "archive")
    _, sha = crawl_song(archive, data, page=PAGE, api="http://api.music.test/play?id=1", audio=AUDIO,
                        body=b"ID3" + b"\x01" * 5000)
    monkeypatch.setattr(evidence, "open_index", lambda d: archive)
    return data, sha


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["evidence", *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_writes_a_valid_wacz_of_the_chain(data, tmp_path):
    d, sha = data
    out = tmp_path / "e.wacz"
    code, stdout, stderr = run("--data-dir", str(d), "--out", str(out), AUDIO, sha)
    assert code == 0, stderr
    assert stdout == f"wrote {out}: 2 items, 7 archived records\n"
    with zipfile.ZipFile(out) as zf:
        assert "archive/data.warc.gz" in zf.namelist()
    r = subprocess.run([str(WACZ), "validate", "-f", str(out)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout


def test_show_prints_the_chain(data):
    d, sha = data
    code, stdout, _ = run("--data-dir", str(d), "--show", PAGE)
    assert code == 0
    assert stdout.splitlines()[1].startswith(f"  page {PAGE} fetched at ")
    assert f"sha256 {sha}" in stdout


def test_an_item_with_no_records_is_one_line_and_no_file(data, tmp_path):
    d, _ = data
    out = tmp_path / "e.wacz"
    code, _, stderr = run("--data-dir", str(d), "--out", str(out), AUDIO, "http://nowhere.test/x")
    assert code == 1 and not out.exists()
    assert stderr == "crawler-worker: evidence: no archived records of http://nowhere.test/x\n"
    code, stdout, _ = run("--data-dir", str(d), "--show", "http://nowhere.test/x")
    assert code == 1 and stdout == "http://nowhere.test/x: no archived records\n"


@pytest.mark.parametrize("args, says", [
    ((), "name at least one"),
    (("--show", "--out", "x.wacz", AUDIO), "one of them"),
    ((AUDIO,), "one of them"),
    (("--out", "/nonexistent-dir/e.wacz", AUDIO), "no folder /nonexistent-dir"),
])
def test_bad_use_is_one_line_and_exit_2(data, args, says):
    d, _ = data
    code, _, stderr = run("--data-dir", str(d), *args)
    assert code == 2 and says in stderr and stderr.count("\n") == 1


def test_a_data_dir_without_an_archive(tmp_path):
    code, _, stderr = run("--data-dir", str(tmp_path), "--show", AUDIO)
    assert code == 1 and "no archive in" in stderr and stderr.count("\n") == 1
    code, _, stderr = run("--data-dir", str(tmp_path / "none"), "--show", AUDIO)
    assert code == 2 and "no data dir" in stderr


# --------------------------------------------------------------------------------------------- the master's
def master_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.master", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, check=False)


def test_the_masters_evidence_on_a_stopped_crawl_points_to_the_workers_command(tmp_path):
    from crawler.master.store import MasterStore
    from tests.test_operator_cli import master_yaml, one_line

    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    one_line(master_run(["evidence", "--config", str(cfg), "--out", str(tmp_path / "e.wacz"), AUDIO], tmp_path),
             "the master is not running, so no node can be asked for its records: on each node run "
             "`crawler-worker evidence --data-dir DIR ...`")
    assert not (tmp_path / "e.wacz").exists()
    assert not list((tmp_path / "state" / "commands").iterdir())
    for args, says in ((["--show"], "name at least one"), ([AUDIO], "one of them"),
                       (["--show", "--out", "x.wacz", AUDIO], "one of them"),
                       (["--out", "/nonexistent-dir/e.wacz", AUDIO], "no folder /nonexistent-dir")):
        one_line(master_run(["evidence", "--config", str(cfg), *args], tmp_path), says)
