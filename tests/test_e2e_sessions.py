"""End to end with real processes: a site behind a login form (testkit/loginsite.py) crawled whole through its
session, with its own politeness, user agent and header, while a second site on another port never gets a
cookie; and a wrong password: one clear error, the site waits, nothing of it fails, the other site is crawled
whole meanwhile; and a login server down for a while: the site waits, then is crawled whole."""

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from crawler.politeness import SLACK_CAP
from testkit import cluster
from testkit.loginsite import SUCCESS, LoginSite

pytestmark = pytest.mark.timeout(300)

MIN_DELAY = 0.08
AGENT = "members-crawler/2.0"


def sites_config(login: LoginSite, password_file: Path) -> dict:
    return {login.url.removeprefix("http://"): {
        "politeness": {"min_delay": MIN_DELAY, "max_per_host": 1},
        "user_agent": AGENT,
        "headers": {"X-Member-Of": "crawl-37"},
        "login": {"url": login.url + "/login",
                  "fields": {"user": "alice", "password": {"file": str(password_file)}},
                  "success": SUCCESS},
    }}


async def start(tmp: Path, login: LoginSite, other: LoginSite, password: str, *, exit_when_done: bool = True,
                seeds: list[str] | None = None):
    password_file = tmp / "password"
    password_file.write_text(password + "\n")
    seeds = seeds or [login.url + "/", other.url + "/"]
    hosts = [site.url.removeprefix("http://") for site in (login, other)]
    config = cluster.master_config(tmp, seeds, ["w1"],
                                   crawl={"max_depth": 5, "allowed_hosts": hosts, "allowed_networks": ["127.0.0.1"]},
                                   sites=sites_config(login, password_file), exit_when_done=exit_when_done)
    master = await cluster.start_master(config, tmp, log_level="debug")
    wcfg = tmp / "worker.yaml"
    wcfg.write_text("identify: {enabled: false}\n")
    worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp, config=wcfg)
    return config, master, worker


def page_requests(site: LoginSite):
    """The site's page requests, one a slot the master paced: not the login exchanges nor the request that met an
    expired session (a 302 to the login form: the page is asked again after the new login, in the same slot), nor
    audio downloads (paced by the audio gate, apart from pages)."""
    return sorted((h for h in site.hits if h.method == "GET" and h.path != "/account" and h.status != 302
                   and not h.path.startswith("/audio/")), key=lambda h: h.start)


async def test_a_site_behind_a_login_is_crawled_whole_through_its_session_and_no_other_site_gets_a_cookie(tmp_path):
    async with LoginSite(session_ttl=0.6, session_requests=12, songs=6) as login, LoginSite(songs=2) as other:
        config, master, worker = await start(tmp_path, login, other, "s3cret")
        try:
            assert await master.wait(120) == 0, master.log()[-3000:]
            assert await worker.wait(30) == 0, worker.log()[-3000:]
        finally:
            for p in (master, worker):
                await p.stop()
    out = master.stdout.decode()
    assert "errors          0" in out, out
    # Crawled whole: the public part, every members page and every song, each answered 200 in the end.
    answered = {h.path for h in login.hits if h.status == 200}
    assert login.member_paths() | login.public_paths() <= answered, sorted(login.member_paths() - answered)
    for k in range(login.songs):
        stored = [r for r in cluster.catalogue(tmp_path) if r["url"] == f"{login.url}/audio/{k}.mp3"]
        assert stored and stored[0]["status"] == "ok" and stored[0]["size"] == len(login.audio(k)), stored
    # The login comes first: before the site's first request, and so before any members page.
    first = min(login.hits, key=lambda h: h.start)
    assert (first.method, first.path) == ("POST", "/login") and first.status == 303
    assert first.headers.get("Content-Type") == "application/x-www-form-urlencoded"
    # The server expired the session during the crawl: the worker logged in again, and every members request
    # was answered in the end (those that met the expiry were asked again, no attempt counted).
    assert len(login.logins(ok=True)) >= 2, [(h.path, h.status) for h in login.hits]
    assert "logged in at" in worker.log() and " again" in worker.log()
    # Every request to the login site after the first login carried the session cookie (the login POSTs too:
    # they carry the jar, the old session with it).
    after = [h for h in login.hits if h.start > first.end]
    assert after and all("sid=" in h.cookie for h in after), [(h.path, h.cookie) for h in after if "sid=" not in
                                                             h.cookie]
    # The other site set cookies too (its visitor cookie) and never got one back, nor the login site's.
    assert other.public_paths() <= {h.path for h in other.hits if h.status == 200}
    assert other.hits and all(h.cookie == "" for h in other.hits), [h.cookie for h in other.hits if h.cookie]
    assert all(AGENT not in h.headers.get("User-Agent", "") and "X-Member-Of" not in h.headers for h in other.hits)
    # The site's own politeness: never two page requests in flight, and no faster than its delay allows...
    pages = page_requests(login)
    overlaps = [(a.path, b.path) for a, b in itertools.pairwise(pages) if b.start < a.end]
    assert not overlaps, overlaps
    rate = (len(pages) - 1) / (pages[-1].start - pages[0].start)
    assert rate <= 1.1 / MIN_DELAY, f"{rate:.1f} pages/s, {1 / MIN_DELAY:.1f} allowed"
    # ... which the master keeps strictly where it lets them go: within its documented slack.
    sent = [t for t, _, urls in cluster.assignments(master.log()) if any(u.startswith(login.url) for u in urls)]
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps and min(gaps) >= MIN_DELAY - SLACK_CAP - 1e-6, f"{min(gaps):.4f} s between two requests"
    # The site's user agent and header on every request to it, the login's included.
    assert all(h.headers.get("User-Agent") == AGENT for h in login.hits), \
        {h.headers.get("User-Agent") for h in login.hits}
    assert all(h.headers.get("X-Member-Of") == "crawl-37" for h in login.hits)


