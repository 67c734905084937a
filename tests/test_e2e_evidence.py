"""End to end: evidence a takedown can stand on. Real master and workers as processes, on loopback: after the crawl,
every `ok` catalogue row's chain (the page, the audio exchange, the stored file's metadata record) is in its node's
archive, `warcio check` passes on every archive file, `crawler-master evidence` writes a WACZ of all the rows from
the running master that passes `wacz validate` and carries each stored file's bytes, `--show` prints a chain, and
a node killed after the crawl still yields its records through `crawler-worker evidence --data-dir`, while the
master says in one line that the node is not connected."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from crawler.archive import evidence  # noqa: E402
from testkit import cluster, sitegen, siteserver  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SONGS = 6
BIN = Path(sys.executable).parent


def _site(root: Path) -> Path:
    rng = random.Random(36)
    (root / "media").mkdir(parents=True)
    (root / "song").mkdir()
    links = "".join(f'<li><a href="/song/{i}.html">Song {i}</a></li>' for i in range(SONGS))
    (root / "index.html").write_text(f"<html><head><title>Songs</title></head><body><ul>{links}</ul></body></html>")
    for i in range(SONGS):
        (root / "media" / f"{i}.mp3").write_bytes(sitegen._mp3(rng, 30_000, f"Song {i}", "Artist", "Album"))
        (root / "song" / f"{i}.html").write_text(
            f"<html><head><title>Song {i}</title></head><body><h1>Song {i}</h1>"
            f'<audio src="/media/{i}.mp3"></audio></body></html>')
    return root


def ok_rows(tmp: Path) -> list[dict]:
    path = tmp / "master" / "catalog.jsonl"
    return [r for r in cluster.catalogue(tmp) if r.get("status") == "ok"] if path.exists() else []


def valid(path: Path) -> None:
    r = subprocess.run([str(BIN / "wacz"), "validate", "-f", str(path)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def payload_shas(wacz: Path) -> set[str]:
    """The sha256 of every response record's payload in the bundle (warcio checks each record's digests)."""
    out = set()
    with zipfile.ZipFile(wacz) as zf:
        for name in zf.namelist():
            if name.startswith("archive/"):
                for rec in ArchiveIterator(io.BytesIO(zf.read(name)), check_digests="raise"):
                    if rec.rec_type == "response":
                        out.add(hashlib.sha256(rec.content_stream().read()).hexdigest())
    return out


def worker_evidence(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.worker", "evidence", *args], capture_output=True,
                          text=True, timeout=120, check=False)


async def test_every_ok_row_is_proved_by_the_master_and_by_a_killed_nodes_disk(tmp_path):
    site_dir = _site(tmp_path / "site")
    async with await siteserver.start(site_dir) as server:
        nodes = ["w1", "w2"]
        config = cluster.master_config(tmp_path, [server.url + "/"], nodes, exit_when_done=False)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = {n: await cluster.start_worker(addr, n, tmp_path) for n in nodes}
        try:
            await cluster.until(lambda: len(ok_rows(tmp_path)) == SONGS, 120, "every song stored")
            rows = ok_rows(tmp_path)
            # Each row's chain is in its node's archive: the page, the audio answer, the stored file's record.
            for row in rows:
                data = tmp_path / f"worker-{row['node']}"
                [c] = evidence.find_chains(evidence.open_index(data), [row["sha256"]])
                kinds = {(r.role, r.kind) for r in c.records}
                assert ("page", "response") in kinds and ("audio", "metadata") in kinds, kinds
                assert c.pages == (row["page"],) and c.audio == (row["url"],)
            for n in nodes:
                for f in sorted((tmp_path / f"worker-{n}" / "archive").glob("*.warc.gz")):
                    r = subprocess.run([str(BIN / "warcio"), "check", str(f)], capture_output=True, text=True,
                                       check=False)
                    assert r.returncode == 0, r.stdout + r.stderr
            # The running master's bundle of every row.
            out = tmp_path / "all.wacz"
            said = await asyncio.to_thread(cluster.operator, "evidence", config, "--out", str(out),
                                           *[r["url"] for r in rows])
            assert said.startswith(f"wrote {out}: {SONGS} items"), said
            valid(out)
            assert {r["sha256"] for r in rows} <= payload_shas(out)
            text = await asyncio.to_thread(cluster.operator, "evidence", config, "--show", rows[0]["page"])
            lines = text.splitlines()
            assert lines[1].startswith(f"  page {rows[0]['page']} fetched at ") and lines[1].endswith("(200)")
            assert any(f"sha256 {rows[0]['sha256']}" in x for x in lines), text
            # A node killed after the crawl: the master says so; its disk still yields the bundle.
            victim = rows[0]["node"]
            workers[victim].kill()
            await workers[victim].wait(10)
            mine = [r for r in rows if r["node"] == victim]
            for _ in range(100):
                try:
                    await asyncio.to_thread(cluster.operator, "evidence", config, "--show", mine[0]["url"])
                except RuntimeError as e:
                    assert f"on {victim}, not connected now" in str(e) and "crawler-worker evidence" in str(e)
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the master never said the node was gone")
            kept = tmp_path / "kept.wacz"
            r = await asyncio.to_thread(worker_evidence, "--data-dir", str(tmp_path / f"worker-{victim}"),
                                        "--out", str(kept), *[x["sha256"] for x in mine])
            assert r.returncode == 0, r.stderr
            valid(kept)
            assert {x["sha256"] for x in mine} <= payload_shas(kept)
        finally:
            for w in workers.values():
                await w.stop()
            await master.stop()


async def test_a_resolver_api_chain_is_bundled_from_a_stopped_nodes_disk(tmp_path):
    """Kugou (a fake on loopback): the song page led to the play-data API answer, which named the signed address
    that served the bytes. After the crawl ended (the worker exited), its disk yields each song's chain with the
    API exchange in it, as WACZ and as text."""
    import yaml

    from tests.fakes import kugou as fake

    app, ctl = fake.make_kugou_app()
    songs = [ctl.add_song("周杰伦", "晴天", album="叶惠美"), ctl.add_song("Adele", "Hello", album="25")]
    special = ctl.add_special("1001", [s.hash for s in songs])
    async with fake.serve(app) as base:
        host = base.removeprefix("http://")
        config = cluster.master_config(tmp_path, [base + special], ["k1"],
                                       crawl={"max_depth": 1, "keep_fragment": [rf"^http://{host}/song/"]})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 4, "resolvers": {
            "kugou": {"api_base": base, "mobile_api_base": base, "www_hosts": [host], "mobile_hosts": [host],
                      "referer": base + "/", "retry_delay": 0.0},
            "generic": {}}}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "k1", tmp_path, config=wcfg)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]
    rows = [r for r in cluster.catalogue(tmp_path) if r["status"] == "ok"]
    assert len({r["sha256"] for r in rows}) == len(songs), rows
    data = tmp_path / "worker-k1"
    for row in rows:
        [c] = evidence.find_chains(evidence.open_index(data), [row["sha256"]])
        roles = [(r.role, r.kind) for r in c.records]
        assert ("api", "response") in roles and ("audio", "metadata") in roles, roles
        assert row["page"] in c.pages
    out = tmp_path / "kugou.wacz"
    r = await asyncio.to_thread(worker_evidence, "--data-dir", str(data), "--out", str(out),
                                *sorted({x["sha256"] for x in rows}))
    assert r.returncode == 0, r.stderr
    valid(out)
    assert {x["sha256"] for x in rows} <= payload_shas(out)
    r = await asyncio.to_thread(worker_evidence, "--data-dir", str(data), "--show", rows[0]["url"])
    assert r.returncode == 0 and "-> api call " in r.stdout and f"sha256 {rows[0]['sha256']}" in r.stdout, r.stdout
