"""The worker keeps its results within the master's wire checks, so a hostile page cannot cost the connection."""

import math

from crawler import protocol as p
from crawler.items import AudioItem
from crawler.worker.server import _within_limits

GOOD = AudioItem(url="http://a/x.mp3", page="http://a/", title="ok", duration=3.0)


def test_a_result_within_limits_is_sent_as_it_is():
    r = p.Result(1, "http://a/", p.DONE, 200, links=("http://a/b",), audio=(GOOD,))
    assert _within_limits(r) is r


def test_audio_items_out_of_limits_are_dropped_and_the_rest_kept():
    bad = (GOOD.replace(duration=math.nan), GOOD.replace(title="t" * (p.MAX_TEXT + 1)),
           GOOD.replace(extra={"k": math.inf}))
    r = p.Result(1, "http://a/", p.DONE, 200, links=("http://a/b",), audio=(bad[0], GOOD, *bad[1:]))
    out = _within_limits(r)
    assert out.audio == (GOOD,) and out.links == ("http://a/b",) and out.status == p.DONE
    p.check_result(out)


def test_a_result_that_cannot_fit_is_reported_as_an_error():
    r = p.Result(1, "http://a/", p.DONE, 200, final_url="http://a/" + "x" * p.MAX_URL, links=("http://a/b",))
    out = _within_limits(r)
    assert out.status == p.ERROR and out.lease == 1 and not out.links and "final_url" in out.error
    p.check_result(out)
