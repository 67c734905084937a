"""The master's web server against a browser on the same machine that a hostile page drives: real masters as
processes, requested over loopback with the Host header a DNS-rebinding page would send.

Only Host names of this server are answered; every answer forbids framing, sniffing and inline script; the login
cookie is a session derived from the token, not the token; the default web.listen lets two masters run side by
side, and a taken port is one line and exit 2."""

import asyncio
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from crawler.master.web import SESSION_SECONDS, host_allowed, session_valid, session_value
from testkit import cluster

pytestmark = pytest.mark.timeout(120)

TOKEN = "Tq8vB3xK2mW9pZ4rY7nL5cF1hJ6dS0aE"


def config_with(tmp_path: Path, name: str, web: dict | None) -> Path:
    """A master config of its own in tmp_path/name; web None: no web section at all (every default)."""
    tmp = tmp_path / name
    tmp.mkdir()
    config = cluster.master_config(tmp, ["http://127.0.0.1:9/"], ["a"], exit_when_done=False)
    raw = yaml.safe_load(config.read_text())
    raw.pop("web")
    if web is not None:
        raw["web"] = web
    config.write_text(yaml.safe_dump(raw))
    return config


def assert_guarded(resp: httpx.Response) -> None:
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, csp
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_two_masters_with_the_default_web_listen_run_side_by_side_and_refuse_foreign_hosts(tmp_path):
    configs = [config_with(tmp_path, n, None) for n in ("one", "two")]
    masters = [await cluster.start_master(c, c.parent) for c in configs]
    try:
        urls = [cluster.web_url(c) for c in configs]
        assert urls[0] != urls[1] and all(u.startswith("http://127.0.0.1:") for u in urls)
        port = urls[0].rsplit(":", 1)[1]
        assert f"status page on {urls[0][len('http://'):]}" in masters[0].log().replace("http://", "")
        async with httpx.AsyncClient(base_url=urls[0], timeout=10) as client:
            # A page on attacker.example whose name now resolves to 127.0.0.1: its requests carry its own name.
            for path in ("/", "/api/status", "/api/audio", "/metrics", "/login", "/status.js"):
                resp = await client.get(path, headers={"Host": f"attacker.example:{port}"})
                assert resp.status_code == 421 and "crawl" not in resp.text, (path, resp.text)
                assert_guarded(resp)
            for host in (f"attacker.example.:{port}", "127.0.0.1.attacker.example", "localhost.attacker.example"):
                assert (await client.get("/api/status", headers={"Host": host})).status_code == 421, host
            # The names of this server itself are answered, with the guarding headers.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "127.0.0.2"):
                resp = await client.get("/api/status", headers={"Host": host})
                assert resp.status_code == 200 and resp.json()["urls"] is not None, host
                assert_guarded(resp)
            page = await client.get("/")
            assert_guarded(page)
            # No inline script: every script the page has is a file the server serves as JavaScript.
            scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.DOTALL)
            assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts), scripts
            js = await client.get("/status.js")
            assert js.status_code == 200 and js.headers["Content-Type"].startswith("text/javascript")
            assert "api/status" in js.text
            assert_guarded(await client.get("/no-such-page"))
        # The status command names the page too.
        status = subprocess.run([sys.executable, "-m", "crawler.master", "status", "--config", str(configs[1])],
                                capture_output=True, text=True, timeout=60, check=False)
        assert f"status page {urls[1]}/" in status.stdout, status.stdout + status.stderr
    finally:
        for m in masters:
            await m.stop()


async def test_configured_names_are_answered_and_the_login_cookie_is_a_session_not_the_token(tmp_path):
    token_file = tmp_path / "web-token"
    cluster.write_secret(token_file, TOKEN)
    config = config_with(tmp_path, "m", {"listen": "127.0.0.1:0", "token_file": str(token_file),
                                         "allowed_hosts": ["crawl-master.example"]})
    master = await cluster.start_master(config, config.parent)
    try:
        url = cluster.web_url(config)
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            named = await client.get("/api/status", headers={"Host": "Crawl-Master.example",
                                                             "Authorization": f"Bearer {TOKEN}"})
            assert named.status_code == 200
            assert (await client.get("/api/status", headers={"Host": "other.example",
                                                             "Authorization": f"Bearer {TOKEN}"})).status_code == 421
            login = await client.post("/login", data={"token": TOKEN})
            assert login.status_code == 303
            assert_guarded(login)
            value = login.cookies["crawler_token"]
            assert TOKEN not in value and TOKEN not in login.headers["Set-Cookie"]
            assert f"Max-Age={SESSION_SECONDS}" in login.headers["Set-Cookie"]
            expires = int(value.split(".")[0])
            assert time.time() < expires <= time.time() + SESSION_SECONDS
            assert (await client.get("/api/status")).status_code == 200          # the session cookie works
        async with httpx.AsyncClient(base_url=url, timeout=10) as anon:
            for cookie in (TOKEN, f"{expires}.{'0' * 64}", value.replace(".", ".f", 1),
                           session_value(TOKEN, int(time.time()) - 1),           # expired
                           session_value(TOKEN, int(time.time()) + 10 * SESSION_SECONDS)):   # too long
                anon.cookies.set("crawler_token", cookie)
                assert (await anon.get("/api/status")).status_code == 401, cookie
    finally:
        await master.stop()


async def test_a_taken_web_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = config_with(tmp_path, "m", {"listen": f"127.0.0.1:{port}"})
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "crawler.master", "--config",
                                                        str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"web.listen 127.0.0.1:{port}" in lines[0], done.stderr


def test_session_values_and_host_names_decide_alone():
    now = 1_000_000.0
    good = session_value(TOKEN, int(now) + 60)
    assert session_valid(TOKEN, good, now) and not session_valid("another-token", good, now)
    assert not session_valid(TOKEN, good, now + 61) and not session_valid(TOKEN, "", now)
    assert not session_valid(TOKEN, "9" * 40 + "." + good.split(".")[1], now)
    names = frozenset({"localhost", "127.0.0.1", "::1", "master.lan"})
    assert host_allowed(None, names, False) and host_allowed("MASTER.lan.:80", names, False)
    assert not host_allowed("10.0.0.5:80", names, False) and host_allowed("10.0.0.5:80", names, True)
    assert not host_allowed("[::1", names, False) and not host_allowed("evil.example", names, True)
