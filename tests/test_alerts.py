"""Alerts (crawler/master/alerts.py): each new match POSTed to the webhook, signed, kept in the store's outbox until
a 2xx answer and tried again with backoff; the config keys; a running master with a fake index delivering them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

import pytest
from aiohttp import web

from crawler.config import ConfigError
from crawler.master import alerts
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from crawler.master.store import MasterStore, Reference
from testkit.cluster import write_secret
from tests.fakes.identify import FakeIndex, fingerprint_of


def _raw(tmp_path, **alert):
    return {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"],
            "seeds": ["http://127.0.0.1:9/"], "secret_file": str(write_secret(tmp_path / "s")),
            "exit_when_done": False, "politeness": {"obey_robots": False}, "web": {"listen": "off"},
            "dedup": {"expected_urls": 1000}, **({"alerts": alert} if alert else {})}


def test_signature_and_backoff():
    body = b'{"work": "w1"}'
    assert alerts.signature(b"k" * 32, body) == "sha256=" + hmac.new(b"k" * 32, body, hashlib.sha256).hexdigest()
    assert alerts.next_try(100.0, 0) == 100.0 + alerts.FIRST_BACKOFF
    assert alerts.next_try(100.0, 1) == 100.0 + 2 * alerts.FIRST_BACKOFF
    assert alerts.next_try(100.0, 1000) == 100.0 + alerts.MAX_BACKOFF


def test_the_alert_keys_go_together(tmp_path):
    with pytest.raises(ConfigError, match="alerts.secret_file"):
        MasterConfig.from_mapping(_raw(tmp_path, webhook="http://127.0.0.1:1/hook"), tmp_path)
    with pytest.raises(ConfigError, match="not an http"):
        MasterConfig.from_mapping(_raw(tmp_path, webhook="ftp://x/", secret_file=str(write_secret(tmp_path / "a"))),
                                  tmp_path)
    cfg = MasterConfig.from_mapping(_raw(tmp_path, webhook="http://127.0.0.1:1/hook",
                                         secret_file=str(write_secret(tmp_path / "a"))), tmp_path)
    assert cfg.alerts.webhook == "http://127.0.0.1:1/hook" and cfg.alerts.secret
    assert MasterConfig.from_mapping(_raw(tmp_path), tmp_path).alerts.webhook is None


async def test_each_new_match_is_posted_signed_until_the_webhook_takes_it(tmp_path, until, monkeypatch):
    monkeypatch.setattr(alerts, "FIRST_BACKOFF", 0.05)
    got: list[tuple[str, bytes, int]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        status = 503 if not got else 200       # the first try fails: the alert waits and goes again
        got.append((request.headers.get(alerts.SIGNATURE_HEADER, ""), body, status))
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    secret_path = write_secret(tmp_path / "alert-secret")
    cfg = MasterConfig.from_mapping(_raw(tmp_path, webhook=f"http://127.0.0.1:{port}/hook",
                                         secret_file=str(secret_path)), tmp_path)
    (tmp_path / "m").mkdir()
    with MasterStore(tmp_path / "m" / "master.db") as s:
        s.add_audio([{"url": "http://x/1.mp3", "page": "http://x/", "node": "w1", "found_at": 1.0},
                     {"url": "http://x/2.mp3", "page": "http://x/", "node": "w1", "found_at": 1.0}])
        s.add_references([Reference("w1", fingerprint_of("a", "b", "c"), "One")], 1.0)
        s.add_fingerprints([("http://x/1.mp3", fingerprint_of("z", "a", "b", "c")),
                            ("http://x/2.mp3", fingerprint_of("q", "r", "s"))], 1.0)    # no match: no alert
    master = Master(cfg, new_index=FakeIndex)
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait({serving, asyncio.create_task(listening.wait())}, return_when=asyncio.FIRST_COMPLETED)
    try:
        await until(lambda: any(status == 200 for *_, status in got), 20, "the alert delivered")
        await until(lambda: master.store.identify.alerts_waiting() == 0, 20, "the outbox emptied")
        await asyncio.sleep(0.3)    # nothing more comes
    finally:
        master.stop()
        await serving
        await runner.cleanup()
    assert [status for *_, status in got] == [503, 200]
    secret = cfg.alerts.secret
    assert secret is not None
    for sig, body, _ in got:
        assert sig == "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        row = json.loads(body)
        assert (row["url"], row["work"], row["title"], row["page"], row["offset"]) == (
            "http://x/1.mp3", "w1", "One", "http://x/", 0.0)
        assert row["matched_at"].endswith("Z")
