"""A bounded memory of answers by key: the one cache the hot paths keep.

A site's pages repeat their navigation: the same references, tested the same way (is this href plainly
root-relative, does it say stream, does it settle an element), on every page; a server sends the same header
names on every answer; a catalogue's rows leave the same columns unset. Such an answer is a pure function of its
key, so it is remembered: a hit is one dict lookup. The memory is a plain dict emptied whole when full (no recency
kept: repeated keys come straight back), and a long key (a string of more than ``max_key`` characters, a tuple of
more items) is not kept (rare, and each would hold its memory). Not state a caller sees; safe across threads (dict
operations hold the GIL).
"""

from __future__ import annotations

from collections.abc import Hashable, Sized
from typing import Protocol, TypeVar


class _Key(Hashable, Sized, Protocol):
    """A key the memory can bound: hashable and with a length (a string, a tuple)."""


K = TypeVar("K", bound=_Key)
V = TypeVar("V")

MAX_KEY = 512      # characters (items) of a key kept


class Memo(dict[K, V]):
    """Answers by key, at most ``kept`` of them: ``get`` to look, ``keep`` to remember one."""

    __slots__ = ("kept", "max_key")

    def __init__(self, kept: int, max_key: int = MAX_KEY) -> None:
        super().__init__()
        self.kept = kept
        self.max_key = max_key

    def keep(self, key: K, value: V) -> V:
        """Remembers value for key (emptying the memory first when it is full); returns value."""
        if len(self) >= self.kept:
            self.clear()
        if len(key) <= self.max_key:
            self[key] = value
        return value
