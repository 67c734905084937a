"""The browser resolver's view, kept as evidence (crawler/archive/): what the browser asked and was answered while
it resolved a page, the page as its scripts left it, and what the tab showed.

For one visit, with role ``browser`` and the visited page as each record's page:

  * every response the browser read (the document, scripts, styles, API calls: the one whose answer held the
    audio address too, manifests) as an Exchange: the request's method, headers as sent and post data, the
    response's status, headers as received and body as Playwright decoded it. Bodies are bounded: one response
    at most ``max_body_bytes`` (a response declared larger is not read at all), the page's bodies together at
    most ``max_bytes``; a body kept in part or not at all is marked WARC-Truncated "length". A body still
    arriving when the visit ends is kept as far as it was read (nothing, with Playwright) and marked "time";
  * every request that went unanswered as a ``metadata`` record saying why, with the request as the page made
    it: media the browser was not let fetch (its bytes are the downloader's), requests the worker's proxy
    refused (its own answers carry its mark, browserproxy.py: they are not a site's), and requests that failed;
  * the rendered DOM as a ``resource`` record (text/html) at ``urn:dom:<page>``, and a viewport screenshot
    (image/png) at ``urn:view:<page>``, the target Browsertrix gives its page screenshots (its extracted text
    is ``urn:text:<page>``, its per-page summaries ``urn:pageinfo:<page>``); both refer to the browser's own
    fetch of the document (or its first exchange);
  * a ``metadata`` record of the visit at the page's address, referring to the DOM record: the browser's
    version and User-Agent, when the visit started and ended, how it ended (cut by its deadline, say), the
    audio addresses it found, and what was kept.

None of this runs when the worker keeps no archive (the resolver creates no Capture: no body is read, no
screenshot taken). None of it lengthens a visit past its deadline: bodies are read while the page settles and
whatever is unread at the end is recorded without its body; the screenshot gets what is left of the deadline,
at most ``SCREENSHOT_TIMEOUT``. A capture that fails is logged at DEBUG and costs nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from crawler.archive import Archive, Exchange, Headers

log = logging.getLogger(__name__)

ROLE = "browser"
DOM_TARGET = "urn:dom:"          # no common name for a rendered DOM; ``urn:`` like the other browser records
VIEW_TARGET = "urn:view:"        # Browsertrix's page screenshots
SCREENSHOT_TIMEOUT = 5.0         # seconds a screenshot may take, within what is left of the page's deadline
SCREENSHOT_MARGIN = 0.25         # seconds of the deadline left over for reading what the screenshot took
SCREENSHOT_MAX_BYTES = 8 * 1024 * 1024   # a viewport's PNG is well under this; a bigger one is not kept
# Exchanges and unanswered requests recorded a page: past this a page's requests are only counted ("dropped"),
# so a script that makes thousands of small requests cannot fill the archive with their heads.
MAX_RECORDS = 2000
PROXY_MARK = "x-crawler-proxy"


# ------------------------------------------------------------------------------------------ pure decisions
def body_allowance(declared: int | None, left: int, per_response: int) -> int | None:
    """How many body bytes of one response to keep: None when the body is not to be read at all (declared over
    the per-response bound, or nothing left of the page's bound); else the bound the read body is cut to."""
    if declared is not None and declared > per_response:
        return None
    limit = min(per_response, left)
    if limit <= 0 and declared != 0:
        return None
    return max(0, limit if declared is None else min(declared, limit))


def kept_body(body: bytes, allowance: int) -> tuple[bytes, str]:
    """The body cut to its allowance, and its WARC-Truncated value ("" when whole)."""
    if len(body) <= allowance:
        return body, ""
    return body[:allowance], "length"


def declared_length(headers: Headers) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            text = value.strip()
            return int(text) if text.isdigit() and len(text) < 19 else None
    return None


def as_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    # Header values are Latin-1 on the wire; Playwright hands them as str (a value outside Latin-1 is a UTF-8
    # byte sequence the browser decoded): encode back the same way.
    return tuple((name.encode("latin-1", "replace"), _wire(value)) for name, value in pairs)


def _wire(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def warc_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1_000_000):06d}Z"