async def test_a_wrong_password_is_one_error_the_site_waits_and_the_other_site_is_crawled_whole(tmp_path):
    async with LoginSite() as login, LoginSite(songs=1) as other:
        # Both sites are seeds: the login site's URLs are at the same depths as the other's. The crawl goes
        # breadth first with a level barrier, and a site waiting for its login holds no level up (README,
        # "Sessions"): the other site's deeper levels are crawled while the login site's home page waits.
        config, master, worker = await start(tmp_path, login, other, "wrong", exit_when_done=False)
        site = login.url.removeprefix("http://")
        try:
            await cluster.until(lambda: other.public_paths() | {"/login"} <= {h.path for h in other.hits
                                                                               if h.status == 200}
                                or master.proc.returncode is not None, 60, "the other site's pages")
            await cluster.until(lambda: len(login.logins()) >= 2 or worker.proc.returncode is not None, 30,
                                "a second login attempt")
            await asyncio.sleep(1.0)     # tasks of the site handed back meanwhile, and given out again as probes
            # The status is the master's snapshot, written every few seconds: the wait shows in the next one.
            for _ in range(40):
                status = json.loads(await asyncio.to_thread(cluster.operator, "status", config, "--json"))
                if (status["sites"].get(site) or {}).get("login_waiting"):
                    break
                await asyncio.sleep(0.5)
            text = await asyncio.to_thread(cluster.operator, "status", config)
        finally:
            for p in (worker, master):
                await p.stop()
        log = worker.log()
        mlog = master.log()
        failed = await asyncio.to_thread(cluster.operator, "export", config, "--failed")
    # One clear error line for the episode, however many URLs and attempts.
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors
    assert site in errors[0] and "login" in errors[0] and "lacks the success text" in errors[0], errors[0]
    # The master says once that the site waits for its login, and why; no word of a node that cannot store.
    waits = [line for line in mlog.splitlines() if "waits for its login" in line]
    assert len(waits) == 1 and site in waits[0] and "lacks the success text" in waits[0], waits
    assert "cannot store" not in mlog and "Traceback" not in mlog
    # The status shows the site waiting, and why.
    assert "lacks the success text" in status["sites"][site]["login_waiting"]["reason"], status["sites"]
    assert f"site {site} waits for its login" in text, text
    # The site is not crawled: nothing but login attempts reached it, each refused.
    assert {(h.method, h.path, h.status) for h in login.hits} == {("POST", "/login", 200)}
    assert "Traceback" not in log
    # Nothing of it is failed: no failed URL, no catalogue row; its URLs wait in the frontier.
    assert failed.strip() == "", failed
    urls = status["urls"]
    assert urls["error"] == 0 and status["errors"] == {}, status
    assert urls["total"] - urls["done"] == 1, urls           # the login site's one URL known, waiting
    assert not any(r["url"].startswith(login.url) for r in _catalogue(tmp_path))
    # The other site, crawled whole: its levels past the waiting home page of the login site.
    assert other.public_paths() | {"/login"} <= {h.path for h in other.hits if h.status == 200}
    assert all(h.cookie == "" for h in other.hits)


async def test_a_login_server_down_then_up_the_site_waits_then_is_crawled_whole(tmp_path):
    async with LoginSite(songs=2, login_down=True) as login, LoginSite(songs=1) as other:
        config, master, worker = await start(tmp_path, login, other, "s3cret")
        site = login.url.removeprefix("http://")
        try:
            # The other site is crawled whole while the login server is down, and the site waits.
            await cluster.until(lambda: (other.public_paths() | {"/login"} <= {h.path for h in other.hits
                                                                                if h.status == 200}
                                         and "waits for its login" in master.log())
                                or master.proc.returncode is not None, 60, "the other site, and the wait")
            assert master.proc.returncode is None, master.log()[-3000:]
            assert {(h.method, h.path, h.status) for h in login.hits} == {("POST", "/login", 503)}
            login.login_down = False
            assert await master.wait(120) == 0, master.log()[-3000:]
            assert await worker.wait(30) == 0, worker.log()[-3000:]
        finally:
            for p in (master, worker):
                await p.stop()
    out = master.stdout.decode()
    assert "errors          0" in out, out
    # The site, crawled whole once its login worked: the public part, every members page and every song.
    answered = {h.path for h in login.hits if h.status == 200}
    assert login.member_paths() | login.public_paths() <= answered, sorted(login.member_paths() - answered)
    assert len(login.logins(ok=True)) >= 1
    # Said once each way in the master's log.
    mlog = master.log()
    waits = [line for line in mlog.splitlines() if "waits for its login" in line]
    goes_on = [line for line in mlog.splitlines() if "login works again" in line]
    assert len(waits) == 1 and site in waits[0] and "503" in waits[0], waits
    assert len(goes_on) == 1 and site in goes_on[0], goes_on
    assert "cannot store" not in mlog


def _catalogue(tmp: Path) -> list[dict]:
    path = tmp / "master" / "catalog.jsonl"
    return cluster.catalogue(tmp) if path.exists() else []
