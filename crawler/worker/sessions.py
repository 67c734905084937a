"""Sessions: for each site with ``cookies_file`` or ``login`` (SitePolicy.has_session), a cookie jar and a login.

Two layers, as elsewhere in the worker:

- ``LoginMachine`` is pure (no I/O, time passed in): it decides when the site must be logged into, who does it
  (one login at a time: the others wait on it), what a page's answer says of the session, and how long a failed
  login waits before the next attempt. Its decision table:

  ============================  ==========================================================================
  state                         a request to the site (``ask``)
  ============================  ==========================================================================
  no login configured           GO (the jar's cookies only)
  OUT (never, or expired)       LOGIN: this caller logs in, the state is LOGGING_IN
  LOGGING_IN                    WAIT for that login to end, then ask again
  IN                            GO, under the login's generation
  FAILED, retry time reached    LOGIN (the next attempt)
  FAILED, before it             REFUSED: the site's URLs wait (handed back to the master, no attempt counted)
  ============================  ==========================================================================

  A login that fails (an error status, no success text in its answer, a network error) doubles the wait before
  the next attempt, from LOGIN_BACKOFF_BASE up to LOGIN_BACKOFF_MAX; the first failure of an episode (failures
  since the last success) is the one that is logged as an error, so a site whose password is wrong says so once,
  not once per URL. A page answer says the session has expired when it is 401 or 403, when it redirects to the
  login form, or when the page showed the success text on an earlier visit and does not now (the machine keeps,
  for at most MAX_PAGES pages, which showed it); the session then goes OUT, unless a newer login already
  replaced the one the page was fetched under, and the page is fetched again after the login (once: the same
  answer twice is the page's own).

- ``Sessions`` is the I/O shell: the sites' jars and machines, the login exchange itself (a form POST through
  the worker's httpx client, redirects followed here so each hop's cookies are kept), the waiting, and the two
  ways requests meet the jars: ``SessionGetter`` for the lean path (page fetches, downloads) and httpx event
  hooks for the client (resolvers' API calls, playlists, HLS). A site without a session costs a request one
  check of a boolean when no site has one, one look-up in the sites table otherwise.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import httpx
import yarl

from crawler.http.getter import Getter
from crawler.http.http1 import Answer, Timeouts
from crawler.sites import SitePolicy, SiteTable
from crawler.web.cookies import CookieJar, set_cookie_values

log = logging.getLogger("crawler.worker")

LOGIN_BACKOFF_BASE = 2.0       # seconds before the second attempt after a failed login
LOGIN_BACKOFF_MAX = 300.0
MAX_PAGES = 4096               # pages remembered per site as having shown the success text
MAX_LOGIN_HOPS = 5             # the login POST and the redirects after it
MAX_LOGIN_BODY = 1024 * 1024   # bytes of a login answer searched for the success text
# A request waits this long at most for another's login to end; past it, it is handed back like a refused one.
LOGIN_WAIT = 120.0
# A task whose site cannot be logged into waits this long at most for the next attempt before it is handed back:
# an attempt due within it is made by the task itself; otherwise the pause keeps the hand-backs of one site
# (each a fault the master must route around) to a few a minute.
HAND_BACK_AFTER = 2.0
LOGIN_EXTENSION = "crawler_login"   # marks the login's own requests for the hooks: they do not wait for a login


class Step(enum.Enum):
    GO = "go"
    LOGIN = "login"
    WAIT = "wait"
    REFUSED = "refused"


class State(enum.Enum):
    OUT = "out"
    LOGGING_IN = "logging in"
    IN = "in"
    FAILED = "failed"


class Verdict(enum.Enum):
    OK = "ok"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Ask:
    step: Step
    generation: int = 0           # GO: the login the request goes under
    retry_at: float = 0.0         # REFUSED: when the next attempt is due
    reason: str = ""              # REFUSED: why the last one failed


class LoginMachine:
    """One site's login state (see the module's docstring). ``now``: monotonic seconds."""

    def __init__(self, has_login: bool, success: str = "", login_path: str | None = None, *,
                 backoff_base: float = LOGIN_BACKOFF_BASE, backoff_max: float = LOGIN_BACKOFF_MAX,
                 max_pages: int = MAX_PAGES) -> None:
        self.has_login = has_login
        self.success = success.encode("utf-8")
        self.login_path = login_path      # the form's path: a redirect there means the session is gone
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_pages = max_pages
        self.state = State.OUT if has_login else State.IN
        self.generation = 0               # successful logins so far
        self.failures = 0                 # failed attempts since the last success
        self.retry_at = 0.0
        self.reason = ""
        self.logins = 0                   # attempts started, for tests and logs
        self._shown: OrderedDict[str, None] = OrderedDict()   # pages that showed the success text

    def ask(self, now: float) -> Ask:
        """A request to the site wants to go."""
        if self.state is State.IN:
            return Ask(Step.GO, self.generation)
        if self.state is State.LOGGING_IN:
            return Ask(Step.WAIT)
        if self.state is State.FAILED and now < self.retry_at:
            return Ask(Step.REFUSED, retry_at=self.retry_at, reason=self.reason)
        self.state = State.LOGGING_IN
        self.logins += 1
        return Ask(Step.LOGIN)

    def login_ended(self, now: float, ok: bool, reason: str = "") -> bool:
        """The login this machine asked for ended. True when this failure opens an episode (log it as an
        error; later failures of the same episode are not)."""
        if ok:
            self.state = State.IN
            self.generation += 1
            self.failures = 0
            self.reason = ""
            return False
        self.failures += 1
        self.state = State.FAILED
        self.reason = reason
        self.retry_at = now + self.backoff(self.failures)
        return self.failures == 1

    def backoff(self, failures: int) -> float:
        return float(min(self.backoff_max, self.backoff_base * 2 ** min(failures - 1, 30)))

    def judge_head(self, generation: int, status: int, location: str | None, again: bool = False) -> Verdict:
        """What an answer's status says of the session it was sent under (``generation``): 401 and 403, and a
        redirect to the login form, say it is gone. ``again``: the request was made again after a login
        already; its answer is then its own."""
        if not self.has_login:
            return Verdict.OK
        expired = status in (401, 403)
        if not expired and status in (301, 302, 303, 307, 308) and location and self.login_path:
            try:
                expired = urlsplit(location).path == self.login_path
            except ValueError:
                pass
        return self._verdict(expired and not again, generation)

    def judge_body(self, url: str, generation: int, status: int, body: bytes, again: bool = False) -> Verdict:
        """What a page's body says of the session: a page that showed the success text on an earlier visit and
        does not now was fetched without it. ``again``: as for judge_head (the page's memory follows it)."""
        if not self.has_login or not self.success or status == 304 or status >= 400:
            return Verdict.OK
        expired = False
        if self.success in body:
            self._shown[url] = None
            self._shown.move_to_end(url)
            if len(self._shown) > self.max_pages:
                self._shown.popitem(last=False)
        elif url in self._shown:
            expired = True
            if again:
                del self._shown[url]
        return self._verdict(expired and not again, generation)

    def _verdict(self, expired: bool, generation: int) -> Verdict:
        if not expired:
            return Verdict.OK
        if self.state is State.IN and generation == self.generation:
            self.state = State.OUT      # the next request logs in (unless a newer login is under way or done)
        return Verdict.EXPIRED


class SessionUnavailable(Exception):
    """The site's login fails: its URLs wait (a task is handed back to the master, no attempt counted; a
    download waits for the next attempt)."""

    def __init__(self, site: str, reason: str, retry_at: float) -> None:
        super().__init__(f"site {site}: login failed ({reason}); its URLs wait")
        self.site = site
        self.reason = reason
        self.retry_at = retry_at     # monotonic


# ----------------------------------------------------------------------------------------------- the shell
class SiteSession:
    """One site's jar and login, and the waiting around them."""

    def __init__(self, policy: SitePolicy, sessions: Sessions) -> None:
        self.policy = policy
        self._sessions = sessions
        login = policy.login
        path = None
        if login is not None:
            try:
                path = urlsplit(login.url).path or "/"
            except ValueError:
                path = None
        self.machine = LoginMachine(login is not None, login.success if login else "", path)
        self.jar = CookieJar(policy.pattern)
        self.jar.load(policy.cookies, sessions.clock())
        self._ended = asyncio.Event()      # set when a login ends; a new one for each login

    # ------------------------------------------------------------------ cookies
    def cookie(self, url: str) -> str | None:
        return self.jar.header(url, self._sessions.clock())

    def keep(self, url: str, set_cookies: list[str]) -> None:
        if set_cookies:
            self.jar.receive(url, set_cookies, self._sessions.clock())

    # ------------------------------------------------------------------ login
    async def ready(self, *, hold: float = HAND_BACK_AFTER) -> int:
        """Wait until a request may go to the site; returns the login generation it goes under. Raises
        SessionUnavailable when the login fails (after waiting up to ``hold`` for an attempt due soon)."""
        m, mono = self.machine, self._sessions.monotonic
        waited = 0.0
        while True:
            a = m.ask(mono())
            if a.step is Step.GO:
                return a.generation
            if a.step is Step.LOGIN:
                await self._login()
                continue
            if a.step is Step.WAIT:
                ended = self._ended
                try:
                    async with asyncio.timeout(LOGIN_WAIT):
                        await ended.wait()
                except TimeoutError:
                    raise SessionUnavailable(self.policy.pattern, "the login took too long", mono()) from None
                continue
            # REFUSED: an attempt due within the hold is this task's to make; otherwise it waits out the hold.
            left, due_in = hold - waited, a.retry_at - mono()
            if due_in <= left:
                await asyncio.sleep(max(0.0, due_in))
                waited += max(0.0, due_in)
                continue
            if left > 0:
                await asyncio.sleep(left)
            raise SessionUnavailable(self.policy.pattern, a.reason, a.retry_at)

    async def renew(self, generation: int) -> int:
        """A page fetched under ``generation`` showed the session gone (judge said so): the site is logged into
        again (by this caller, or another already at it); returns the new generation."""
        return await self.ready()

    async def _login(self) -> None:
        login = self.policy.login
        assert login is not None
        self._ended = asyncio.Event()
        ok, reason = False, ""
        try:
            ok, reason = await self._sessions.post_login(self)
        except asyncio.CancelledError:
            reason = "cancelled"
            raise
        except Exception as e:   # a bug must cost the login, not the worker
            log.exception("site %s: login failed unexpectedly", self.policy.pattern)
            reason = f"{type(e).__name__}: {e}"
        finally:
            m = self.machine
            first = m.login_ended(self._sessions.monotonic(), ok, reason)
            self._ended.set()
            if ok:
                log.info("site %s: logged in at %s%s", self.policy.pattern, login.url,
                         " again" if m.generation > 1 else "")
            elif first:
                log.error("site %s: login at %s failed: %s; the site's URLs wait (handed back, none failed) and "
                          "the login is tried again, %.0f s from now at first, later up to every %.0f s",
                          self.policy.pattern, login.url, reason, m.backoff(1), m.backoff_max)
            elif reason != "cancelled":
                log.info("site %s: login attempt %d failed again: %s", self.policy.pattern, m.failures, reason)


class Sessions:
    """The sessions of the sites that have one, and the login exchange. ``client``: the worker's httpx client
    (logins go through it: its target policy, timeouts and archive)."""

    def __init__(self, client: Callable[[], httpx.AsyncClient] | None = None, *,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self.clock = clock
        self.monotonic = monotonic
        self.table = SiteTable()
        self._sites: dict[str, SiteSession] = {}
        self.active = False                  # some site has a session: requests look their site up

    def update(self, table: SiteTable) -> None:
        """The master's sites (its Welcome). A site whose policy is the same keeps its jar and login."""
        old = self._sites
        self.table = table
        self._sites = {}
        for p in table.policies:
            if p.has_session:
                kept = old.get(p.pattern)
                self._sites[p.pattern] = kept if kept is not None and kept.policy == p else SiteSession(p, self)
        self.active = bool(self._sites)

    def of(self, url: str) -> SiteSession | None:
        """The session of url's site, or None (no session: nothing to add, nothing to keep)."""
        if not self.active:
            return None
        policy = self.table.lookup_url(url)
        return None if policy is None else self._sites.get(policy.pattern)

    async def post_login(self, site: SiteSession) -> tuple[bool, str]:
        """The login exchange: the form's fields POSTed (form-urlencoded) to its URL, redirects followed (each
        hop carries the jar's cookies and leaves its own in it, through the client's hooks). Returns whether it
        worked and, if not, why."""
        login = site.policy.login
        assert login is not None and self._client is not None
        client = self._client()
        headers: dict[str, str] = dict(site.policy.headers)
        if site.policy.user_agent:
            headers["User-Agent"] = site.policy.user_agent
        method, url = "POST", login.url
        body: bytes | None = urlencode(login.fields).encode()
        try:
            for _ in range(MAX_LOGIN_HOPS):
                hop_headers = dict(headers)
                if method == "POST":
                    hop_headers["Content-Type"] = "application/x-www-form-urlencoded"
                request = client.build_request(method, url, headers=hop_headers, content=body,
                                               extensions={LOGIN_EXTENSION: True})
                response = await client.send(request, stream=True, follow_redirects=False)
                try:
                    text = await _bounded_body(response, MAX_LOGIN_BODY)
                finally:
                    await response.aclose()
                if response.is_redirect and response.headers.get("location"):
                    url = urljoin(url, response.headers["location"])
                    if urlsplit(url).scheme not in ("http", "https"):
                        return False, f"redirected to a non-http address {url[:200]!r}"
                    if response.status_code in (301, 302, 303):
                        method, body = "GET", None
                    continue
                if response.status_code >= 400:
                    return False, f"{url} answered {response.status_code}"
                if login.success.encode("utf-8") not in text:
                    return False, f"the answer of {url} ({response.status_code}) lacks the success text " \
                                  f"{login.success!r}"
                return True, ""
            return False, f"more than {MAX_LOGIN_HOPS - 1} redirects"
        except (httpx.HTTPError, OSError) as e:
            return False, f"{type(e).__name__}: {e}".rstrip(": ")[:300]

    # ------------------------------------------------------------------ the httpx client's hooks
    def install(self, client: httpx.AsyncClient) -> None:
        """Every request of this client to a session's site waits for its login and carries its cookies;
        every answer's cookies (redirects included: httpx runs the hooks at each hop) go to its jar."""
        client.event_hooks["request"].append(self._on_request)
        client.event_hooks["response"].append(self._on_response)

    async def _on_request(self, request: httpx.Request) -> None:
        if not self.active:
            return
        url = str(request.url)
        site = self.of(url)
        if site is None:
            return
        if not request.extensions.get(LOGIN_EXTENSION):
            await site.ready()
        cookie = site.cookie(url)
        if cookie:
            request.headers["Cookie"] = cookie

    async def _on_response(self, response: httpx.Response) -> None:
        if not self.active:
            return
        url = str(response.request.url)
        site = self.of(url)
        if site is not None:
            site.keep(url, set_cookie_values(response.headers.raw))
            # An API call that shows the session gone cannot be asked again from here: the next request logs in.
            site.machine.judge_head(site.machine.generation, response.status_code,
                                    response.headers.get("location"))


async def _bounded_body(response: httpx.Response, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


def _location(answer: Answer) -> str | None:
    for k, v in answer.raw_headers:
        if k.lower() == b"location":
            return v.decode("latin-1")
    return None


class SessionGetter:
    """A Getter whose GETs to a session's site wait for its login, carry its cookies and leave the answer's in
    its jar; the rest go straight through (the lean path of page fetches and downloads)."""

    def __init__(self, inner: Getter, sessions: Sessions) -> None:
        self._inner = inner
        self._sessions = sessions

    @property
    def client(self) -> httpx.AsyncClient:
        return self._inner.client

    @property
    def timeouts(self) -> Timeouts:
        return self._inner.timeouts

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts, max_body: int,
                  read_size: int, cut: bool = False) -> Answer:
        sessions = self._sessions
        site = sessions.of(str(url)) if sessions.active else None
        if site is None:
            return await self._inner.get(url, headers, timeout=timeout, max_body=max_body, read_size=read_size,
                                         cut=cut)
        target = str(url)
        generation = await site.ready()
        answer = await self._send(site, url, headers, timeout, max_body, read_size, cut)
        m = site.machine
        if m.judge_head(generation, answer.status_code, _location(answer)) is Verdict.EXPIRED:
            # The session is gone: logged into again (by this request, or one already at it), and asked again,
            # once; the request's caller sees only the second answer.
            log.info("site %s: %s answered %d without the session: logging in again", site.policy.pattern,
                     target, answer.status_code)
            await answer.aclose()
            generation = await site.renew(generation)
            answer = await self._send(site, url, headers, timeout, max_body, read_size, cut)
            m.judge_head(generation, answer.status_code, _location(answer), again=True)
        return answer

    async def _send(self, site: SiteSession, url: yarl.URL, headers: list[tuple[str, str]], timeout: Timeouts,
                    max_body: int, read_size: int, cut: bool) -> Answer:
        cookie = site.cookie(str(url))
        if cookie:
            headers = [h for h in headers if h[0].lower() != "cookie"] + [("Cookie", cookie)]
        answer = await self._inner.get(url, headers, timeout=timeout, max_body=max_body, read_size=read_size,
                                       cut=cut)
        site.keep(str(url), set_cookie_values(answer.raw_headers))
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
