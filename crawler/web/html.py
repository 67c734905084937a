"""CSS selection over parsed pages through one shared lexbor selector engine.

selectolax builds a selector engine (a CSS parser, selector lists, a matcher) for each parsed document on its
first css() call. That costs about 45 us, more than parsing a small page, and the worker parses every page it
fetches. One engine serves every document here instead: it is reset after each query, and its results are
copied out, so nested queries are safe. Not thread-safe; the worker runs its page work on one thread.
"""

from __future__ import annotations

import re
from typing import Any

from selectolax.lexbor import LexborCSSSelector, LexborHTMLParser, LexborNode

# selectolax ships no annotations for the selector engine: typed here, at the one place it is used.
_ENGINE: Any = LexborCSSSelector()  # type: ignore[no-untyped-call]


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


# ---------------------------------------------------------------------------------------------- parse bounds
# lexbor parses deep nesting in time quadratic in the depth (80,000 nested <div> take about 20 s), and the
# parse holds the GIL, so it cannot be moved off the event loop usefully. A page is measured before it is
# parsed instead: its tag count with bytes.count (C speed, no parse). A page of at most SCAN_START_TAGS start
# tags cannot nest deeper than that, which lexbor parses in a few tens of ms at worst: it goes straight on.
# Only a bigger page gets its nesting depth measured, by a tag scan that follows HTML's closing rules closely
# enough (stray end tags close nothing, an end tag closes what it encloses, <li> and <p> close their open
# namesake) and stops at the limit. Browsers cap the tree depth too (Blink at 512): no real page needs more.

_VOID = frozenset(b"area base br col embed hr img input keygen link meta param source track wbr frame "
                  b"basefont bgsound command".split())
# Elements a start tag of the same name closes (implied end tags, the adoption agency for <a>, <button> and
# <nobr> in scope, headings): a list of unclosed <li> or <a> is flat, not deep.
_CLOSE_NAMESAKE = frozenset(b"p li dt dd option optgroup tr td th tbody thead tfoot rb rt rp rtc a button nobr "
                            b"form h1 h2 h3 h4 h5 h6".split())
_TAG_TOKEN = re.compile(rb"<!--.*?(?:-->|\Z)|<(script|style|textarea|title|xmp)\b.*?(?:</\1\s*>|\Z)"
                        rb"|<(/?)([A-Za-z][A-Za-z0-9:._-]*)", re.DOTALL | re.IGNORECASE)
PAGE_TOO_COMPLEX = "page too complex"
SCAN_START_TAGS = 4000
# selectolax parses with the GIL released: a page larger than this (tens of ms to parse and more, about a
# second at the 5 MiB cap) is parsed in a thread while the event loop goes on; smaller ones inline, where a
# thread hand-off would cost more than it saves.
PARSE_INLINE_BYTES = 256 * 1024
# Below this many bytes the depth scan runs inline (a few ms at most); above, in a thread, where the GIL's
# switch interval lets the event loop run beside it.
SCAN_INLINE_BYTES = 64 * 1024


def precheck(body: bytes, *, max_tags: int, max_depth: int) -> tuple[str | None, bool]:
    """(why the page must not be parsed, or None; whether too_deep must still measure its nesting).

    One byte count for most pages: only one with more than SCAN_START_TAGS tags is looked at further.
    """
    tags = body.count(b"<")
    if tags > max_tags:
        return f"{PAGE_TOO_COMPLEX}: more than {max_tags} tags", False
    enough = max(max_depth, SCAN_START_TAGS)
    return None, tags > enough and tags - body.count(b"</") > enough


def nests_deeper(body: bytes, max_depth: int) -> bool:
    """Whether elements of an HTML page nest deeper than max_depth, as a parser would build the tree."""
    stack: list[bytes] = []
    open_count: dict[bytes, int] = {}
    for m in _TAG_TOKEN.finditer(body):
        name = m.group(3)
        if name is None:
            continue    # a comment or a raw text element: nothing inside nests
        name = name.lower()
        if m.group(2) or (name in _CLOSE_NAMESAKE and open_count.get(name)):
            if open_count.get(name):
                while stack:
                    top = stack.pop()
                    open_count[top] -= 1
                    if top == name:
                        break
            if m.group(2):
                continue
        if name in _VOID:
            continue
        stack.append(name)
        open_count[name] = open_count.get(name, 0) + 1
        if len(stack) > max_depth:
            return True
    return False


def too_deep(body: bytes, max_depth: int) -> str | None:
    """Linear in the body; run it off the event loop for a large one (see SCAN_INLINE_BYTES)."""
    return f"{PAGE_TOO_COMPLEX}: elements nested deeper than {max_depth}" if nests_deeper(body, max_depth) else None
