"""The ``browser`` resolver: a real headless Chromium loads the page, runs its scripts, presses play, and the
media the player asks for is recorded. This is the source paper's sniffer done for pages whose audio address
exists only once scripts ran: assembled in JavaScript, returned by an API the player calls with a signature,
or served as an HLS stream.

When it runs (it is slow: a page costs a browser tab for seconds):
  * on every page of the hosts in ``browser.hosts``, after the static resolvers, adding to what they found;
  * on other pages only when the static resolvers found no audio and the page shows signs of a player
    (``browser.on_player_signs``, the strings of ``browser.player_signs``). Never on every page by default.

What a visit does: a fresh browser context (no cookies or cache from other pages), the page loaded from its
address, scripts run until the network is quiet, then the obvious play controls pressed: every audio and video
element is played, and buttons and links whose name, class, id, title or label says "play" (not links that lead
elsewhere) are clicked; then it waits for the network to be quiet again and plays what the clicks set up.

What is recorded: every request whose address has an audio extension (the one set in crawler/web/media.py),
every response whose Content-Type is audio, every HLS or DASH manifest, and media requests of no known kind
after a small ranged probe of their first bytes. The audio requests themselves are not let through (the
downloader fetches the file later), and neither are images, fonts or video: the browser fetches documents,
scripts, styles and API calls only. Each recorded address becomes an item whose identity is the request's:
the browser's User-Agent, the Referer it sent, and the context's cookies for that address. Segments and
variant playlists named by a recorded manifest are not items: the manifest is.

Evidence: with the worker keeping an archive, a visit records what the browser asked and was answered (the
API call that produced an address included), the media requests it was refused, the rendered DOM, a viewport
screenshot and a summary of the visit, all tied to the page (browsercapture.py); without one, none of that runs.

Scope: the page's frames may only load documents from the page's own host, so a script cannot take the browser
anywhere the crawl did not send it; a page on a public address may not make the browser request a literal
private or loopback address. Every connection the browser opens (WebSockets included) goes through the worker's
proxy (browserproxy.py), which resolves names itself and applies the worker's target policy after resolution.

Confinement: the browser runs with its sandbox as ``user`` (never root), and its memory is bounded: each
page's V8 heap at a quarter of ``max_memory_bytes``, the whole process tree's private memory at
``max_memory_bytes`` (watched every ``MEMORY_POLL`` seconds; the biggest renderer is killed, or the whole browser
when a renderer is not the culprit). A page whose renderer crashed (memory, or anything else) ends with what was
recorded, and the browser is replaced once its other pages finish.

Bounds: ``max_pages`` tabs at once per worker (waiting at most
``wait_timeout``), ``page_timeout`` per page, ``max_items`` and ``max_probes`` per page, the rendered document
read up to ``max_dom_bytes``; the browser is started again after ``restart_after`` pages, and at once when it
crashed or stopped answering. A page cut short by its deadline reports what was recorded by then; a browser
that fails twice in a row on one page makes the task go back to the master (ResolverUnavailable), so it is
retried, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urldefrag

from selectolax.lexbor import LexborHTMLParser

from crawler.archive import NoArchive
from crawler.extras import missing_extra
from crawler.http.targets import TargetPolicy
from crawler.items import AudioItem, RequestIdentity
from crawler.resolvers import pagemeta
from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    ResolverUnavailable,
    parse_section,
)
from crawler.resolvers.browsercapture import Capture
from crawler.http.egress import Egress, ProxiesUnavailable
from crawler.resolvers.browserproxy import BrowserProxy, HostRules
from crawler.resolvers.chromium import (
    DEFAULT_USER,
    FORBIDDEN_ARGS,
    BrowserStartError,
    BrowserUser,
    ChromiumProcess,
    find_executable,
    is_renderer,
    sweep_stale_profiles,
)
from crawler.web import media
from crawler.web.html import css
from crawler.web.links import extract_links
from crawler.web.page import FetchedPage
from crawler.web.urls import InvalidURL, host_of, host_port, resolve, resolve_link

log = logging.getLogger(__name__)

HLS_TYPES = frozenset({"application/vnd.apple.mpegurl", "application/x-mpegurl", "audio/x-mpegurl",
                       "audio/mpegurl"})
DASH_TYPES = frozenset({"application/dash+xml"})
# Resource types the browser never fetches for us: their bytes say nothing about where audio is.
BLOCKED_TYPES = frozenset({"image", "font", "manifest", "texttrack", "imageset", "ping", "cspviolationreport"})
# Extensions of video and stream segments: never fetched by the browser (a manifest names them; we keep that).
VIDEO_EXTENSIONS = frozenset({"mp4", "m4v", "webm", "mkv", "avi", "mov", "flv", "wmv", "ts", "m4s", "3gp"})
# Substrings (any case) that betray a player. Plain substrings, not regexes: this test runs on every page the
# static resolvers found nothing on, and one scan per string of the lowered page costs microseconds where a
# regex alternation costs milliseconds on a big page. Not "player" alone: "Player" is in titles and prose.
DEFAULT_PLAYER_SIGNS = (
    "<audio", "<video", ".m3u8", ".mpd", "hls.", "new audio(", 'class="player', 'id="player', "jwplayer",
    "audioplayer", "audio-player", "player.js", "player.min.js", "play-btn", "playbtn", "btn-play", "play-button",
    'aria-label="play', "howler", "wavesurfer", "soundmanager", "plyr",
)
MiB = 1024 * 1024
MEMORY_POLL = 0.25      # seconds between looks at the browser's memory while a page is open

# Runs in the page: plays media elements and clicks the controls that say "play". Returns how many it pressed.
_PRESS_PLAY = r"""
(limit) => {
  const word = /(^|[^a-z\u00c0-\uffff])(play|listen|播放|试听|▶|►)([^a-z]|$)/;
  const label = (el) => [el.getAttribute('aria-label'), el.getAttribute('title'), el.getAttribute('name'),
      el.getAttribute('data-action'), el.id, typeof el.className === 'string' ? el.className : '',
      (el.textContent || '').slice(0, 60), el.getAttribute('value')]
    .filter(Boolean).join(' ').replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase();
  let pressed = 0;
  for (const m of document.querySelectorAll('audio, video')) {
    try { m.muted = true; const p = m.play(); if (p && p.catch) p.catch(() => {}); pressed++; } catch (e) {}
  }
  if (limit <= 0) return pressed;
  const seen = new Set();
  const controls = document.querySelectorAll(
    'button, a, [role=button], input[type=button], [onclick], [class*=play i], [id*=play i], ' +
    '[aria-label*=play i], [title*=play i], [data-action*=play i]');
  let clicked = 0;
  for (const el of controls) {
    if (clicked >= limit) break;
    if (seen.has(el)) continue;
    seen.add(el);
    if (!word.test(label(el))) continue;
    if (el.tagName === 'A') {
      const href = (el.getAttribute('href') || '').trim().toLowerCase();
      if (href && !href.startsWith('#') && !href.startsWith('javascript:')) continue;  // a link, not a control
    }
    try { el.click(); clicked++; } catch (e) {}
  }
  return pressed + clicked;
}
"""


@dataclass(frozen=True)
class BrowserConfig:
    executable: str | None = None             # path or name on PATH; default: chromium, then google-chrome
    hosts: tuple[str, ...] = ()               # every page of these hosts (``*.example.org`` for subdomains)
    on_player_signs: bool = True              # also pages where nothing was found but a player shows
    player_signs: tuple[str, ...] = DEFAULT_PLAYER_SIGNS   # substrings, any case
    max_pages: int = 2                        # browser tabs at once in this worker
    page_timeout: float = 30.0                # seconds for one page, everything included
    wait_timeout: float = 120.0               # seconds a page waits for a free tab before it is given back
    settle: float = 0.5                       # seconds without network activity that count as "quiet"
    max_clicks: int = 5                       # play controls clicked per page
    max_items: int = 100
    max_probes: int = 20                      # media requests of unknown kind probed per page
    max_dom_bytes: int = 5 * 1024 * 1024
    restart_after: int = 200                  # pages per browser process before a fresh one
    user_agent: str | None = None             # default: the worker's
    args: tuple[str, ...] = ()                # extra Chromium switches (tests: --host-resolver-rules=...)
    start_timeout: float = 30.0
    user: str = DEFAULT_USER                  # the unprivileged account the browser runs as
    max_memory_bytes: int = 1024 * MiB        # the browser's process tree; a page's V8 heap gets a quarter
    # What a page's visit keeps in the worker's archive (browsercapture.py), when it keeps one: response bodies
    # up to this many bytes a page in all, and a response's body only when it is at most the second bound.
    archive_max_bytes: int = 8 * MiB
    archive_max_response_bytes: int = 2 * MiB
    archive_screenshot: bool = True           # a PNG of the tab's viewport beside the rendered DOM

    def __post_init__(self) -> None:
        for name in ("max_pages", "max_clicks", "max_items", "max_dom_bytes", "restart_after"):
            if getattr(self, name) < (0 if name == "max_clicks" else 1):
                raise ResolverConfigError(f"browser.{name}: must be at least {0 if name == 'max_clicks' else 1}")
        for name in ("page_timeout", "wait_timeout", "settle", "start_timeout"):
            if getattr(self, name) <= 0:
                raise ResolverConfigError(f"browser.{name}: must be positive")
        for name in ("max_probes", "archive_max_bytes", "archive_max_response_bytes"):
            if getattr(self, name) < 0:
                raise ResolverConfigError(f"browser.{name}: must not be negative")
        if self.max_memory_bytes < 256 * MiB:
            raise ResolverConfigError("browser.max_memory_bytes: must be at least 256 MiB (268435456)")
        if not self.user.strip():
            raise ResolverConfigError("browser.user: must name an unprivileged user")
        for i, sign in enumerate(self.player_signs):
            if not sign.strip():
                raise ResolverConfigError(f"browser.player_signs[{i}]: must not be empty")
        for i, arg in enumerate(self.args):
            if not arg.startswith("--") or arg.split("=", 1)[0] in FORBIDDEN_ARGS:
                raise ResolverConfigError(f"browser.args[{i}]: {arg!r} is not a switch the worker lets through")


# ------------------------------------------------------------------------------------------ pure decisions
def classify(url: str, content_type: str | None = None) -> str | None:
    """What a request or response is to us: 'audio', 'hls', 'dash', 'playlist' (m3u/pls of songs), or None."""
    ext = media.url_extension(url)
    ct = media.media_type(content_type)
    if ext == "m3u8" or ct in HLS_TYPES:
        return "hls"
    if ext == "mpd" or ct in DASH_TYPES:
        return "dash"
    if ext in media.PLAYLIST_EXTENSIONS or ct in media.PLAYLIST_TYPES:
        return "playlist"
    if ext in media.AUDIO_EXTENSIONS or media.is_audio_type(ct):
        return "audio"
    return None


def host_matches(host: str, patterns: tuple[str, ...]) -> bool:
    host = host.lower()
    for pattern in patterns:
        p = pattern.lower()
        if p.startswith("*."):
            if host == p[2:] or host.endswith(p[1:]):
                return True
        elif host == p:
            return True
    return False


def _literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def request_allowed(page_url: str, url: str, *, document: bool) -> bool:
    """The crawl's scope and address rules for one request the page makes.

    Documents (the page itself, frames, navigations) stay on the page's host. Any request to a literal private,
    loopback, link-local or reserved address is refused unless the page itself is on such an address.
    """
    host, page_host = host_of(url), host_of(page_url)
    if not host or not url[:8].lower().startswith(("http://", "https://")):
        return False
    if document and host != page_host:
        return False
    address = _literal_address(host)
    if address is not None and not address.is_global:
        page_address = _literal_address(page_host)
        return page_address is not None and not page_address.is_global
    return True


def manifest_uris(text: str, base: str) -> set[str]:
    """Every address a playlist or manifest names (segments, variants, keys, init sections), made absolute."""
    out: set[str] = set()

    def add(ref: str) -> None:
        try:
            out.add(resolve(base, ref, strict=False).partition("#")[0])
        except InvalidURL:   # a line no browser reads as an address: the others still count
            pass

    for raw in text.splitlines()[:100_000]:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            for m in re.finditer(r'URI="([^"]+)"', line):
                add(m.group(1))
        else:
            add(line)
    for m in re.finditer(r"<(?:BaseURL|SegmentURL[^>]*media=\")([^<\"]+)", text):
        add(m.group(1))
    return out


@dataclass
class Found:
    url: str
    kind: str                                  # audio | hls | dash | playlist | probe
    user_agent: str | None = None
    referer: str | None = None
    request_type: str = ""


@dataclass
class Recording:
    """What one page's network traffic showed, decided as events arrive; the I/O shell feeds it."""

    page_url: str
    max_items: int
    max_probes: int
    found: dict[str, Found] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)      # named by a manifest: parts, not items
    blocked: int = 0

    def add(self, url: str, kind: str, user_agent: str | None, referer: str | None, request_type: str) -> None:
        url = urldefrag(url).url
        known = self.found.get(url)
        if known is not None:
            if known.kind == "probe" and kind != "probe":
                known.kind = kind
            return
        limit = self.max_probes if kind == "probe" else self.max_items
        if sum(1 for f in self.found.values() if (f.kind == "probe") == (kind == "probe")) >= limit:
            return
        self.found[url] = Found(url, kind, user_agent, referer, request_type)

    def results(self) -> list[Found]:
        """Items to report: not a part of a recorded manifest, not a page of the crawl itself."""
        return [f for f in self.found.values() if f.url not in self.listed and f.kind != "probe"]

    def probes(self) -> list[Found]:
        return [f for f in self.found.values() if f.kind == "probe" and f.url not in self.listed]


