"""Sessions (crawler/worker/sessions.py): the login state machine with time passed in, and its shell over a fake
site (httpx's MockTransport): one login at a time, cookies kept and sent to the site only, re-login when a page
says the session is gone, a failed login said once and retried with a growing, bounded backoff."""

import asyncio
import logging
from urllib.parse import parse_qsl

import httpx
import pytest
import yarl

from crawler.http.http1 import Answer
from crawler.sites import LoginSpec, SitePolicy, SiteTable
from crawler.web.cookies import CookieRecord
from crawler.worker.sessions import (
    LOGIN_BACKOFF_BASE,
    LOGIN_BACKOFF_MAX,
    LoginMachine,
    Sessions,
    SessionGetter,
    SessionUnavailable,
    State,
    Step,
    Verdict,
)

SUCCESS = "Log out"


# ----------------------------------------------------------------------------------------------- the machine
def logged_in(machine: LoginMachine, now: float = 0.0) -> int:
    assert machine.ask(now).step is Step.LOGIN
    machine.login_ended(now, True)
    return machine.generation


def test_the_first_request_logs_in_and_the_others_wait_for_that_one_login():
    m = LoginMachine(True, SUCCESS, "/login")
    assert m.ask(0.0).step is Step.LOGIN
    assert m.ask(0.0).step is Step.WAIT and m.ask(1.0).step is Step.WAIT      # one login at a time
    m.login_ended(1.0, True)
    assert m.ask(1.0) .step is Step.GO and m.ask(1.0).generation == 1
    assert m.logins == 1


def test_a_site_with_cookies_and_no_login_never_waits():
    m = LoginMachine(False)
    assert m.ask(0.0).step is Step.GO
    assert m.judge_head(0, 403, None) is Verdict.OK


def test_a_failed_login_backs_off_doubling_up_to_the_bound_and_only_the_first_failure_opens_an_episode():
    m = LoginMachine(True, SUCCESS, "/login")
    now = 0.0
    firsts, waits = [], []
    for _ in range(12):
        assert m.ask(now).step is Step.LOGIN
        firsts.append(m.login_ended(now, False, "wrong password"))
        refused = m.ask(now)
        assert refused.step is Step.REFUSED and refused.reason == "wrong password"
        assert m.ask(refused.retry_at - 0.001).step is Step.REFUSED
        waits.append(refused.retry_at - now)
        now = refused.retry_at
    assert firsts == [True] + [False] * 11
    assert waits[:3] == [LOGIN_BACKOFF_BASE, 2 * LOGIN_BACKOFF_BASE, 4 * LOGIN_BACKOFF_BASE]
    assert max(waits) == LOGIN_BACKOFF_MAX and waits == sorted(waits)
    # A success ends the episode: the next failure is a new one, and waits the base again.
    assert m.ask(now).step is Step.LOGIN
    m.login_ended(now, True)
    assert m.ask(now).step is Step.GO
    m.judge_head(m.generation, 401, None)
    assert m.ask(now).step is Step.LOGIN
    assert m.login_ended(now, False, "down") is True
    assert m.ask(now).retry_at == now + LOGIN_BACKOFF_BASE


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_mean_the_session_is_gone_and_the_next_request_logs_in(status):
    m = LoginMachine(True, SUCCESS, "/login")
    gen = logged_in(m)
    assert m.judge_head(gen, status, None) is Verdict.EXPIRED
    assert m.state is State.OUT and m.ask(5.0).step is Step.LOGIN


def test_a_redirect_to_the_login_form_means_the_session_is_gone():
    m = LoginMachine(True, SUCCESS, "/login")
    gen = logged_in(m)
    assert m.judge_head(gen, 302, "http://s/elsewhere") is Verdict.OK
    assert m.judge_head(gen, 302, "/login?next=/p") is Verdict.EXPIRED


