"""Refresh that tracks change, end to end: a real master and worker revisit a local site that is edited between
visits, and the catalogue, the --changes-since export and the site's own request log say exactly what changed."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys
import time
from pathlib import Path

from crawler.logs import iso_utc
from crawler.master.store import MasterStore
from testkit import cluster
from tests.fakes.hostile import mp3
from tests.fakes.rangeserver import RangeServer
from tests.store_reads import audio_history, page_visit

HTML = "text/html; charset=utf-8"


def page(*audio: str) -> bytes:
    links = "".join(f'<li><a href="{a}">{a}</a></li>' for a in audio)
    return f"<html><body><h1>songs</h1><ul>{links}</ul></body></html>".encode()


def snapshot(db: Path | str) -> tuple[dict[str, dict], MasterStore]:
    store = MasterStore.open_readonly(db)
    return {row["url"].rsplit("/", 1)[1].removesuffix(".mp3"): row for row in store.catalogue()}, store


def catalogue_of(db: Path | str) -> dict[str, dict]:
    if isinstance(db, Path) and not db.exists():
        return {}
    rows, store = snapshot(db)
    store.close()
    return rows


async def export(config: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crawler.master", "export", "--config", str(config), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_a_revisit_finds_what_appeared_changed_and_went_and_asks_conditionally(tmp_path, master_store):
    async with RangeServer(second_host=False) as srv:
        plain = {"etag": None, "last_modified": None, "content_type": HTML}
        srv.add("/", page("/a.html", "/b.html", "/gone.html", "/static.html"), **plain)
        srv.add("/a.html", page("/audio/a1.mp3"), **plain)
        srv.add("/b.html", page("/audio/b1.mp3", "/audio/b2.mp3"), **plain)
        srv.add("/gone.html", page("/audio/g1.mp3"), **plain)
        # The one page a site serves with a validator: its revisits are answered 304.
        srv.add("/static.html", page("/audio/s1.mp3"), etag='"static-1"', last_modified=None, content_type=HTML)
        for i, name in enumerate(("a1", "b1", "b2", "b3", "g1", "s1")):
            srv.add(f"/audio/{name}.mp3", mp3(i))
        config = cluster.master_config(tmp_path, [srv.url("/")], ["w1"], exit_when_done=False,
                                       crawl={"refresh_interval": 2.0, "refresh_min": 2.0, "refresh_max": 2.0},
                                       **master_store)
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("revalidate_after: 0\n")   # every visit of a page asks about its audio (conditionally)
        db = cluster.store_of(config)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
        try:
            first = {"a1", "b1", "b2", "g1", "s1"}
            await srv.wait_until(lambda: {k for k, r in catalogue_of(db).items() if r["sha256"]} == first, 120)
            before = catalogue_of(db)
            # Every page revisited once before the edit, so the edit is seen by a revisit, not a first visit.
            await srv.wait_until(lambda: sum(1 for r in srv.log if r.path == "/static.html") >= 2, 120)
            # The edit, in one step of the server's loop: no request sees half of it.
            t_edit = time.time()
            seen = len(srv.log)
            srv.replace_content("/audio/a1.mp3", mp3(100))                           # new bytes, same address
            srv.replace_content("/b.html", page("/audio/b1.mp3", "/audio/b3.mp3"))  # b2 off its page, b3 on it
            srv.remove("/gone.html")                                                  # the page answers 404

            def edited() -> bool:
                rows = catalogue_of(db)
                return (rows.get("a1", {}).get("status") == "changed" and rows["b2"]["status"] == "removed"
                        and bool(rows.get("b3", {}).get("sha256")) and rows["g1"]["status"] == "removed"
                        and any(r.path == "/static.html" and r.status == 304 for r in srv.log[seen:])
                        and rows["s1"]["last_seen"] >= t_edit)    # that 304's report reached the master

            await srv.wait_until(edited, 120)
        finally:
            await worker.stop()
            await master.stop()
        log = list(srv.log)

    rows, store = snapshot(db)
    try:
        gone = page_visit(store, srv.url("/gone.html"))
        history = audio_history(store, srv.url("/audio/a1.mp3"))
        static = page_visit(store, srv.url("/static.html"))
    finally:
        store.close()
    edit_iso = iso_utc(t_edit)
    # The catalogue: exactly these four changed, each with its time; the rest as they were.
    assert rows["a1"]["status"] == "changed" and rows["a1"]["changed_at"] >= t_edit
    assert rows["a1"]["sha256"] != before["a1"]["sha256"]
    assert [h["sha256"] for h in history] == [before["a1"]["sha256"]]
    assert rows["b2"]["status"] == rows["g1"]["status"] == "removed"
    assert rows["b2"]["removed_at"] >= t_edit and rows["g1"]["removed_at"] >= t_edit
    assert rows["b3"]["status"] == "ok" and rows["b3"]["found_at"] >= t_edit
    for name in ("b1", "s1"):
        assert rows[name]["status"] == "ok" and rows[name]["sha256"] == before[name]["sha256"]
        assert rows[name]["changed_at"] is None and rows[name]["removed_at"] is None
        assert rows[name]["found_at"] < t_edit <= rows[name]["last_seen"]
    assert gone is not None and gone["gone_at"] >= t_edit
    assert static is not None and static["etag"] == '"static-1"'

    # The export of changes since the edit lists exactly those, with the page and the times (ISO-8601 UTC).
    lines = [json.loads(x) for x in (await export(config, "--changes-since", edit_iso)).splitlines()]
    assert sorted((r["url"].rsplit("/", 1)[1], r["change"]) for r in lines) == [
        ("a1.mp3", "changed"), ("b2.mp3", "removed"), ("b3.mp3", "new"), ("g1.mp3", "removed")]
    by_name = {r["url"].rsplit("/", 1)[1]: r for r in lines}
    assert by_name["b2.mp3"]["page"] == srv.url("/b.html") and by_name["g1.mp3"]["page"] == srv.url("/gone.html")
    assert by_name["a1.mp3"]["changed_at"] >= edit_iso and by_name["a1.mp3"]["first_seen"] < edit_iso
    assert by_name["b3.mp3"]["first_seen"] >= edit_iso and by_name["g1.mp3"]["removed_at"] >= edit_iso
    assert all(r["last_seen"].endswith("Z") for r in lines)
    table = list(csv.DictReader(io.StringIO(await export(config, "--changes-since", edit_iso, "--format", "csv"))))
    assert sorted(r["change"] for r in table) == ["changed", "new", "removed", "removed"]
    assert await export(config, "--changes-since", iso_utc(time.time() + 60)) == ""
    # The status command shows the refresh cycles' counts (how the changes fall into cycles depends on timing).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crawler.master", "status", "--json", "--config", str(config),
        stdout=asyncio.subprocess.PIPE)
    status = json.loads((await asyncio.wait_for(proc.communicate(), 60))[0])
    assert set(status["changes"]["this_cycle"]) >= {"new", "changed", "removed", "start"}

    # The site's log: the unchanged page was answered 304 on its revisits, and audio whose bytes did not change
    # was downloaded once (its revalidations were answered 304, no body).
    assert sum(1 for r in log if r.path == "/static.html" and r.status == 304) >= 1
    assert all("if-none-match" in r.headers for r in log if r.path == "/static.html" and r.status == 304)
    for name in ("b1", "s1", "g1", "b2"):
        assert [r.status for r in log if r.path == f"/audio/{name}.mp3" and r.status == 200] == [200], name
    assert [r.status for r in log if r.path == "/audio/a1.mp3" and r.status == 200] == [200, 200]
    # The page answered 304 is not parsed, yet its audio is asked about again (revalidate_after: 0), from what the
    # worker kept of the page's last full answer: conditionally, answered 304.
    s1 = [r.status for r in log if r.path == "/audio/s1.mp3"]
    assert s1[0] == 200 and len(s1) >= 2 and set(s1[1:]) == {304}, s1


def dynamic(body: str) -> object:
    """A page made anew on each request, with a clock and a one-time token in it (as a CMS serves it)."""
    counter = iter(range(1 << 30))

    def render() -> bytes:
        n = next(counter)
        return (f"<html><head><meta name='csrf-token' content='{n:08x}{time.time_ns()}'></head><body>"
                f"<p>generated {time.time():.6f}, visit {n}</p>{body}</body></html>").encode()
    return render


def refresh_lines(log: str) -> tuple[list[str], list[str]]:
    """The master's once-a-cycle refresh lines: (the first visit ended, each later cycle's figures)."""
    lines = log.splitlines()
    return ([x for x in lines if "the first visit of the site is over" in x],
            [x for x in lines if "refresh cycle:" in x])


SONGS = 4


def unchanged_site(srv: RangeServer) -> None:
    """Song pages behind an index, every page with a clock and a token; each song's audio only in its playlist
    (song 0 also links its file itself). The playlists are static files: their revisits are answered 304."""
    links = "".join(f'<li><a href="/song/{i}.html">song {i}</a></li>' for i in range(SONGS))
    srv.add("/", content_type=HTML, etag=None, last_modified=None, data=b"-").render = dynamic(f"<ul>{links}</ul>")
    for i in range(SONGS):
        direct = '<a href="/audio/0.mp3">download</a>' if i == 0 else ""
        srv.add(f"/song/{i}.html", content_type=HTML, etag=None, last_modified=None, data=b"-").render = dynamic(
            f'<h1>Song {i}</h1><a href="/lists/{i}.m3u">listen</a>{direct}')
        srv.add(f"/lists/{i}.m3u", f"#EXTM3U\n#EXTINF:100,Artist - Song {i}\n/audio/{i}.mp3\n".encode(),
                content_type="audio/x-mpegurl")
        srv.add(f"/audio/{i}.mp3", mp3(i))


async def test_an_unchanged_site_reports_no_change_over_cycles_node_changes_and_a_master_kill(tmp_path, master_store):
    async with RangeServer(second_host=False) as srv:
        unchanged_site(srv)
        config = cluster.master_config(tmp_path, [srv.url("/")], ["w1", "w2", "w3"], exit_when_done=False,
                                       crawl={"refresh_interval": 1.0, "refresh_min": 1.0, "refresh_max": 1.0},
                                       **master_store)
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("revalidate_after: 0\n")
        db = cluster.store_of(config)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = {n: await cluster.start_worker(addr, n, tmp_path, config=wcfg) for n in ("w1", "w2")}

        masters = [master]

        def logs() -> str:
            return "".join(m.log() for m in masters)

        def cycles() -> int:
            return len(refresh_lines(logs())[1])

        async def cycle_done(n: int) -> None:
            await cluster.until(lambda: cycles() >= n, 60, f"{n} refresh cycles")

        try:
            await srv.wait_until(lambda: sum(1 for r in catalogue_of(db).values() if r["sha256"]) == SONGS, 60)
            await cycle_done(1)
            workers["w3"] = await cluster.start_worker(addr, "w3", tmp_path, config=wcfg)    # a worker joins
            await cycle_done(2)
            workers["w1"].kill()                                                              # one dies (SIGKILL)
            await cycle_done(4)
            master.kill()                                       # the master dies (SIGKILL) and starts again
            await master.wait(30)
            master = await cluster.start_master(config, tmp_path, log_name="master2.log")
            masters.append(master)
            await cluster.until(lambda: len(refresh_lines(master.log())[1]) >= 2, 60, "cycles after the restart")
        finally:
            for w in workers.values():
                await w.stop()
            await master.stop()
        log = list(srv.log)

    first, later = refresh_lines(logs())
    assert len(first) == 1, first
    assert len(later) >= 6 and logs().count("pages due again") == len(later)
    for line in later:   # every cycle after the first: nothing changed
        assert " 0 new, 0 changed, 0 removed audio items" in line, line
    assert all(int(x.split("refresh cycle: ")[1].split(" ")[0]) > 0 for x in later[:4]), later
    rows, store = snapshot(db)
    try:
        assert {k: r["status"] for k, r in rows.items()} == {str(i): "ok" for i in range(SONGS)}
        assert all(r["removed_at"] is None and r["changed_at"] is None for r in rows.values())
        assert all(r["last_seen"] > r["found_at"] for r in rows.values())   # seen again, by its playlist's visits
        songs = [page_visit(store, srv.url(f"/song/{i}.html")) for i in range(SONGS)]
        status = store.status()
    finally:
        store.close()
    # A page's clock and token are no change: what the crawl takes from it is the same.
    assert all(v is not None and v["changed_at"] is None for v in songs), songs
    assert status["audio"] == {"ok": SONGS}
    assert status["changes"]["last_cycle"]["first"] is False
    # The site was really visited again: its pages in full (they have no validators), its playlists answered
    # 304 and, on a node that had not fetched them before, in full.
    for i in range(SONGS):
        assert sum(1 for r in log if r.path == f"/song/{i}.html") >= 4
        assert {r.status for r in log if r.path == f"/lists/{i}.m3u"} >= {200}
    assert any(r.path.startswith("/lists/") and r.status == 304 for r in log)
    # No export says anything changed since the first cycle.
    assert await export(config, "--changes-since", refresh_lines(logs())[0][0].split(" ")[0]) == ""


async def test_a_file_replaced_behind_a_page_that_answers_304_is_changed(tmp_path, master_store):
    async with RangeServer(second_host=False) as srv:
        srv.add("/", page("/static.html"), etag='"index-1"', last_modified=None, content_type=HTML)
        srv.add("/static.html", page("/audio/x.mp3"), etag='"static-1"', last_modified=None, content_type=HTML)
        srv.add("/audio/x.mp3", mp3(1))
        config = cluster.master_config(tmp_path, [srv.url("/")], ["w1"], exit_when_done=False,
                                       crawl={"refresh_interval": 1.0, "refresh_min": 1.0, "refresh_max": 1.0},
                                       **master_store)
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("revalidate_after: 0\n")
        db = cluster.store_of(config)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
        try:
            await srv.wait_until(lambda: any(r.path == "/static.html" and r.status == 304 for r in srv.log), 60)
            before = catalogue_of(db)["x"]
            t_edit = time.time()
            srv.replace_content("/audio/x.mp3", mp3(2))            # new bytes, new ETag; the page is as it was
            await srv.wait_until(lambda: catalogue_of(db)["x"]["status"] == "changed", 60)
        finally:
            await worker.stop()
            await master.stop()
        log = list(srv.log)

    rows, store = snapshot(db)
    try:
        history = audio_history(store, srv.url("/audio/x.mp3"))
    finally:
        store.close()
    assert rows["x"]["changed_at"] >= t_edit and rows["x"]["sha256"] != before["sha256"]
    assert [h["sha256"] for h in history] == [before["sha256"]]
    # The page answered 304 on every visit after its first: the change was found behind it.
    assert [r.status for r in log if r.path == "/static.html"][0] == 200
    assert set(r.status for r in log if r.path == "/static.html")  == {200, 304}
    assert [r.status for r in log if r.path == "/static.html"].count(200) == 1
    lines = [json.loads(x) for x in (await export(config, "--changes-since", iso_utc(t_edit))).splitlines()]
    assert [(r["url"].rsplit("/", 1)[1], r["change"]) for r in lines] == [("x.mp3", "changed")]
