"""End to end: the works identified. Real master and workers as processes, on loopback, crawl a site of copies of
synthesised reference works (every transform of testkit/music.py: re-encoded, resampled, quieter, louder, mono,
band-limited, noisy, cut, an excerpt, faster and slower, a joined HLS stream) among unrelated audio. Some works are
added before the crawl and the rest after it, on the running master (retroactive matching). Every copy matches its
work at the right offset and nothing else matches; the matches' export, the catalogue's rows and the signed webhook
POSTs say so, one POST per (audio URL, work)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from testkit import cluster, music, siteserver
from testkit.cluster import jsonl, master_command, store_count

pytestmark = pytest.mark.timeout(240)

SECONDS = 40.0                    # each work's length: short, so the crawl stays quick
WORKS = {"W-A": 101, "W-B": 102, "W-C": 103}    # work id: seed
BEFORE = ("W-A", "W-B")           # added before the crawl; W-C after it, when its copies are all stored
OFFSET_TOLERANCE = 0.5            # seconds


def _transforms() -> tuple[music.Transform, ...]:
    """Every transform; the 20 s excerpt starts within a short work (music's starts 31 s in, for longer works)."""
    out = []
    for t in music.TRANSFORMS:
        if t.name == "excerpt-20s":
            t = dataclasses.replace(t, before=("-ss", "12", "-t", "20"), offset=12.0)
        out.append(t)
    return tuple(out)


TRANSFORMS = _transforms()


@dataclass(frozen=True)
class Site:
    root: Path
    refs: Path                    # the reference works' WAV files
    meta: Path                    # the CSV naming them
    copies: dict[str, tuple[str, float]]    # site path of each copy: (work, true offset)
    decoys: dict[str, str]        # site path of each decoy: the recording it is (two paths may be one)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """The works, their copies and the decoys, made once for the module; pages link them."""
    base = tmp_path_factory.mktemp("identify")
    root, refs, src = base / "site", base / "refs", base / "src"
    for d in (root / "media", refs, src):
        d.mkdir(parents=True)
    copies: dict[str, tuple[str, float]] = {}
    pages: dict[str, list[str]] = {}
    for work, seed in WORKS.items():
        ref = music.write_wav(refs / f"{work.lower()}.wav", music.work(seed, SECONDS))
        links = pages.setdefault(f"{work.lower()}.html", [])
        for k, t in enumerate(TRANSFORMS):
            # The joined HLS stream (MPEG-TS) is served whole, under the name the worker's HLS download stores
            # it by: what is fingerprinted is the joined file either way (tests/test_e2e_live_hls.py crawls a
            # playlist itself).
            suffix = ".aac" if t.name == "hls-ts" else t.suffix
            path = f"/media/{work.lower()}-{t.name}{suffix}"
            music.make_copy(ref, t, root / path.lstrip("/"), seed=seed * 100 + k)
            copies[path] = (work, t.offset)
            links.append(path)
    for hiss in root.glob("media/*.noise.wav"):     # the noise mixed into a copy is not on the site
        hiss.unlink()
    # Unrelated audio: two works never added (each in two encodings: one recording, two addresses), speech, noise.
    decoys: dict[str, str] = {}
    for seed in (201, 202):
        wav = music.write_wav(src / f"other-{seed}.wav", music.work(seed, SECONDS))
        for t in (TRANSFORMS[0], TRANSFORMS[2]):      # mp3, vorbis
            path = f"/media/other-{seed}-{t.name}{t.suffix}"
            music.make_copy(wav, t, root / path.lstrip("/"))
            decoys[path] = f"other-{seed}"
    music.write_wav(root / "media" / "talk.wav", music.speech(7, 30.0))
    music.write_wav(root / "media" / "hiss.wav", music.noise(8, 30.0))
    decoys["/media/talk.wav"] = "talk"
    decoys["/media/hiss.wav"] = "hiss"
    pages["other.html"] = sorted(decoys)
    for name, links in pages.items():
        body = "".join(f'<li><a href="{p}">{Path(p).name}</a></li>' for p in links)
        (root / name).write_text(f"<html><head><title>{name}</title></head><body><ul>{body}</ul></body></html>")
    (root / "index.html").write_text("<html><body>" + "".join(f'<a href="/{n}">{n}</a> ' for n in pages)
                                     + "</body></html>")
    meta = base / "works.csv"
    meta.write_text("path,work,title,artist\n" + "".join(
        f"refs/{w.lower()}.wav,{w},Title of {w},Artist {w[-1]}\n" for w in WORKS))
    return Site(root, refs, meta, copies, decoys)


class Webhook:
    """The operator's webhook on loopback: keeps every POST (headers and body) and answers 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _post(self, request: web.Request) -> web.Response:
        self.posts.append((dict(request.headers), await request.read()))
        return web.Response(text="ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        tcp = web.TCPSite(self._runner, "127.0.0.1", 0)
        await tcp.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_every_copy_is_identified_before_and_after_its_work_is_added(site, tmp_path):
    hook = Webhook()
    await hook.start()
    alert_secret = cluster.write_secret(tmp_path / "alert-secret")
    master = workers = None
    try:
        async with await siteserver.start(site.root) as server:
            base = server.url
            nodes = ["w1", "w2"]
            config = cluster.master_config(tmp_path, [base + "/"], nodes, exit_when_done=False,
                                           alerts={"webhook": hook.url, "secret_file": str(alert_secret)})
            db = Path(cluster.store_of(config))
            master = await cluster.start_master(config, tmp_path)
            # The first works go in before any worker joined: through the running master.
            refs = [str(site.refs / f"{w.lower()}.wav") for w in BEFORE]
            said = await asyncio.to_thread(master_command, "references", "add", "--config", str(config), "--meta",
                                           str(site.meta), *refs)
            assert said.startswith("added 2 reference works"), said
            addr = cluster.master_addr(config)
            workers = [await cluster.start_worker(addr, n, tmp_path) for n in nodes]
            audio = len(site.copies) + len(site.decoys)
            # The crawl is over when every audio address's fingerprint is in the store and matched.
            fingerprinted = "SELECT count(*) FROM fingerprints WHERE checked >= 0"
            await cluster.until(lambda: store_count(db, fingerprinted) == audio,
                                150, f"the {audio} fingerprints", master, *workers)
            early = 2 * len(TRANSFORMS)
            await cluster.until(lambda: len(hook.posts) >= early, 30, "the first works' alerts", master)
            assert store_count(db, "SELECT count(*) FROM matches WHERE work = 'W-C'") == 0
            # The last work, added after its copies were stored: matched against them, no crawl needed.
            said = await asyncio.to_thread(master_command, "references", "add", "--config", str(config), "--meta",
                                           str(site.meta), str(site.refs / "w-c.wav"))
            assert said.startswith("added 1 reference works, 3 in all"), said
            await cluster.until(lambda: len(hook.posts) >= len(site.copies), 60, "every alert", master)
            await asyncio.sleep(2.5)       # a second round of the matcher and the outbox: nothing more comes
            listed = await asyncio.to_thread(master_command, "references", "list", "--config", str(config), "--json")
            for w in workers:
                await w.stop()
            await master.stop()
        assert {r["work"]: r["title"] for r in jsonl(listed)} == {w: f"Title of {w}" for w in WORKS}
        matches = jsonl(await asyncio.to_thread(cluster.operator, "export", config, "--matches"))
        catalogue = jsonl(await asyncio.to_thread(cluster.operator, "export", config))
    finally:
        for w in workers or []:
            await w.stop()
        if master is not None:
            await master.stop()
        await hook.close()

    expected = {base + path: truth for path, truth in site.copies.items()}
    pages = {base + path: f"{base}/{work.lower()}.html" for path, (work, _) in site.copies.items()}

    # The matches' export: one row per copy, to its work, at its offset; nothing else.
    by_url = {r["url"]: r for r in matches}
    assert len(matches) == len(by_url), "an address matched two works"
    missed = sorted(set(expected) - set(by_url))
    wrong = sorted(u for u in by_url if u not in expected)
    assert not missed and not wrong, (missed, wrong)
    for url, (work, offset) in expected.items():
        row = by_url[url]
        assert row["work"] == work and row["title"] == f"Title of {work}" and row["artist"] == f"Artist {work[-1]}"
        assert abs(row["offset"] - offset) <= OFFSET_TOLERANCE, (url, row["offset"], offset)
        assert row["score"] > 0 and row["page"] == pages[url]
        assert row["first_seen"] and row["last_seen"] and row["matched_at"] and row["recording"] is not None

    # The alerts: one POST per match, its body the export's row, signed with the alert secret.
    secret = cluster.read_secret(alert_secret)
    posted = {}
    for headers, body in hook.posts:
        want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers.get("X-Crawler-Signature", ""), want), headers
        assert headers.get("Content-Type", "").startswith("application/json")
        row = json.loads(body)
        key = (row["url"], row["work"])
        assert key not in posted, f"{key} posted twice"
        posted[key] = row
    assert set(posted) == {(u, w) for u, (w, _) in expected.items()}
    for key, row in posted.items():
        assert {k: row[k] for k in ("url", "work", "score", "offset", "page")} == \
               {k: by_url[key[0]][k] for k in ("url", "work", "score", "offset", "page")}

    # The catalogue's rows: a copy's row carries its match; a decoy's none. A work's copies are one recording.
    rows = {r["url"]: r for r in catalogue}
    assert set(rows) == set(expected) | {base + p for p in site.decoys}
    recordings: dict[str, set[int]] = {}
    for url, (work, offset) in expected.items():
        m = rows[url].get("match")
        assert m and m["work"] == work and abs(m["offset"] - offset) <= OFFSET_TOLERANCE, (url, m)
        recordings.setdefault(work, set()).add(rows[url]["recording"])
    for path, recording in site.decoys.items():
        assert "match" not in rows[base + path], rows[base + path]
        recordings.setdefault(recording, set()).add(rows[base + path].get("recording"))
    assert all(len(ids) == 1 for ids in recordings.values()), recordings
    firsts = [next(iter(ids)) for ids in recordings.values()]
    assert len(set(firsts)) == len(firsts), "two recordings share an id"


async def test_a_crawl_that_ends_on_its_own_waits_for_the_fingerprints_of_what_it_stored(site, tmp_path):
    """Outcomes go without their fingerprints while a worker's pool is busy, the fingerprints after them: a crawl
    done (exit_when_done) ends once every worker said its pool is empty, so no stored file goes unfingerprinted."""
    async with await siteserver.start(site.root) as server:
        nodes = ["w1", "w2"]
        config = cluster.master_config(tmp_path, [server.url + "/"], nodes)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path) for n in nodes]
        assert await master.wait(150) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0, w.log()[-2000:]
    db = Path(cluster.store_of(config))
    audio = len(site.copies) + len(site.decoys)
    assert store_count(db, "SELECT count(*) FROM audio") == audio
    assert store_count(db, "SELECT count(*) FROM fingerprints") == audio