def test_a_page_that_showed_the_success_text_and_no_longer_does_means_the_session_expired():
    m = LoginMachine(True, SUCCESS, "/login")
    gen = logged_in(m)
    assert m.judge_body("http://s/p", gen, 200, b"<a>Log out</a> songs") is Verdict.OK
    assert m.judge_body("http://s/public", gen, 200, b"no text, never had it") is Verdict.OK
    assert m.judge_body("http://s/p", gen, 200, b"please sign in") is Verdict.EXPIRED
    gen = logged_in(m)
    # Fetched again after the login: still without it, the answer is the page's own, and remembered so.
    assert m.judge_body("http://s/p", gen, 200, b"please sign in", again=True) is Verdict.OK
    assert m.judge_body("http://s/p", gen, 200, b"please sign in") is Verdict.OK
    assert m.state is State.IN


def test_a_304_says_nothing_of_the_session():
    m = LoginMachine(True, SUCCESS, "/login")
    gen = logged_in(m)
    m.judge_body("http://s/p", gen, 200, b"Log out")
    assert m.judge_body("http://s/p", gen, 304, b"") is Verdict.OK
    assert m.judge_head(gen, 304, None) is Verdict.OK


def test_an_expiry_seen_under_an_older_login_does_not_log_in_again():
    m = LoginMachine(True, SUCCESS, "/login")
    old = logged_in(m)
    assert m.judge_head(old, 403, None) is Verdict.EXPIRED     # the first to see it
    logged_in(m)
    # A request that went out under the old session comes back 403 after the new login: fetch it again, no login.
    assert m.judge_head(old, 403, None) is Verdict.EXPIRED
    assert m.state is State.IN and m.ask(0.0).step is Step.GO and m.logins == 2


def test_the_pages_remembered_are_bounded():
    m = LoginMachine(True, SUCCESS, "/login", max_pages=10)
    gen = logged_in(m)
    for i in range(100):
        m.judge_body(f"http://s/{i}", gen, 200, b"Log out")
    assert len(m._shown) == 10 and "http://s/99" in m._shown


# ----------------------------------------------------------------------------------------------- the shell
class FakeSite:
    """A login form at /login (user/secret), a session cookie, pages that need it; every request recorded."""

    def __init__(self, password="secret", answer_ok=True):
        self.password = password
        self.answer_ok = answer_ok
        self.requests: list[httpx.Request] = []
        self.logins = 0
        self.sessions: set[str] = set()
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/login" and request.method == "POST":
            self.logins += 1
            await self.gate.wait()
            form = dict(parse_qsl(request.content.decode()))
            if form != {"user": "u", "password": self.password}:
                return httpx.Response(200, text="wrong password, try again")
            sid = f"s{self.logins}"
            self.sessions.add(sid)
            return httpx.Response(303, headers={"Location": "/home", "Set-Cookie": f"sid={sid}; Path=/; HttpOnly"})
        if request.url.path == "/home":
            sid = _cookie(request, "sid")
            return httpx.Response(200, text="Welcome. Log out" if sid in self.sessions else "sign in")
        return httpx.Response(200, text="public", headers={"Set-Cookie": "track=1"})


def _cookie(request: httpx.Request, name: str) -> str | None:
    for part in request.headers.get("cookie", "").split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def policy(password="secret", pattern="site.test", **kw) -> SitePolicy:
    login = LoginSpec("http://site.test/login", (("user", "u"), ("password", password)), SUCCESS)
    return SitePolicy(pattern, login=login, **kw)


def sessions_for(site: FakeSite, *policies: SitePolicy, monotonic=None):
    client = httpx.AsyncClient(transport=httpx.MockTransport(site), follow_redirects=True)
    s = Sessions(lambda: client, **({"monotonic": monotonic} if monotonic else {}))
    s.install(client)
    s.update(SiteTable(policies))
    return s, client


