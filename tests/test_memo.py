"""The page path's bounded memory of answers (crawler/web/memo.py)."""

from __future__ import annotations

from crawler.web.memo import MAX_KEY, Memo


def test_a_memo_remembers_until_full_then_starts_over() -> None:
    memo: Memo[bool] = Memo(3)
    for key in ("a", "b", "c"):
        assert memo.keep(key, True) is True
    assert memo.get("a") is True and len(memo) == 3
    memo.keep("d", False)          # full: emptied whole, then d kept
    assert dict(memo) == {"d": False}


def test_a_long_key_is_answered_but_not_kept() -> None:
    memo: Memo[bool] = Memo(10)
    assert memo.keep("x" * (MAX_KEY + 1), True) is True
    assert len(memo) == 0
