"""CSS selection over parsed pages through one shared lexbor selector engine.

selectolax builds a selector engine (a CSS parser, selector lists, a matcher) for each parsed document on its
first css() call. That costs about 45 us, more than parsing a small page, and the worker parses every page it
fetches. One engine serves every document here instead: it is reset after each query, and its results are
copied out, so nested queries are safe. Not thread-safe; the worker runs its page work on one thread.
"""

from __future__ import annotations

from selectolax.lexbor import LexborCSSSelector, LexborHTMLParser, LexborNode

_ENGINE = LexborCSSSelector()


def _scope(where: LexborHTMLParser | LexborNode) -> LexborNode | None:
    return where.root if isinstance(where, LexborHTMLParser) else where


def css(where: LexborHTMLParser | LexborNode, query: str) -> list[LexborNode]:
    """Every element under where (a document or an element, itself included) that matches query."""
    node = _scope(where)
    return _ENGINE.find(query, node) if node is not None else []


def css_first(where: LexborHTMLParser | LexborNode, query: str) -> LexborNode | None:
    """The first element in document order under where that matches query, or None."""
    node = _scope(where)
    if node is None:
        return None
    found = _ENGINE.find_first(query, node)
    return found[0] if found else None