async def test_concurrent_first_requests_make_one_login_and_then_carry_its_cookie():
    site = FakeSite()
    site.gate.clear()
    s, client = sessions_for(site, policy(user_agent="agent/1", headers=(("X-Site", "yes"),)))
    one = s.of("http://site.test/p")
    waiting = [asyncio.create_task(one.ready()) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert site.logins == 1 and not any(t.done() for t in waiting)    # the others wait on the one login
    site.gate.set()
    assert await asyncio.gather(*waiting) == [1] * 5 and site.logins == 1
    post = site.requests[0]
    assert post.method == "POST" and post.headers["content-type"] == "application/x-www-form-urlencoded"
    assert post.headers["user-agent"] == "agent/1" and post.headers["x-site"] == "yes"
    home = site.requests[1]       # the redirect after the POST: followed with the cookie it set
    assert home.method == "GET" and home.url.path == "/home" and _cookie(home, "sid") == "s1"
    # Later requests of the site carry it, through the client's hooks...
    r = await client.get("http://site.test/api")
    assert _cookie(r.request, "sid") == "s1"
    # ... and the track cookie the answer set is the site's too.
    assert s.of("http://site.test/x").cookie("http://site.test/x") == "sid=s1; track=1"
    await client.aclose()


async def test_cookies_go_to_their_site_only_and_a_site_without_a_session_is_untouched():
    site = FakeSite()
    s, client = sessions_for(site, policy(), SitePolicy("other.test", user_agent="x"))
    await s.of("http://site.test/").ready()
    assert s.of("http://other.test/") is None and s.of("http://elsewhere.test/") is None
    r = await client.get("http://other.test/page")
    assert "cookie" not in r.request.headers
    await client.get("http://other.test/page")                 # its Set-Cookie is kept by no one
    assert "track" not in (s.of("http://site.test/").cookie("http://site.test/") or "")
    await client.aclose()


class FakeGetter:
    """The lean path's Getter: answers from a table, records what was sent."""

    def __init__(self, client: httpx.AsyncClient):
        self._client = client
        self.sent: list[tuple[str, list[tuple[str, str]]]] = []

    @property
    def client(self):
        return self._client

    @property
    def timeouts(self):
        return (1.0, 1.0, 1.0, None)

    async def get(self, url, headers, *, timeout, max_body, read_size, cut=False):
        self.sent.append((str(url), headers))
        return Answer(200, ((b"Set-Cookie", b"seen=1; Path=/"),), {}, _NoBody())


class _NoBody:
    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration

    async def aclose(self):
        pass


async def test_the_lean_path_waits_for_the_login_adds_the_cookie_and_keeps_the_answers():
    site = FakeSite()
    s, client = sessions_for(site, policy())
    inner = FakeGetter(client)
    getter = SessionGetter(inner, s)
    base = [("User-Agent", "crawler"), ("Cookie", "stale=1")]
    await getter.get(yarl.URL("http://site.test/p"), base, timeout=(1, 1, 1, None), max_body=10, read_size=10)
    assert site.logins == 1
    url, headers = inner.sent[0]
    assert ("Cookie", "sid=s1") in headers and ("Cookie", "stale=1") not in headers
    assert s.of(url).cookie(url) == "sid=s1; seen=1"
    # Another host: the headers as they were (the same list), nothing kept.
    await getter.get(yarl.URL("http://other.test/p"), base, timeout=(1, 1, 1, None), max_body=10, read_size=10)
    assert inner.sent[1][1] is base
    await client.aclose()


async def test_a_wrong_password_is_one_error_line_the_sites_requests_are_refused_and_retried_later(caplog):
    site = FakeSite(password="right")
    clock = [100.0]
    s, client = sessions_for(site, policy(password="wrong"), monotonic=lambda: clock[0])
    one = s.of("http://site.test/p")
    with caplog.at_level(logging.INFO, logger="crawler.worker"):
        for _ in range(10):
            with pytest.raises(SessionUnavailable) as e:
                await one.ready(hold=0)
            assert "lacks the success text" in e.value.reason
        assert site.logins == 1                      # no attempt before the backoff has passed
        clock[0] += LOGIN_BACKOFF_BASE
        with pytest.raises(SessionUnavailable):
            await one.ready(hold=0)
        assert site.logins == 2
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "site.test" in errors[0].getMessage() \
            and "login" in errors[0].getMessage(), [r.getMessage() for r in errors]
        # The password is fixed (as if the site changed its mind): the next attempt works, the URLs go on.
        site.password = "wrong"
        clock[0] += 2 * LOGIN_BACKOFF_BASE
        assert await one.ready(hold=0) == 1
    await client.aclose()


async def test_a_task_holds_for_an_attempt_due_within_its_hold_and_makes_it():
    site = FakeSite(password="right")
    s, client = sessions_for(site, policy(password="wrong"))
    one = s.of("http://site.test/p")
    one.machine.backoff_base = 0.05
    with pytest.raises(SessionUnavailable):
        await one.ready(hold=0)
    site.password = "wrong"
    assert await one.ready(hold=1.0) == 1 and site.logins == 2
    await client.aclose()


async def test_a_network_error_during_login_is_a_failed_login():
    async def down(request):
        raise httpx.ConnectError("refused")

    client = httpx.AsyncClient(transport=httpx.MockTransport(down))
    s = Sessions(lambda: client)
    s.install(client)
    s.update(SiteTable([policy()]))
    with pytest.raises(SessionUnavailable) as e:
        await s.of("http://site.test/").ready(hold=0)
    assert "ConnectError" in e.value.reason
    await client.aclose()


async def test_an_expired_session_is_renewed_once_for_the_pages_that_saw_it():
    site = FakeSite()
    s, client = sessions_for(site, policy())
    one = s.of("http://site.test/p")
    gen = await one.ready()
    site.sessions.clear()                          # the server forgets the session
    # Three pages come back 403 under the old session: one login, all three fetched again under the new one.
    verdicts = [one.machine.judge_head(gen, 403, None) for i in range(3)]
    assert verdicts == [Verdict.EXPIRED] * 3
    assert await asyncio.gather(*(one.renew(gen) for _ in range(3))) == [2, 2, 2]
    assert site.logins == 2
    assert one.cookie("http://site.test/p") == "sid=s2"
    await client.aclose()


def test_sessions_without_a_session_site_cost_a_boolean():
    s = Sessions()
    s.update(SiteTable([SitePolicy("a.test", user_agent="x")]))
    assert not s.active and s.of("http://a.test/") is None
    s.update(SiteTable([SitePolicy("a.test", cookies=(CookieRecord("a.test", False, "/", False, 0, "k", "v"),))]))
    assert s.active and s.of("http://a.test/").cookie("http://a.test/") == "k=v"
    assert s.of("http://a.test/").machine.ask(0).step is Step.GO


class ExpiringGetter(FakeGetter):
    """A lean-path site whose first answer to a page is 403 (the session it was sent under is gone)."""

    def __init__(self, client, site: FakeSite):
        super().__init__(client)
        self.site = site

    async def get(self, url, headers, *, timeout, max_body, read_size, cut=False):
        self.sent.append((str(url), headers))
        cookie = dict(headers).get("Cookie", "")
        ok = any(f"sid={sid}" in cookie for sid in self.site.sessions) and "forbidden" not in str(url)
        return Answer(200 if ok else 403, (), {}, _NoBody())


async def test_a_403_on_the_lean_path_logs_in_again_and_asks_again_once():
    site = FakeSite()
    s, client = sessions_for(site, policy())
    inner = ExpiringGetter(client, site)
    getter = SessionGetter(inner, s)
    args = dict(timeout=(1, 1, 1, None), max_body=10, read_size=10)
    assert (await getter.get(yarl.URL("http://site.test/a.mp3"), [], **args)).status_code == 200
    site.sessions.clear()                              # the server expires the session
    answer = await getter.get(yarl.URL("http://site.test/b.mp3"), [], **args)
    assert answer.status_code == 200 and site.logins == 2
    assert [dict(h)["Cookie"] for _, h in inner.sent] == ["sid=s1", "sid=s1", "sid=s2"]
    # A page that stays 403 after the new login is the page's own answer: asked again once, not more.
    answer = await getter.get(yarl.URL("http://site.test/forbidden.mp3"), [], **args)
    assert answer.status_code == 403 and site.logins == 3 and len(inner.sent) == 5
    await client.aclose()
