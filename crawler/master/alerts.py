"""Alerts: each new (audio URL, work) match POSTed to the operator's webhook (alerts.webhook in the master's config).

The body is the matches export's row as one JSON object; ``X-Crawler-Signature: sha256=<hex HMAC-SHA256 of the
body with alerts.secret_file>`` lets the receiver check it came from this crawl. The store's outbox holds each alert
from the transaction that found the match until the webhook answers 2xx (at least once: an answer lost after a
2xx sends it again); a failure is tried again after a backoff that doubles up to MAX_BACKOFF, across restarts.
Nothing but a match is ever sent. The POST goes through the crawler's HTTP stack (crawler/http), redirects not
followed, with a deadline per request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Protocol

import httpx

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Crawler-Signature"
BATCH = 32                  # alerts taken from the outbox per round
FIRST_BACKOFF = 5.0         # seconds before the first retry; doubled per failure
MAX_BACKOFF = 3600.0
TIMEOUT = 15.0              # seconds a POST may take, answer included


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def next_try(now: float, attempts: int) -> float:
    """When an alert that failed `attempts` times before (this failure not counted) is tried again."""
    return now + min(MAX_BACKOFF, FIRST_BACKOFF * 2.0 ** min(attempts, 20))


class Outbox(Protocol):
    def due_alerts(self, now: float, limit: int) -> list[tuple[int, str, int]]: ...

    def alert_delivered(self, ids: list[int]) -> None: ...

    def alert_failed(self, retries: list[tuple[int, float]]) -> None: ...


async def deliver_due(outbox: Outbox, client: httpx.AsyncClient, url: str, secret: bytes,
                      clock: Callable[[], float]) -> int:
    """POST the alerts due now, one at a time; record each outcome. Returns how many were delivered."""
    due = outbox.due_alerts(clock(), BATCH)
    delivered: list[int] = []
    retries: list[tuple[int, float]] = []
    for alert_id, body, attempts in due:
        data = body.encode("utf-8")
        why = None
        try:
            answer = await client.post(url, content=data, timeout=TIMEOUT, follow_redirects=False, headers={
                "Content-Type": "application/json", SIGNATURE_HEADER: signature(secret, data)})
            if 200 <= answer.status_code < 300:
                delivered.append(alert_id)
            else:
                why = f"HTTP {answer.status_code}"
        except httpx.HTTPError as e:
            why = str(e) or type(e).__name__
        if why is not None:
            retries.append((alert_id, next_try(clock(), attempts)))
            if attempts == 0 or attempts % 10 == 0:
                log.warning("alert %d not delivered to the webhook (%s): tried again later", alert_id, why)
    if delivered:
        outbox.alert_delivered(delivered)
    if retries:
        outbox.alert_failed(retries)
    return len(delivered)