class Traffic:
    """Requests in flight in one tab, and when the network last did anything: "quiet" is what a player's page
    reaches once it has set up what it plays. Fed by the tab's request events."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or asyncio.get_running_loop().time
        self.inflight = 0
        self.last = self._clock()
        self._changed = asyncio.Event()

    def started(self, _request: Any = None) -> None:
        self.inflight += 1
        self._touch()

    def ended(self, _request: Any = None) -> None:
        self.inflight = max(0, self.inflight - 1)
        self._touch()

    def _touch(self) -> None:
        self.last = self._clock()
        self._changed.set()

    def acted(self) -> None:
        """The page was just acted on (a click): what it starts reaches us as events a little later, so the
        quiet spell is counted from now, not from the last request seen before the action."""
        self._touch()

    async def quiet(self, idle: float) -> None:
        """Until nothing started or ended for ``idle`` seconds with nothing in flight, or for four times that
        with a request left open (a long poll, a stream): the caller's deadline bounds the whole wait."""
        while True:
            since = self._clock() - self.last
            need = idle if self.inflight == 0 else max(4 * idle, 2.0)
            if since >= need:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), need - since)


def page_shows_player(body: bytes, signs: tuple[bytes, ...]) -> bool:
    """Whether any sign (lower case) occurs in the page, in any case."""
    if not signs:
        return False
    lower = body.lower()
    return any(sign in lower for sign in signs)


