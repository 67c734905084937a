"""A bounded memory of the page path's answers by string key.

A site's pages repeat their navigation: the same references, tested the same way (is this href plainly
root-relative, does it say stream, does it settle an element), on every page. Such a test is a pure function of
the string, so its answer is remembered: a hit is one dict lookup. The memory is a plain dict emptied whole when
full (no recency kept: a site's repeated references come straight back), and a long key is not kept (rare, and
each would hold its memory). Not state a caller sees; safe across threads (dict operations hold the GIL).
"""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")

MAX_KEY = 512      # characters of a key kept


class Memo(dict[str, V]):
    """Answers by key, at most ``kept`` of them: ``get`` to look, ``keep`` to remember one."""

    __slots__ = ("kept",)

    def __init__(self, kept: int) -> None:
        super().__init__()
        self.kept = kept

    def keep(self, key: str, value: V) -> V:
        """Remembers value for key (emptying the memory first when it is full); returns value."""
        if len(self) >= self.kept:
            self.clear()
        if len(key) <= MAX_KEY:
            self[key] = value
        return value
