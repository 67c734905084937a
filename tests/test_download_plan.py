"""The download decision table (crawler/worker/download_plan.py) as a table: inputs in, one action out, no I/O.

Each row names what is held on disk, what the server answered and what must happen. The downloader's own tests
(test_downloader.py, test_e2e_downloads.py, test_e2e_resume.py) show the same decisions carried out against real
servers; these show every row, and the edge cases, one decision at a time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawler.worker.audiostore import Finished
from crawler.worker.download_plan import (
    FIRST_BYTES,
    Ask,
    Body,
    Complete,
    Confirmed,
    Fail,
    Finish,
    Head,
    Held,
    Limits,
    Received,
    Redirect,
    Reresolve,
    Restart,
    Retry,
    Tries,
    after,
    ask,
    backoff,
    body_ended,
    check_finished,
    check_start,
    decide,
    overgrown,
    overrun,
    same_file,
    transient,
    whole,
)

URL = "http://cdn.test/song.mp3"
LIMITS = Limits(max_size=10_000, chunk_size=1_000, max_attempts=3, max_restarts=2, retry_backoff=1.0)
NOTHING = Held()
# 4000 bytes held of a 6000-byte file, with its validators, in a part file.
HELD = Held(offset=4000, etag='"v1"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT", expected_size=6000,
            content_type="audio/mpeg", on_disk=True)
LM = "Mon, 01 Jan 2024 00:00:00 GMT"
LM2 = "Tue, 02 Jan 2024 00:00:00 GMT"


def head(status: int, **kw: object) -> Head:
    return Head(status=status, url=kw.pop("url", URL), **kw)  # type: ignore[arg-type]


def rest(**kw: object) -> Head:
    """The 206 that continues HELD: bytes 4000-5999 of 6000, same validators."""
    base: dict[str, object] = {"content_range": "bytes 4000-5999/6000", "content_length": "2000", "etag": '"v1"',
                               "last_modified": LM}
    return head(206, **{**base, **kw})


def appended(**kw: object) -> Body:
    base: dict[str, object] = {"append": True, "etag": '"v1"', "last_modified": LM, "expected_size": 6000,
                               "content_type": "audio/mpeg", "final_url": URL, "bound": 6000, "in_memory": False}
    return Body(**{**base, **kw})  # type: ignore[arg-type]


def from_zero(**kw: object) -> Body:
    base: dict[str, object] = {"append": False, "etag": None, "last_modified": None, "expected_size": None,
                               "content_type": None, "final_url": URL, "bound": LIMITS.max_size,
                               "in_memory": False}
    return Body(**{**base, **kw})  # type: ignore[arg-type]


# A row expecting a Restart names the class: its reason is for people.
TABLE: list[tuple[str, Held, Head, object]] = [
    # ---- the rows of the table ----
    ("206 at our offset, same validators and total: append",
     HELD, rest(), appended()),
    ("206 continuing without validators keeps the ones held",
     HELD, rest(etag=None, last_modified=None), appended()),
    ("206 continuing with a new Content-Type takes it",
     HELD, rest(content_type="Audio/MP4; x=1"), appended(content_type="audio/mp4")),
    ("206 with an unknown total (*) keeps the size held",
     HELD, rest(content_range="bytes 4000-5999/*"), appended()),
    ("200 to a Range request: the whole file again, from byte 0",
     HELD, head(200, content_length="7000", etag='"v2"', content_type="audio/mpeg"),
     from_zero(etag='"v2"', expected_size=7000, content_type="audio/mpeg", bound=7000)),
    ("200 to a Range request without validators: nothing of the old record survives",
     HELD, head(200), from_zero()),
    ("200 with nothing held",
     NOTHING, head(200, content_length="5000", last_modified=LM),
     from_zero(last_modified=LM, expected_size=5000, bound=5000)),
    ("200 small enough for one chunk, nothing on disk: kept in memory",
     NOTHING, head(200, content_length="1000"), from_zero(expected_size=1000, bound=1000, in_memory=True)),
    ("200 small enough for one chunk, but a part file exists: written there",
     Held(on_disk=True), head(200, content_length="1000"), from_zero(expected_size=1000, bound=1000)),
    ("200 without a usable Content-Length: bounded by max_size, never in memory",
     NOTHING, head(200, content_length="12ab"), from_zero()),
    ("206 at byte 0 with nothing held: a body from byte 0",
     NOTHING, head(206, content_range="bytes 0-4999/5000", content_length="5000", etag='"e"'),
     from_zero(etag='"e"', expected_size=5000, bound=5000)),
    ("416 naming what we hold while a larger size is expected: restart",
     HELD, head(416, content_range="bytes */4000"), Restart),
    ("416 naming what we hold, no size expected: complete",
     replace(HELD, expected_size=None), head(416, content_range="bytes */4000"), Complete(4000)),
    ("416 naming what we hold, the size expected: complete",
     replace(HELD, expected_size=4000), head(416, content_range="bytes */4000"), Complete(4000)),
    ("416 naming another size: restart",
     HELD, head(416, content_range="bytes */9000"), Restart),
    ("416 without a Content-Range: restart",
     HELD, head(416), Restart),
    ("416 with nothing held: restart",
     NOTHING, head(416, content_range="bytes */0"), Restart),
    ("403: the link expired", HELD, head(403), Reresolve("http 403")),
    ("410: the link expired", NOTHING, head(410), Reresolve("http 410")),
    ("429: retry", HELD, head(429), Retry("http 429")),
    ("500: retry", NOTHING, head(500), Retry("http 500")),
    ("503: retry", HELD, head(503), Retry("http 503")),
    ("404 with bytes held: fail, keep them for a later crawl", HELD, head(404), Fail("http 404")),
    ("404 with nothing held: fail, nothing to keep", NOTHING, head(404), Fail("http 404", discard=True)),
    ("304 to a conditional request: confirmed, with its validators",
     NOTHING, head(304, conditional=True, etag='"v3"', last_modified=LM2), Confirmed('"v3"', LM2)),
    ("304 nobody asked for: a failure", NOTHING, head(304), Fail("http 304", discard=True)),
    ("302 with a Location: follow it", NOTHING, head(302, location="/elsewhere.mp3"), Redirect("/elsewhere.mp3")),
    ("307 with a Location, bytes held: follow it", HELD, head(307, location="http://b/x"), Redirect("http://b/x")),
    ("302 without a Location: a failure", HELD, head(302), Fail("http 302")),
    # ---- a 206 that does not continue what we hold ----
    ("206 without a Content-Range", HELD, rest(content_range=None), Restart),
    ("206 with a garbled Content-Range", HELD, rest(content_range="bytes 4000-x/6000"), Restart),
    ("206 from another byte", HELD, rest(content_range="bytes 0-5999/6000", content_length="6000"), Restart),
    ("206 whose Content-Length disagrees with its range", HELD, rest(content_length="1999"), Restart),
    ("206 whose range ends before it starts", HELD, rest(content_range="bytes 4000-3999/6000",
                                                          content_length=None), Restart),
    ("206 whose range ends past its total", HELD, rest(content_range="bytes 4000-6000/6000",
                                                        content_length="2001"), Restart),
    ("206 with a changed ETag", HELD, rest(etag='"v2"'), Restart),
    ("206 with a changed Last-Modified and no ETag", replace(HELD, etag=None), rest(etag=None, last_modified=LM2),
     Restart),
    ("206 with a changed Last-Modified but the same ETag: the ETag decides",
     HELD, rest(last_modified=LM2), appended(last_modified=LM2)),
    ("206: the file grew", HELD, rest(content_range="bytes 4000-6999/7000", content_length="3000"), Restart),
    ("206: the file shrank", HELD, rest(content_range="bytes 4000-4999/5000", content_length="1000"), Restart),
    # ---- after a re-resolve: another address, maybe another host ----
    ("new address, same ETag: append", replace(HELD, new_address=True), rest(last_modified=LM2),
     appended(last_modified=LM2)),
    ("new address, other ETag but the same size: append",
     replace(HELD, new_address=True), rest(etag='"cdn-b"', url="http://b.test/s"),
     appended(etag='"cdn-b"', final_url="http://b.test/s")),
    ("new address, other ETag and no size to compare: restart",
     replace(HELD, new_address=True, expected_size=None), rest(etag='"cdn-b"', content_range="bytes 4000-5999/*"),
     Restart),
    ("new address, no validators at all: restart (only an ETag or a size can agree)",
     replace(HELD, new_address=True, etag=None, expected_size=None),
     rest(etag=None, last_modified=None, content_range="bytes 4000-5999/*"), Restart),
    ("new address, other size: restart", replace(HELD, new_address=True),
     rest(content_range="bytes 4000-7999/8000", content_length="4000"), Restart),
    # ---- limits and refusals ----
    ("200 announcing more than max_size: refused before the body, nothing kept",
     NOTHING, head(200, content_length="10001"), Fail("too large: 10001 bytes (max 10000)", discard=True)),
    ("200 announcing exactly max_size: taken",
     NOTHING, head(200, content_length="10000"), from_zero(expected_size=10000, bound=10000)),
    ("206 whose total is over max_size: refused, the partial discarded",
     replace(HELD, expected_size=None), rest(content_range="bytes 4000-19999/20000", content_length="16000"),
     Fail("too large: 20000 bytes (max 10000)", discard=True)),
    ("a body encoded although identity was asked, nothing held: discarded",
     NOTHING, head(200, content_encoding="gzip"),
     Fail("body sent with Content-Encoding gzip although identity was asked", discard=True)),
    ("a body encoded although identity was asked, bytes held: kept",
     HELD, rest(content_encoding="br"), Fail("body sent with Content-Encoding br although identity was asked")),
    ("a redirect is followed even when encoded (its body is never read)",
     NOTHING, head(301, location="/a", content_encoding="gzip"), Redirect("/a")),
    ("redirected to a new address: the body's final address is recorded",
     NOTHING, head(200, url="http://cdn2.test/real.mp3", content_type="audio/mpeg"),
     from_zero(final_url="http://cdn2.test/real.mp3", content_type="audio/mpeg")),
    ("a Content-Type that is only parameters is no type", NOTHING, head(200, content_type="; charset=x"),
     from_zero()),
]


@pytest.mark.parametrize(("held", "answer", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decision_table(held: Held, answer: Head, expected: object) -> None:
    got = decide(held, answer, LIMITS)
    if isinstance(expected, type):
        assert type(got) is expected, got
    else:
        assert got == expected


def test_every_status_class_has_a_row() -> None:
    """The table covers every outcome decide can return (a new one needs its rows)."""
    kinds = {type(decide(held, answer, LIMITS)) for _, held, answer, _ in TABLE}
    assert kinds == {Body, Complete, Confirmed, Fail, Redirect, Reresolve, Restart, Retry}


# ---- what to ask for ----

KNOWN = Finished(url=URL, sha256="0" * 64, size=5000, path=f"audio/00/{'0' * 64}.mp3", etag='"k"', last_modified=LM)

ASK_TABLE: list[tuple[str, Held, str, Finished | None, Ask | Fail]] = [
    ("nothing held, nothing known: the whole file", NOTHING, URL, None, Ask({"Accept-Encoding": "identity"}, False)),
    ("known with a strong ETag: If-None-Match", NOTHING, URL, KNOWN,
     Ask({"Accept-Encoding": "identity", "If-None-Match": '"k"'}, True)),
    ("known with a weak ETag, same address: If-Modified-Since", NOTHING, URL, replace(KNOWN, etag='W/"k"'),
     Ask({"Accept-Encoding": "identity", "If-Modified-Since": LM}, True)),
    ("known with a weak ETag, another address: no conditional (another host's dates mean nothing)",
     NOTHING, "http://other.test/x.mp3", replace(KNOWN, etag='W/"k"'), Ask({"Accept-Encoding": "identity"}, False)),
    ("bytes held: a range, guarded by the strong ETag", HELD, URL, KNOWN,
     Ask({"Accept-Encoding": "identity", "Range": "bytes=4000-", "If-Range": '"v1"'}, False)),
    ("bytes held with a weak ETag: guarded by Last-Modified", replace(HELD, etag='W/"v1"'), URL, None,
     Ask({"Accept-Encoding": "identity", "Range": "bytes=4000-", "If-Range": LM}, False)),
    ("bytes held without validators: an unguarded range", replace(HELD, etag=None, last_modified=None), URL, None,
     Ask({"Accept-Encoding": "identity", "Range": "bytes=4000-"}, False)),
    ("bytes held, new address: no If-Range, the 206 is judged on arrival", replace(HELD, new_address=True), URL,
     None, Ask({"Accept-Encoding": "identity", "Range": "bytes=4000-"}, False)),
    ("not an http address", NOTHING, "ftp://x/y.mp3", None, Fail("not an http(s) address: 'ftp://x/y.mp3'",
                                                              discard=True)),
]


@pytest.mark.parametrize(("held", "url", "known", "expected"), [row[1:] for row in ASK_TABLE],
                         ids=[row[0] for row in ASK_TABLE])
def test_what_to_ask(held: Held, url: str, known: Finished | None, expected: Ask | Fail) -> None:
    assert ask(held, url, known) == expected


# ---- while and after the body ----

AUDIO = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x00" * 1500
HTML = b"<!doctype html><html><body>not found</body></html>" + b" " * FIRST_BYTES


@pytest.mark.parametrize(("offset", "expected_size", "is_overgrown", "is_whole"), [
    (0, None, False, False),
    (4000, None, False, False),       # no size known: ask for the rest
    (4000, 6000, False, False),
    (6000, 6000, False, True),        # all there (the process died before the commit): no request
    (6001, 6000, True, False),        # longer than the file: start over
])
def test_before_asking(offset: int, expected_size: int | None, is_overgrown: bool, is_whole: bool) -> None:
    assert overgrown(offset, expected_size) is is_overgrown
    assert whole(offset, expected_size) is is_whole


def test_first_bytes_judge_a_body_from_byte_zero() -> None:
    assert check_start(AUDIO[:FIRST_BYTES]) is None
    assert check_start(HTML[:FIRST_BYTES]) == Fail("not audio", discard=True)
    assert check_start(b"MZ\x90\x00" + b"\x00" * (FIRST_BYTES - 4)) == Fail("not audio", discard=True)
    assert from_zero().sniff and not appended().sniff     # bytes appended were judged when they began


@pytest.mark.parametrize(("received", "body", "expected"), [
    (10_001, from_zero(), Fail("too large: more than 10000 bytes", discard=True)),
    (6001, appended(), Restart("body longer than the 6000 bytes announced")),
    (5001, from_zero(expected_size=5000, bound=5000), Restart("body longer than the 5000 bytes announced")),
], ids=["past max_size", "past the size announced, appending", "past the size announced, from byte 0"])
def test_overrun(received: int, body: Body, expected: object) -> None:
    assert received > body.bound
    assert overrun(received, body, LIMITS) == expected


def test_a_body_ends() -> None:
    assert body_ended(6000, 6000) == Received(True)
    assert body_ended(5000, 6000) == Received(False)     # a 206 that stopped short: ask for the rest
    assert body_ended(123, None) == Received(True)       # no size announced: the end is the end


@pytest.mark.parametrize(("size", "expected_size", "first", "expected"), [
    (len(AUDIO), len(AUDIO), AUDIO[:FIRST_BYTES], None),
    (len(AUDIO), None, AUDIO[:FIRST_BYTES], None),
    (len(AUDIO) - 1, len(AUDIO), AUDIO[:FIRST_BYTES], Fail(f"size {len(AUDIO) - 1} disagrees with the server's "
                                                          f"{len(AUDIO)}", discard=True)),
    (len(HTML), len(HTML), HTML[:FIRST_BYTES], Fail("not audio", discard=True)),
], ids=["whole audio", "no size announced", "short", "not audio"])
def test_a_finished_file(size: int, expected_size: int | None, first: bytes, expected: Fail | None) -> None:
    assert check_finished(size, expected_size, first) == expected


# ---- across attempts ----

AFTER_TABLE: list[tuple[str, Tries, object, bool, bool, Tries, object]] = [
    ("a first retry waits the backoff", Tries(), Retry("http 503"), False, True,
     Tries(failures=1), Retry("http 503", delay=1.0)),
    ("the backoff doubles", Tries(failures=1), Retry("x"), False, True, Tries(failures=2), Retry("x", delay=2.0)),
    ("a retry that brought bytes starts the count again", Tries(failures=2), Retry("cut"), True, True,
     Tries(), Retry("cut", delay=0.0)),
    ("max_attempts in a row without progress: give up, keep the bytes", Tries(failures=2), Retry("http 503"), False,
     True, Tries(failures=2), Fail("gave up after 3 attempts without progress: http 503")),
    ("a restart counts", Tries(), Restart("r"), False, True, Tries(restarts=1), Restart("r")),
    ("more than max_restarts: give up, discard", Tries(restarts=2), Restart("r"), False, True, Tries(restarts=2),
     Fail("gave up after 3 restarts: r", discard=True)),
    ("an expired link is re-resolved once", Tries(), Reresolve("http 403"), False, True, Tries(reresolved=True),
     Reresolve("http 403")),
    ("a second expiry fails", Tries(reresolved=True), Reresolve("http 410"), False, True, Tries(reresolved=True),
     Fail("link expired (http 410)")),
    ("expired with no way to re-resolve", Tries(), Reresolve("http 403"), False, False, Tries(),
     Fail("link expired (http 403)")),
    ("416 complete: finish", Tries(failures=1), Complete(10), False, True, Tries(failures=1), Finish()),
    ("a body to its end: finish", Tries(), Received(True), True, True, Tries(), Finish()),
    ("a short body with bytes: ask for the rest at once", Tries(failures=2), Received(False), True, True, Tries(),
     Retry("short answer")),
    ("short answers without bytes give up too", Tries(failures=2), Received(False), False, True, Tries(failures=2),
     Fail("gave up after 3 answers without progress")),
    ("304 passes through", Tries(), Confirmed(None, None), False, True, Tries(), Confirmed(None, None)),
    ("a failure passes through", Tries(), Fail("http 404"), False, True, Tries(), Fail("http 404")),
]


@pytest.mark.parametrize(("tries", "outcome", "progressed", "can_reresolve", "tries_after", "step"),
                         [row[1:] for row in AFTER_TABLE], ids=[row[0] for row in AFTER_TABLE])
def test_after_an_attempt(tries: Tries, outcome: object, progressed: bool, can_reresolve: bool, tries_after: Tries,
                          step: object) -> None:
    assert after(tries, outcome, progressed=progressed, can_reresolve=can_reresolve,  # type: ignore[arg-type]
                 limits=LIMITS) == (tries_after, step)


def test_backoff_is_capped_and_can_be_off() -> None:
    _, step = after(Tries(failures=9), Retry("x"), progressed=False, can_reresolve=True,
                    limits=replace(LIMITS, max_attempts=100))
    assert step == Retry("x", delay=30.0)
    _, step = after(Tries(), Retry("x"), progressed=False, can_reresolve=True, limits=replace(LIMITS, retry_backoff=0))
    assert step == Retry("x", delay=0.0)


def test_transient_statuses_and_backoff_shared_with_hls() -> None:
    assert [s for s in (200, 304, 403, 404, 416, 429, 500, 502, 599) if transient(s)] == [429, 500, 502, 599]
    assert [backoff(n, 1.0) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(3, 0.0) == 0.0


def test_same_file_is_the_rule_for_a_continuing_206() -> None:
    assert same_file(HELD, rest(), 6000)
    assert not same_file(HELD, rest(), 7000)
    assert same_file(replace(HELD, etag=None, last_modified=None), rest(etag='"x"', last_modified=LM2), 6000)


# ---- whatever the server says, the plan answers, within its limits ----

_statuses = st.sampled_from([200, 206, 301, 302, 304, 403, 404, 410, 416, 429, 500, 503]) | st.integers(100, 599)
_ranges = st.none() | st.sampled_from(["bytes */4000", "bytes 4000-5999/6000", "bytes 0-9/*", "garbage"]) | st.builds(
    lambda a, b, t: f"bytes {a}-{b}/{t}", st.integers(0, 30_000), st.integers(0, 30_000), st.integers(0, 30_000))
_text = st.none() | st.text(max_size=12)


@given(offset=st.integers(0, 20_000), expected=st.none() | st.integers(0, 30_000), on_disk=st.booleans(),
       new_address=st.booleans(), etag=_text, status=_statuses, content_range=_ranges,
       length=st.none() | st.integers(0, 30_000).map(str) | st.text(max_size=5), answer_etag=_text,
       conditional=st.booleans(), location=_text)
def test_decide_is_total_and_stays_within_limits(offset: int, expected: int | None, on_disk: bool,
                                                 new_address: bool, etag: str | None, status: int,
                                                 content_range: str | None, length: str | None,
                                                 answer_etag: str | None, conditional: bool,
                                                 location: str | None) -> None:
    held = Held(offset=offset, etag=etag, expected_size=expected, on_disk=on_disk or offset > 0,
                new_address=new_address)
    answer = head(status, content_range=content_range, content_length=length, etag=answer_etag,
                  conditional=conditional, location=location)
    got = decide(held, answer, LIMITS)
    if isinstance(got, Body):
        assert status in (200, 206)
        assert got.bound <= LIMITS.max_size
        # Bytes are appended only to bytes held, and only where the answer starts at their end.
        assert not got.append or (status == 206 and offset > 0 and content_range is not None
                                   and content_range.startswith(f"bytes {offset}-"))
        assert not got.in_memory or (not held.on_disk and got.expected_size is not None
                                     and got.expected_size <= LIMITS.chunk_size)
    if isinstance(got, Complete):
        assert got.size == offset > 0
    if isinstance(got, Fail) and offset == 0:
        assert got.discard    # nothing held is nothing to keep