# ------------------------------------------------------------------------------------------ the resolver
class BrowserResolver(Resolver):
    name = "browser"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if (problem := missing_extra("browser", "the browser resolver")) is not None:
            raise ResolverConfigError(problem)
        self.settings = parse_section(BrowserConfig, self.name, config)
        try:    # a missing browser is a config error at start-up, not a surprise on the first page
            self.executable = find_executable(self.settings.executable)
        except BrowserStartError as exc:
            raise ResolverConfigError(f"browser.executable: {exc}") from None
        try:    # a missing or privileged user too: the browser never runs as root
            self.user = BrowserUser.lookup(self.settings.user)
        except BrowserStartError as exc:
            raise ResolverConfigError(f"browser.user: {exc}") from None
        try:
            self._rules = HostRules.from_args(self.settings.args)
        except ValueError as exc:
            raise ResolverConfigError(f"browser.args: {exc}") from None
        self._targets = TargetPolicy()             # the worker's, from the first page's context
        self._egress: Egress | None = None         # the worker's proxies, likewise
        self._proxy: BrowserProxy | None = None
        self._watches: dict[int, asyncio.Task[None]] = {}   # browser pid -> its memory watch
        self._signs = tuple(sign.lower().encode() for sign in self.settings.player_signs)
        self._tabs: asyncio.Semaphore | None = None
        self._playwright: Any = None
        self._browser: ChromiumProcess | None = None
        self._starting: asyncio.Lock | None = None
        self._retired: list[ChromiumProcess] = []   # recycled, closing once their open pages finish
        self._launched = 0
        self._open: dict[int, int] = {}            # browser pid -> pages open in it
        self.stats = {"pages": 0, "restarts": 0, "timeouts": 0, "items": 0, "tabs": 0, "peak_tabs": 0,
                      "crashes": 0, "memory_kills": 0}

    # -- the worker's questions -------------------------------------------------------------------
    def claims(self, url: str) -> bool:
        return False        # never instead of the static resolvers: after them (runs_after)

    def runs_after(self, url: str, page: FetchedPage | None, found: Resolution | None) -> bool:
        if page is None or page.status >= 400 or not page.is_html():
            return False
        host = host_of(page.final_url).strip("[]")
        if host_matches(host, self.settings.hosts):
            return True
        if not self.settings.on_player_signs or (found is not None and found.items):
            return False
        return page_shows_player(page.body, self._signs)

    async def resolve(self, url: str, page: FetchedPage | None, ctx: ResolveContext) -> Resolution:
        page_url = page.final_url if page is not None else url
        if ctx.targets is not None:
            self._targets = ctx.targets
        self._egress = getattr(ctx.http, "egress", None)     # a Stack's; a plain client has none
        if self._tabs is None:
            self._tabs = asyncio.Semaphore(self.settings.max_pages)
            self._starting = asyncio.Lock()
        try:
            await asyncio.wait_for(self._tabs.acquire(), self.settings.wait_timeout)
        except TimeoutError:
            raise ResolverUnavailable(f"no browser tab free within {self.settings.wait_timeout:.0f} s") from None
        self.stats["tabs"] += 1
        self.stats["peak_tabs"] = max(self.stats["peak_tabs"], self.stats["tabs"])
        try:
            for attempt in (1, 2):
                browser = await self._instance()
                try:
                    return await self._visit(browser, url, page_url, ctx, page)
                except _BrowserBroken as exc:
                    log.warning("browser failed on %s (attempt %d): %s; starting a new one", url, attempt, exc)
                    await self._discard(browser)
            raise ResolverUnavailable("the browser failed twice on this page")
        finally:
            self.stats["tabs"] -= 1
            self._tabs.release()

    async def aclose(self) -> None:
        if self.stats["pages"]:
            log.info("browser resolver: %s", ", ".join(f"{k} {v}" for k, v in self.stats.items() if k != "tabs"))
        for browser in self._retired:
            await self._close(browser)
        self._retired.clear()
        if self._browser is not None:
            await self._close(self._browser)
            self._browser = None
        if self._proxy is not None:
            await self._proxy.aclose()
            self._proxy = None
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None

    # -- browser lifecycle ------------------------------------------------------------------------
    async def _instance(self) -> ChromiumProcess:
        assert self._starting is not None
        async with self._starting:
            current = self._browser
            if (current is not None and current.alive() and not current.worn
                    and current.pages < self.settings.restart_after):
                current.pages += 1
                self._open[current.pid] = self._open.get(current.pid, 0) + 1
                return current
            if current is not None:
                self._browser = None
                if current.alive():
                    await self._retire(current)
                else:
                    await self._discard(current)
            if self._launched == 0:
                swept = await asyncio.to_thread(sweep_stale_profiles, user=self.user)
                if swept:
                    log.info("browser: removed %d profile directories of browsers that died with a worker", swept)
            if self._playwright is None:
                from playwright.async_api import async_playwright  # only workers that enable the browser

                self._playwright = await async_playwright().start()
            if self._proxy is None:
                proxy = BrowserProxy(lambda: self._targets, self._rules, egress=lambda: self._egress)
                await proxy.start()
                self._proxy = proxy
            try:
                fresh = await ChromiumProcess.start(
                    self._playwright, self.executable, self.settings.args, user=self.user,
                    proxy_port=self._proxy.port, js_heap_mib=self.settings.max_memory_bytes // 4 // MiB, timeout=self.settings.start_timeout)
            except BrowserStartError as exc:
                # The driver may be what broke: the next attempt starts it afresh too.
                with contextlib.suppress(Exception):
                    await self._playwright.stop()
                self._playwright = None
                raise ResolverUnavailable(str(exc)) from None
            self.stats["restarts"] += self._launched > 0
            self._launched += 1
            self._browser = fresh
            fresh.pages = 1
            self._open[fresh.pid] = 1
            self._watches[fresh.pid] = asyncio.create_task(self._watch(fresh))
            return fresh

    async def _close(self, browser: ChromiumProcess, timeout: float = 5.0) -> None:
        watch = self._watches.pop(browser.pid, None)
        if watch is not None:
            watch.cancel()
        await browser.close(timeout)

    async def _watch(self, browser: ChromiumProcess) -> None:
        """The browser's memory bound: while a page is open, its tree's private memory is looked at every
        MEMORY_POLL seconds; past ``max_memory_bytes`` the biggest renderer is killed (its page crashes and
        ends; the browser is replaced), or the whole browser when the biggest process is not a renderer."""
        limit = self.settings.max_memory_bytes
        while not browser.closed:
            await asyncio.sleep(MEMORY_POLL)
            if not self._open.get(browser.pid):
                continue
            used = await asyncio.to_thread(browser.memory)
            total = sum(used.values())
            if total <= limit:
                continue
            self.stats["memory_kills"] += 1
            browser.worn = True
            pid = max(used, key=lambda p: used[p])
            if pid != browser.pid and await asyncio.to_thread(is_renderer, pid):
                log.warning("browser: %d MiB in use, over browser.max_memory_bytes (%d MiB): a renderer killed",
                            total // MiB, limit // MiB)
                await asyncio.to_thread(browser.kill_process, pid)
            else:
                log.warning("browser: %d MiB in use, over browser.max_memory_bytes (%d MiB): the browser killed",
                            total // MiB, limit // MiB)
                await asyncio.to_thread(browser.kill_process, browser.pid)
                return

    async def _retire(self, browser: ChromiumProcess) -> None:
        # Recycled: pages still open in it finish first; the last one closes it (_done).
        if self._open.get(browser.pid, 0) == 0:
            self._open.pop(browser.pid, None)
            await self._close(browser)
        else:
            self._retired.append(browser)

    async def _done(self, browser: ChromiumProcess) -> None:
        left = self._open.get(browser.pid, 1) - 1
        self._open[browser.pid] = left
        if left <= 0 and browser is not self._browser:
            self._open.pop(browser.pid, None)
            self._retired = [b for b in self._retired if b is not browser]
            await self._close(browser)

    async def _discard(self, browser: ChromiumProcess) -> None:
        if self._browser is browser:
            self._browser = None
        self._open.pop(browser.pid, None)
        self._retired = [b for b in self._retired if b is not browser]
        await self._close(browser, timeout=2.0)

    # -- one page ---------------------------------------------------------------------------------
    async def _visit(self, browser: ChromiumProcess, url: str, page_url: str, ctx: ResolveContext,
                     page: FetchedPage | None) -> Resolution:
        from playwright.async_api import Error as PlaywrightError

        s = self.settings
        rec = Recording(page_url, s.max_items, s.max_probes)
        pending: set[asyncio.Task[None]] = set()
        html = ""
        cookies: dict[str, list[tuple[str, str]]] = {}
        user_agent = s.user_agent or ctx.user_agent_for(url)
        self.stats["pages"] += 1
        # The visit's evidence, only for a worker that keeps an archive: without one no body is read for it
        # and no screenshot taken.
        capture = None if isinstance(ctx.archive, NoArchive) else Capture(
            ctx.archive, page_url, max_bytes=s.archive_max_bytes, max_body_bytes=s.archive_max_response_bytes,
            screenshot=s.archive_screenshot, clock=ctx.clock, proxy_mark=self._proxy.mark if self._proxy else "")
        visit_started = ctx.clock()
        outcome = "complete"
        try:
            context = await asyncio.wait_for(
                browser.browser.new_context(user_agent=user_agent, service_workers="block", accept_downloads=False),
                s.start_timeout)
        except (PlaywrightError, TimeoutError) as exc:
            await self._done(browser)
            raise _BrowserBroken(f"new context: {exc}"[:300]) from None
        broken: str | None = None
        try:
            tab = await context.new_page()
            deadline = asyncio.timeout(s.page_timeout)
            crashed = asyncio.Event()

            def on_crash(_tab: Any) -> None:
                # Nothing awaited in the tab answers any more (a quiet wait would last until the deadline).
                crashed.set()
                deadline.reschedule(asyncio.get_running_loop().time())

            tab.on("crash", on_crash)
            traffic = Traffic()
            tab.on("request", traffic.started)
            tab.on("requestfinished", traffic.ended)
            tab.on("requestfailed", traffic.ended)
            if capture is not None:
                tab.on("requestfailed", capture.on_failed)

            async def route(route: Any, request: Any) -> None:
                await self._route(rec, page_url, route, request, capture)

            def on_response(response: Any) -> None:
                task = asyncio.ensure_future(self._response(rec, response))
                pending.add(task)
                task.add_done_callback(pending.discard)
                if capture is not None:
                    capture.on_response(response)

            await context.route("**/*", route)
            tab.on("response", on_response)
            try:
                async with deadline:
                    await tab.goto(urldefrag(page_url).url, wait_until="load")
                    await traffic.quiet(s.settle)
                    if await tab.evaluate(_PRESS_PLAY, s.max_clicks):
                        traffic.acted()
                        await traffic.quiet(s.settle)
                        await tab.evaluate(_PRESS_PLAY, 0)    # what the clicks set up
                        traffic.acted()
                        await traffic.quiet(s.settle)
                    if pending:
                        await asyncio.wait(set(pending))
                    if capture is not None:     # bodies still arriving (a long poll) are kept without them
                        await capture.settle(max(s.settle, 1.0))
                    html = await tab.content()
                    for f in [*rec.results()[: s.max_items], *rec.probes()]:
                        cookies[f.url] = [(c["name"], c["value"]) for c in await context.cookies(f.url)]
                    if capture is not None:
                        ends = deadline.when()
                        await capture.screenshot(tab, s.page_timeout if ends is None
                                                 else ends - asyncio.get_running_loop().time())
            except (TimeoutError, PlaywrightError) as exc:
                if crashed.is_set() and browser.alive():
                    # Its renderer died (over the memory bound, or a crash the page caused): the page ends here
                    # with what it recorded, and a browser that lost a renderer is not trusted with more pages.
                    self.stats["crashes"] += 1
                    browser.worn = True
                    outcome = "cut: the renderer crashed"
                    log.info("browser: %s: its renderer crashed; the browser is replaced", url)
                elif isinstance(exc, TimeoutError):
                    self.stats["timeouts"] += 1
                    outcome = f"cut: its {s.page_timeout:g} s deadline"
                    log.info("browser: %s hit its %.0f s deadline; keeping what it recorded", url, s.page_timeout)
                elif not browser.alive():
                    broken = f"{exc}"[:300]
                    outcome = "cut: the browser failed"
                else:
                    outcome = "cut: " + str(exc).splitlines()[0][:200]
                    log.info("browser: %s: %s", url, str(exc).splitlines()[0][:200])
        finally:
            for task in pending:
                task.cancel()
            if capture is not None:
                await capture.stop()
            try:
                await asyncio.wait_for(context.close(), 10)
            except (PlaywrightError, TimeoutError) as exc:
                broken = broken or f"the browser did not close a tab: {exc or 'timeout'}"
            await self._done(browser)
        rendered = html
        if broken is not None:
            if capture is not None:
                await self._archive_visit(capture, browser, rendered, [], visit_started, outcome, user_agent)
            raise _BrowserBroken(broken)
        if not html and page is not None:
            html = page.text()     # cut short before the page was read: what the server sent still says something
        resolution = await self._resolution(rec, url, page_url, html, cookies, ctx)
        if capture is not None:
            found = [(str(i.extra.get("format", "audio")), i.url) for i in resolution.items]
            await self._archive_visit(capture, browser, rendered, found, visit_started, outcome, user_agent)
        return resolution

    async def _archive_visit(self, capture: Capture, browser: ChromiumProcess, dom: str,
                             found: list[tuple[str, str]], started: float, outcome: str, user_agent: str) -> None:
        version = ""
        with contextlib.suppress(Exception):     # a dead browser has no version to tell
            version = str(browser.browser.version)
        # The page's size is the site's choice: a big DOM is encoded off the loop.
        block = (dom.encode("utf-8", "replace") if len(dom) < 262144
                 else await asyncio.to_thread(dom.encode, "utf-8", "replace"))
        capture.finish(dom=block[: self.settings.max_dom_bytes], dom_cut=len(block) > self.settings.max_dom_bytes,
                       found=found, started=started, outcome=outcome, browser_version=version, user_agent=user_agent)

    async def _route(self, rec: Recording, page_url: str, route: Any, request: Any,
                     capture: Capture | None = None) -> None:
        url = request.url
        rtype = request.resource_type
        document = rtype in ("document", "subframe") or request.is_navigation_request()
        try:
            if not request_allowed(page_url, url, document=document):
                rec.blocked += 1
                if capture is not None:
                    capture.out_of_scope(request)
                await route.abort("blockedbyclient")
                return
            if document:
                await route.continue_()
                return
            kind = classify(url)
            headers = request.headers
            if kind in ("audio", "playlist") or (kind is None and rtype == "media"):
                # The address is what we want; its bytes are the downloader's business.
                known = len(rec.found)
                rec.add(url, kind or "probe", headers.get("user-agent"), headers.get("referer"), rtype)
                if capture is not None and len(rec.found) > known:    # once an address, within max_items
                    capture.not_fetched(request, kind or "probe")
                await route.abort("blockedbyclient")
                return
            if rtype in BLOCKED_TYPES or media.url_extension(url) in VIDEO_EXTENSIONS:
                await route.abort("blockedbyclient")
                return
            if kind in ("hls", "dash"):
                rec.add(url, kind, headers.get("user-agent"), headers.get("referer"), rtype)
            await route.continue_()
        except Exception as exc:   # the tab went away under us: nothing to route any more
            log.debug("browser: route %s: %s", url[:200], exc)

    async def _response(self, rec: Recording, response: Any) -> None:
        try:
            if response.status >= 400 or response.request.resource_type in ("document", "subframe"):
                return
            headers = response.headers     # as received, minus cookies: no round trip to the browser
            ctype = headers.get("content-type", "")
            url = response.url
            kind = classify(url, ctype)
            request_headers = response.request.headers
            if kind is None:
                mt = media.media_type(ctype)
                if mt in ("application/octet-stream", "binary/octet-stream", "") or media.maybe_audio_type(mt):
                    kind = "probe"
                else:
                    return
            rec.add(url, kind, request_headers.get("user-agent"), request_headers.get("referer"),
                    response.request.resource_type)
            if kind in ("hls", "dash", "playlist"):
                size = headers.get("content-length", "")
                if size.isdigit() and int(size) > 4 * 1024 * 1024:
                    return
                body = await response.body()
                if len(body) <= 4 * 1024 * 1024:
                    text = body.decode("utf-8", "replace")
                    found = rec.found.get(urldefrag(url).url)
                    if found is not None and kind == "hls" and "#EXT-X-" not in text and "#EXTINF" in text:
                        found.kind = "playlist"    # an m3u8 list of songs, not a stream
                    # A big manifest is read off the loop: its size is the site's choice, up to the cap.
                    rec.listed |= (manifest_uris(text, url) if len(text) < 65536
                                   else await asyncio.to_thread(manifest_uris, text, url))
        except Exception as exc:   # the page closed while we read: the recording keeps what it has
            log.debug("browser: response %s: %s", getattr(response, "url", "?")[:200], exc)

    async def _resolution(self, rec: Recording, url: str, page_url: str, html: str,
                          cookies: dict[str, list[tuple[str, str]]], ctx: ResolveContext) -> Resolution:
        for probe in rec.probes():
            kind = await self._probe(probe, cookies.get(probe.url, []), ctx)
            if kind is not None:
                probe.kind = kind
        meta, element_meta, links = await asyncio.to_thread(self._rendered, html, page_url)
        # The proxy the page's own connections went through: a signed address the page's scripts obtained goes
        # out there too (RequestIdentity.exit), as the worker pins what other resolvers find.
        origin = host_port(page_url)
        exit = self._proxy.exit_of(*origin) if self._proxy is not None and origin is not None else None
        items: list[AudioItem] = []
        for f in rec.results():
            if f.kind == "playlist":
                links.append(f.url)      # a list of songs: the crawl fetches it, the generic resolver reads it
                continue
            headers: tuple[tuple[str, str], ...] = (("Referer", f.referer),) if f.referer else ()
            identity = RequestIdentity(user_agent=f.user_agent, headers=headers,
                                       cookies=tuple(cookies.get(f.url, ())), exit=exit)
            extra: dict[str, Any] = {"found_in": "browser", "request_type": f.request_type}
            if f.kind in ("hls", "dash"):
                extra["format"] = f.kind
            full = pagemeta.fill(element_meta.get(f.url, {}), meta)
            items.append(AudioItem(url=f.url, page=url, resolver=self.name, identity=identity, extra=extra, **full))
        self.stats["items"] += len(items)
        return Resolution(items=items[: self.settings.max_items], links=links)

    async def _probe(self, f: Found, cookies: list[tuple[str, str]], ctx: ResolveContext) -> str | None:
        """A media request of no known kind: its Content-Type, else its first bytes, decide."""
        headers = RequestIdentity(user_agent=f.user_agent, cookies=tuple(cookies),
                                  headers=(("Referer", f.referer),) if f.referer else ()).request_headers()
        headers["Range"] = "bytes=0-8191"
        try:
            async with ctx.http.client.stream("GET", f.url, headers=headers) as response:
                if response.status_code not in (200, 206):
                    return None
                kind = classify(f.url, response.headers.get("content-type"))
                if kind is not None:
                    return kind
                head = b""
                async for chunk in response.aiter_bytes():
                    head += chunk
                    if len(head) >= 8192:
                        break
        except ProxiesUnavailable:   # no proxy to ask through: the page is handed back, not its candidate lost
            raise
        except Exception as exc:   # any network trouble: the candidate is simply not audio we can show
            log.debug("browser: probe %s: %s", f.url[:200], exc)
            return None
        return "audio" if media.sniff_audio(head[:8192]) else None

    def _rendered(self, html: str, page_url: str) -> tuple[pagemeta.Meta, dict[str, pagemeta.Meta], list[str]]:
        """From the page as its scripts left it: its metadata, per media address the metadata around its
        element, and its links (a song list built by scripts is crawled too)."""
        if not html or len(html) > self.settings.max_dom_bytes:
            return {}, {}, []
        tree = LexborHTMLParser(html)
        by_url: dict[str, pagemeta.Meta] = {}
        for node in css(tree, "audio[src], video[src], source[src], [data-src], [data-audio], [data-url]"):
            attrs = node.attributes
            for name in ("src", "data-src", "data-audio", "data-url"):
                value = attrs.get(name)
                if value:
                    absolute = resolve_link(page_url, value.strip())
                    if absolute is not None:
                        by_url.setdefault(urldefrag(absolute).url, pagemeta.element_meta(node))
        return pagemeta.page_meta(tree), by_url, extract_links(tree, page_url)


class _BrowserBroken(Exception):
    """The browser crashed or stopped answering: not the page's fault."""