def visit_fields(*, browser_version: str, user_agent: str, started: float, ended: float, outcome: str,
                 found: Sequence[tuple[str, str]], kept: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The visit's metadata record: application/warc-fields, a name repeated per found address."""
    fields: list[tuple[str, str]] = [
        ("browser", browser_version), ("user-agent", user_agent),
        ("visit-started", warc_time(started)), ("visit-ended", warc_time(ended)), ("outcome", outcome),
    ]
    fields += [("found", f"{kind} {url}") for kind, url in found]
    fields += list(kept.items())
    # warc-fields are one line each: no value may carry a line break.
    return tuple((name, " ".join(value.split())) for name, value in fields)


# ------------------------------------------------------------------------------------------ the I/O shell
class Capture:
    """One visit's records: the resolver feeds it the tab's responses and refused media requests, lets it read
    bodies while the page settles, takes the screenshot, and ends it with ``stop`` and ``finish``."""

    def __init__(self, archive: Archive, page_url: str, *, max_bytes: int, max_body_bytes: int,
                 screenshot: bool, clock: Callable[[], float], proxy_mark: str = "") -> None:
        self.archive = archive
        self.proxy_mark = proxy_mark
        self.page_url = page_url
        self.max_body_bytes = max_body_bytes
        self.left = max_bytes                      # of the page's bodies, reserved before each read
        self.take_screenshot = screenshot
        self.clock = clock
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.first_id = ""
        self.document_id = ""                      # the browser's fetch of the page itself
        self.png: bytes | None = None
        self.records = 0                           # reserved against MAX_RECORDS
        self.counts = {"exchanges": 0, "body-bytes": 0, "truncated": 0, "not-fetched": 0, "dropped": 0,
                       "failed": 0}
        self.notes: dict[str, str] = {}

    # -- while the page is open ---------------------------------------------------------------------------
    def on_response(self, response: Any) -> None:
        if self.closed or not self._room():
            return
        task = asyncio.ensure_future(self._record(response))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def not_fetched(self, request: Any, kind: str) -> None:
        """A media request the browser was refused: its bytes are the downloader's."""
        if self._room():
            self._unanswered(request, "no: its bytes are left to the downloader", (("kind", kind),))

    def out_of_scope(self, request: Any) -> None:
        """A request the crawl's scope or address rules refused (a navigation to another host, say)."""
        if self._room():
            self._unanswered(request, "no: outside the crawl's scope or address rules")

    def on_failed(self, request: Any) -> None:
        """A request that got no answer: what the browser said of it (the ones we refused are recorded apart)."""
        try:
            failure = str(request.failure or "")
        except Exception:   # the tab went away under us
            return
        if self.closed or "ERR_BLOCKED_BY_CLIENT" in failure or not self._room():
            return
        self._unanswered(request, f"no: {failure or 'failed'}")

    def _room(self) -> bool:
        if self.records >= MAX_RECORDS:
            self.counts["dropped"] += 1
            return False
        self.records += 1
        return True

    def _unanswered(self, request: Any, why: str, more: tuple[tuple[str, str], ...] = ()) -> None:
        """A request and why it went unanswered, with the request as the page made it."""
        try:
            fields = [("fetched", why), *more, ("method", request.method), ("request-type", request.resource_type)]
            fields += [("request-header", f"{name}: {value}") for name, value in request.headers.items()]
            self.archive.metadata(request.url, tuple((n, " ".join(v.split())) for n, v in fields),
                                  refers_to=self.document_id, page=self.page_url, role=ROLE, now=self.clock())
            self.counts["not-fetched"] += 1
        except Exception as exc:   # a capture that fails loses nothing else
            self.counts["failed"] += 1
            log.debug("browser archive: request %s: %s", str(getattr(request, "url", "?"))[:200], exc)

    async def settle(self, timeout: float) -> None:
        """Let the bodies being read finish, for at most ``timeout`` seconds."""
        if self.tasks and timeout > 0:
            await asyncio.wait(set(self.tasks), timeout=timeout)

    async def screenshot(self, tab: Any, time_left: float) -> None:
        if not self.take_screenshot:
            return
        wait = min(SCREENSHOT_TIMEOUT, time_left - SCREENSHOT_MARGIN)
        if wait <= 0:
            self.notes["screenshot"] = "none: no time left"
            return
        try:
            png = await asyncio.wait_for(
                tab.screenshot(type="png", full_page=False, timeout=wait * 1000), wait + SCREENSHOT_MARGIN / 2)
        except Exception as exc:   # a tab that cannot be drawn still has its other records
            self.notes["screenshot"] = "none: " + (str(exc).splitlines() or ["timeout"])[0][:200]
            log.debug("browser archive: screenshot of %s: %s", self.page_url[:200], exc)
            return
        if len(png) > SCREENSHOT_MAX_BYTES:
            self.notes["screenshot"] = f"none: {len(png)} bytes"
            return
        self.png = png

    async def stop(self) -> None:
        """The visit is over: no more responses; bodies still unread are recorded without them."""
        self.closed = True
        tasks = set(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- after it --------------------------------------------------------------------------------------------
    def finish(self, *, dom: bytes, dom_cut: bool, found: Sequence[tuple[str, str]], started: float, outcome: str,
               browser_version: str, user_agent: str) -> None:
        """The rendered DOM, the screenshot and the visit's metadata record; each written or not on its own."""
        now = self.clock()
        anchor = self.document_id or self.first_id
        dom_id = ""
        if dom:
            dom_id = self._keep("DOM", lambda: self.archive.resource(
                DOM_TARGET + self.page_url, "text/html; charset=utf-8", dom, refers_to=anchor, page=self.page_url,
                role=ROLE, now=now))
            self.notes["dom"] = ("cut at browser.max_dom_bytes" if dom_cut else "whole") if dom_id else "not kept"
        else:
            self.notes["dom"] = "none"
        png = self.png
        if png is not None:
            shot_id = self._keep("screenshot", lambda: self.archive.resource(
                VIEW_TARGET + self.page_url, "image/png", png, refers_to=dom_id or anchor, page=self.page_url,
                role=ROLE, now=now))
            self.notes["screenshot"] = "viewport" if shot_id else "not kept"
        self.notes.setdefault("screenshot", "none" if self.take_screenshot else "off")
        kept = {name: str(value) for name, value in self.counts.items()}
        kept.update(self.notes)
        fields = visit_fields(browser_version=browser_version, user_agent=user_agent, started=started, ended=now,
                              outcome=outcome, found=found, kept=kept)
        self._keep("visit", lambda: self.archive.metadata(self.page_url, fields, refers_to=dom_id or anchor,
                                                          page=self.page_url, role=ROLE, now=now))

    def _keep(self, what: str, write: Callable[[], str]) -> str:
        try:
            return write()
        except Exception as exc:   # the resolution and the other records stand without this one
            self.counts["failed"] += 1
            log.debug("browser archive: %s of %s: %s", what, self.page_url[:200], exc)
            return ""

    # -- one response ----------------------------------------------------------------------------------------
    async def _record(self, response: Any) -> None:
        request = response.request
        status = int(response.status)
        if self.proxy_mark and response.headers.get(PROXY_MARK) == self.proxy_mark:
            self._unanswered(request, f"no: the worker's proxy answered {status} (refused, or no connection)")
            return
        started = self._started(request)
        # What is known at once (Playwright's lower-cased view, without cookies), bettered by the exact lists.
        sent = as_headers(request.headers.items())
        received = as_headers(response.headers.items())
        body, truncated = b"", ""
        try:
            sent = as_headers((h["name"], h["value"]) for h in await request.headers_array())
            received = as_headers((h["name"], h["value"]) for h in await response.headers_array())
            if not 300 <= status < 400:      # a redirect has no body Playwright can give
                body, truncated = await self._body(request, response, received)
        except asyncio.CancelledError:
            truncated = "time"      # the visit ended first: the exchange is kept without what was unread
            self._write(request, status, sent, received, body, truncated, started)
            raise
        except Exception as exc:   # the tab went away under us
            log.debug("browser archive: response %s: %s", str(getattr(response, "url", "?"))[:200], exc)
            truncated = truncated or "disconnect"
        self._write(request, status, sent, received, body, truncated, started)

    async def _body(self, request: Any, response: Any, received: Headers) -> tuple[bytes, str]:
        declared = declared_length(received)
        if declared is None:
            with contextlib.suppress(Exception):     # a chunked answer: its size once it has all arrived
                declared = int((await request.sizes())["responseBodySize"])
        allowance = body_allowance(declared, self.left, self.max_body_bytes)
        if allowance is None:
            return b"", "length"
        self.left -= allowance
        body = b""
        try:
            body = await response.body()
        finally:
            kept, truncated = kept_body(body, allowance)
            self.left += allowance - len(kept)
        return kept, truncated

    def _started(self, request: Any) -> float:
        with contextlib.suppress(Exception):
            start = float(request.timing["startTime"])
            if start > 0:
                return start / 1000          # milliseconds since the epoch
        return self.clock()

    def _write(self, request: Any, status: int, sent: Headers, received: Headers, body: bytes, truncated: str,
               started: float) -> None:
        try:
            posted = request.post_data_buffer or b""
            if len(posted) > self.max_body_bytes:
                posted, truncated = posted[: self.max_body_bytes], truncated or "length"
            record_id = self.archive.exchange(Exchange(
                role=ROLE, method=request.method, url=request.url, request_headers=sent, status=status,
                response_headers=received, body=body, started=started, page=self.page_url, request_body=posted,
                truncated=truncated))
        except Exception as exc:   # a capture that fails loses nothing else
            self.counts["failed"] += 1
            log.debug("browser archive: exchange %s: %s", str(getattr(request, "url", "?"))[:200], exc)
            return
        self.counts["exchanges"] += 1
        self.counts["body-bytes"] += len(body)
        self.counts["truncated"] += truncated != ""
        self.first_id = self.first_id or record_id
        if not self.document_id and request.resource_type == "document" and 200 <= status < 300:
            self.document_id = record_id
