"""A fetched response as resolvers and the worker read it: its text in the right charset, and its HTML parsed once."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser

from crawler.items import LinkMeta

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})

_CHARSET_PARAM = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)
_META_CHARSET = re.compile(rb"<meta[^>]+charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)
# A <meta charset> after the first few KiB is not honoured by browsers either.
_META_SCAN_BYTES = 4096
# Charset names that are Python's UTF-8 codec itself, as pages spell them (lower case).
_UTF8_NAMES = frozenset({"utf-8", "utf8", "utf_8", "u8", "utf", "cp65001"})


@dataclass
class FetchedPage:
    """One response as the worker fetched it."""

    url: str
    final_url: str
    status: int
    content_type: str
    headers: Mapping[str, str]
    body: bytes
    referrer: str | None = None
    raw_headers: Sequence[tuple[bytes, bytes]] = ()   # as received, for the page archive
    # What the page that linked this address said about the link (items.LinkMeta), when it came with the task.
    link_meta: LinkMeta | None = None
    # The request as sent (Host first) and when, and whether the body read is less than the answer's (cut at a
    # cap, or only its start sniffed): for the archive's records of the exchange.
    sent: Sequence[tuple[bytes, bytes]] = ()
    started: float = 0.0
    cut: bool = False
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _tree: LexborHTMLParser | None = field(default=None, init=False, repr=False, compare=False)
    _parsed: bool = field(default=False, init=False, repr=False, compare=False)
    _utf8: bool = field(default=False, init=False, repr=False, compare=False)   # text() is the body as UTF-8

    def charset(self) -> str | None:
        m = _CHARSET_PARAM.search(self.headers.get("content-type", ""))
        if m:
            return m.group(1)
        if self.content_type in HTML_TYPES or not self.content_type:
            mb = _META_CHARSET.search(self.body[:_META_SCAN_BYTES])
            if mb:
                return mb.group(1).decode("ascii", "replace")
        return None

    def text(self) -> str:
        if self._text is None:
            charset = self.charset()
            text = None
            if charset and charset.lower() not in _UTF8_NAMES:
                try:
                    text = self.body.decode(charset, errors="replace")
                except (LookupError, UnicodeError, ValueError):  # unknown, or not a text codec
                    text = None
            if text is None:
                # UTF-8 (named so, or by default): decoded strictly first, which costs the same on valid bytes and
                # says the text is the body exactly (the tree is then parsed from the body, not re-encoded).
                try:
                    text = self.body.decode("utf-8")
                    self._utf8 = True
                except UnicodeDecodeError:
                    text = self.body.decode("utf-8", errors="replace")
            self._text = text
        return self._text

    def is_html(self) -> bool:
        if self.content_type in HTML_TYPES:
            return True
        if self.content_type:
            return False
        head = self.body[:512].lstrip().lower()
        return head.startswith((b"<!doctype html", b"<html")) or b"<head" in head or b"<body" in head

    def tree(self) -> LexborHTMLParser | None:
        if not self._parsed:
            self._parsed = True
            if self.is_html():
                text = self.text()
                # The parser takes UTF-8: the body itself when the text is exactly its UTF-8 (what it would
                # encode the text back to), saving that copy.
                self._tree = LexborHTMLParser(self.body if self._utf8 else text)
        return self._tree
