"""The page decision table (crawler/worker/page_plan.py) row by row: an answer in, one action out, no I/O.

The worker's end-to-end tests (test_e2e_crawl.py, test_e2e_depth.py, test_e2e_refresh.py, test_e2e_hostile.py)
show the same decisions carried out against real sites; these show every row on its own.
"""

from __future__ import annotations

import pytest

from crawler import protocol as p
from crawler.worker.page_plan import (
    Answer,
    Check,
    Depth,
    Parse,
    Redirect,
    Report,
    Unchanged,
    checked,
    decide,
    depth,
)

PAGE = "http://site.example/a/page.html"
BELOW = Depth(follow=True, beyond=False)
AT = Depth(follow=False, beyond=False)
PAST = Depth(follow=False, beyond=True)


def test_the_depth_limit_splits_tasks_below_at_and_past_it():
    assert depth(0, None) == BELOW and depth(50, None) == BELOW
    assert depth(2, 3) == BELOW
    assert depth(3, 3) == AT
    assert depth(4, 3) == PAST


def test_304_is_unchanged_whatever_else_the_answer_says():
    assert decide(Answer(304, PAGE, html=True), BELOW) == Unchanged()
    assert decide(Answer(304, PAGE, location="/x"), PAST) == Unchanged()


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 599])
def test_429_and_5xx_are_tried_again_later(status):
    assert decide(Answer(status, PAGE, html=True), BELOW) == Report(p.RETRY, f"HTTP {status}")


@pytest.mark.parametrize("status", sorted(p.REDIRECT_STATUSES))
def test_a_redirect_reports_its_target_joined_to_the_address_that_answered(status):
    got = decide(Answer(status, PAGE, location="../b.html"), BELOW)
    assert got == Redirect("http://site.example/b.html") and got.error is None
    # At the limit the target is still a link (the same resource, at the same depth); past it a reference.
    assert decide(Answer(status, PAGE, location="/b"), AT) == Redirect("http://site.example/b")
    assert decide(Answer(status, PAGE, location="/b"), PAST) == Redirect("http://site.example/b", ref=True)


@pytest.mark.parametrize("location", ["", "http://[::1", "http://exa mple.com/"])
def test_a_redirect_without_a_usable_location_ends_the_page_with_why(location):
    got = decide(Answer(302, PAGE, location=location), BELOW)
    assert isinstance(got, Redirect) and got.target is None
    assert got.error == "redirect without a usable Location"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451, 499])
def test_other_4xx_are_the_pages_answer(status):
    assert decide(Answer(status, PAGE, html=True), BELOW) == Report(p.DONE)


def test_html_is_checked_before_it_is_parsed_and_refused_when_its_markup_is_too_much():
    answer = Answer(200, PAGE, html=True)
    assert decide(answer, BELOW) == Check()
    assert decide(checked(answer, None), BELOW) == Parse()
    refused = "page too complex: more than 1000 tags"
    assert decide(checked(answer, refused), BELOW) == Report(p.ERROR, refused)
    assert checked(answer, refused) == Answer(200, PAGE, html=True, checked=True, refused=refused)


@pytest.mark.parametrize("status", [200, 203, 206, 300, 305])
def test_anything_else_is_parsed(status):
    assert decide(Answer(status, PAGE), BELOW) == Parse()
    assert decide(Answer(status, PAGE), PAST) == Parse()
