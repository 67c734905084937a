"""A context variable set for the length of a block: what ``recorded_as``, ``pinned`` and ``exits_used`` are.

A class, not contextlib.contextmanager: the worker enters two of them around every page's resolution, and a
generator's context manager costs a generator, its wrapper and two resumptions (a few microseconds a page, a
fiftieth of a worker's CPU in the crawl benchmark) where this costs a ContextVar's set and reset.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Generic, TypeVar

V = TypeVar("V")


class Scoped(Generic[V]):
    """``with Scoped(var, value) as v:`` sets ``var`` to ``value`` (``v``) inside the block, and puts back what it
    was when the block ends, however it ends. Entered once."""

    __slots__ = ("_var", "_value", "_token")

    def __init__(self, var: ContextVar[V | None], value: V) -> None:
        self._var = var
        self._value = value

    def __enter__(self) -> V:
        self._token: Token[V | None] = self._var.set(self._value)
        return self._value

    def __exit__(self, *exc: object) -> None:
        self._var.reset(self._token)
