"""A context variable set for a block: recorded_as, pinned and exits_used are made of it."""

from contextvars import ContextVar

import pytest

from crawler.http.egress import current_pin, exits_used, note_exit, pinned
from crawler.http.proxies import Proxy
from crawler.http.scoped import Scoped

VAR: ContextVar[str | None] = ContextVar("test_scoped", default=None)


def test_the_value_holds_inside_and_what_was_comes_back_after():
    with Scoped(VAR, "outer") as got:
        assert got == "outer" and VAR.get() == "outer"
        with Scoped(VAR, "inner"):
            assert VAR.get() == "inner"
        assert VAR.get() == "outer"
    assert VAR.get() is None


def test_the_value_comes_back_after_an_exception_which_goes_on():
    with pytest.raises(KeyError):
        with Scoped(VAR, "x"):
            raise KeyError("k")
    assert VAR.get() is None


def test_pinned_and_exits_used():
    proxy = Proxy("http", "p.example", 3128)
    with pinned("px1"):
        assert current_pin() == "px1"
        with exits_used() as used:
            note_exit(proxy)
        note_exit(proxy)      # outside exits_used: noted nowhere
    assert current_pin() is None and used == [proxy]
