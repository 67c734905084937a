"""The limits' decision table (crawler/master/limits.py), walked row by row."""

import pytest

from crawler.master.limits import MAX_BYTES, MAX_DURATION, MAX_PAGES, Limits, limit_reached


@pytest.mark.parametrize(("limits", "pages", "bytes_fetched", "elapsed", "reached"), [
    (Limits(), 10**9, 10**12, 10**9, None),                                 # no limit set
    (Limits(max_pages=10), 9, 0, 0, None),
    (Limits(max_pages=10), 10, 0, 0, MAX_PAGES),
    (Limits(max_bytes=1000), 0, 999, 0, None),
    (Limits(max_bytes=1000), 0, 1000, 0, MAX_BYTES),
    (Limits(max_duration=60), 0, 0, 59.9, None),
    (Limits(max_duration=60), 0, 0, 60, MAX_DURATION),
    (Limits(max_pages=1, max_bytes=1, max_duration=1), 1, 1, 1, MAX_PAGES),  # several at once: the first named
    (Limits(max_pages=5, max_bytes=1, max_duration=1), 1, 1, 1, MAX_BYTES),
    (Limits(max_pages=5, max_bytes=10, max_duration=1), 1, 1, 1, MAX_DURATION),
])
def test_the_first_limit_reached_is_named(limits, pages, bytes_fetched, elapsed, reached):
    assert limit_reached(limits, pages=pages, bytes_fetched=bytes_fetched, started=1000.0,
                         now=1000.0 + elapsed) == reached
