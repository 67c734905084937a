"""robots.txt read the way Google's parser (google/robotstxt) reads it: RFC 9309 plus the leniencies of the
parser most sites are written and tested against.

Pure and bounded: bytes and a crawler's product token in, a small frozen ``Robots`` out, no I/O, no clock.

What the reading means, where parsers differ (each point is one of Google's test cases,
tests/test_robots_conformance.py runs them all):

- A UTF-8 byte order mark (or a leading part of one) at the start of the file is skipped. Lines end at CR,
  LF or CRLF; a line is cut at ``MAX_LINE_BYTES`` (Google's 8 x 2083) and at a NUL byte; ``#`` starts a
  comment.
- A line is ``key: value``; without a colon ``key value`` is read the same when the line holds exactly two
  words. Keys are case-insensitive prefixes (``user-agent``, ``allow``, ``disallow``, ``sitemap``, plus
  Google's accepted typos such as ``useragent`` and ``dissallow``).
- Groups: consecutive ``User-agent`` lines open a group, its first Allow/Disallow line closes the list of
  agents. Blank lines, ``Sitemap``, ``Crawl-delay`` and unknown lines change nothing: they neither end a
  group nor start one. Rules before any ``User-agent`` line are ignored.
- A ``User-agent`` line names the token of ``[A-Za-z_-]`` characters it starts with (``FOO BAR`` is
  ``FOO``, ``audio/1.0`` is ``audio``), compared case-insensitively and exactly with the crawler's token
  (``audio`` does not name ``audio-crawler``). ``*`` (alone or followed by a space) is the global agent.
  An empty token (``User-agent: /x``) names no crawler, ours included: Google's would name an empty agent.
  Every group that names the crawler is merged; only when none does are the global groups used (merged
  too); with neither, everything is allowed.
- Allow/Disallow values are patterns over the URL's path, parameters and query: ``*`` is any run of
  characters, a final ``$`` anchors at the end. Bytes outside ASCII are percent-encoded and existing
  escapes upper-cased (``%aa`` is ``%AA``); nothing else is decoded, so ``%62`` does not match ``b``
  (the URL is compared as given: the crawler's normalised form). The longest matching pattern decides;
  an Allow wins a tie; an empty pattern matches and decides nothing. Google's one extension: an
  Allow of ``.../index.html`` (``index.htm``...) also allows ``.../`` exactly.
- ``Crawl-delay`` (not read by Google, kept for politeness) belongs to the group it sits in; the largest
  value among the groups that apply is taken. ``Sitemap`` lines count wherever they are.

Matching never backtracks: a pattern is split at ``*`` into literal pieces found left to right with
``str.find`` (the leftmost place of each piece is always a good one), so a check costs about the path's
length per rule whatever the pattern.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Google's cut of one line (robots.cc, RobotsTxtParser::Parse): the rest of a longer line is ignored.
MAX_LINE_BYTES = 2083 * 8 - 1
# Lines read from one file. A real robots.txt has a few hundred at most; past this the file is a generator's
# output and its tail is ignored (time stays linear in the bytes anyway).
MAX_LINES = 100_000
# Allow/Disallow rules kept from one file for one agent. Each costs a few hundred bytes and a little time in
# every allowed() check; a real file needs far fewer, a hostile one would make one host cost megabytes.
MAX_RULES = 1000
# Sitemap: lines kept from one file: a site with more is listing sitemaps, not indexing them.
MAX_SITEMAPS = 100

USER_AGENT = "user-agent"
ALLOW = "allow"
DISALLOW = "disallow"
SITEMAP = "sitemap"
CRAWL_DELAY = "crawl-delay"
UNKNOWN = "unknown"

# Key prefixes, lower case, as Google reads them (typos included: its kAllowFrequentTypos is on).
_KEYS: tuple[tuple[str, tuple[bytes, ...]], ...] = (
    (USER_AGENT, (b"user-agent", b"useragent", b"user agent")),
    (ALLOW, (b"allow",)),
    (DISALLOW, (b"disallow", b"dissallow", b"dissalow", b"disalow", b"diasllow", b"disallaw")),
    (SITEMAP, (b"sitemap", b"site-map")),
    (CRAWL_DELAY, (b"crawl-delay",)),
)
_BOM = b"\xef\xbb\xbf"
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}|[\x80-\xff]")
_TOKEN = re.compile(r"[A-Za-z_-]*")
_TOKEN_B = re.compile(rb"[A-Za-z_-]*")


@dataclass(frozen=True, slots=True)
class Line:
    """One directive of a file: its line number (CRLF counts once), its kind and its value, stripped."""

    number: int
    kind: str          # USER_AGENT, ALLOW, DISALLOW, SITEMAP, CRAWL_DELAY or UNKNOWN
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Rule:
    """An Allow/Disallow pattern compiled: the literal before the first ``*``, the pieces after each one."""

    allow: bool
    priority: int               # the pattern's length in bytes, escaped: the longest match decides
    head: str
    pieces: tuple[str, ...]     # empty when the pattern has no ``*``
    anchored: bool              # it ended in ``$``

    def matches(self, path: str) -> bool:
        if not path.startswith(self.head):
            return False
        if not self.pieces:
            return not self.anchored or len(path) == len(self.head)
        pos = len(self.head)
        for piece in self.pieces[:-1]:
            at = path.find(piece, pos)
            if at < 0:
                return False
            pos = at + len(piece)
        last = self.pieces[-1]
        if self.anchored:
            return len(path) - len(last) >= pos and path.endswith(last)
        return path.find(last, pos) >= 0


@dataclass(frozen=True, slots=True)
class Robots:
    """One robots.txt as it applies to one crawler (``agent``, its product token)."""

    agent: str
    rules: tuple[Rule, ...]      # of the groups naming the agent if any does, else of the global groups
    crawl_delay: float | None    # seconds, from the same groups
    sitemaps: tuple[str, ...]

    def allowed(self, url: str) -> bool:
        """Whether the URL (absolute, or a path) may be fetched: the longest matching pattern decides."""
        path = path_of(url)
        allow = disallow = -1
        for rule in self.rules:
            if rule.allow:
                if rule.priority > allow and rule.matches(path):
                    allow = rule.priority
            elif rule.priority > disallow and rule.matches(path):
                disallow = rule.priority
        return disallow <= 0 or disallow <= allow


def product_token(user_agent: str) -> str:
    """The name robots.txt groups are matched against: the leading ``[A-Za-z_-]`` run (``audio-crawler/0.1``
    gives ``audio-crawler``)."""
    m = _TOKEN.match(user_agent)
    assert m is not None   # the pattern matches the empty string
    return m.group()


def is_product_token(text: str) -> bool:
    """Whether text is usable as a crawler's token as it is (RFC 9309 2.2.1)."""
    return bool(text) and product_token(text) == text


def path_of(url: str) -> str:
    """The part of a URL rules are matched against: path, parameters and query, without the fragment
    (Google's GetPathParamsQuery, which also takes a bare path or a scheme-less URL)."""
    start = 2 if url.startswith("//") else 0
    early = _path_separator(url, start)
    proto = url.find("://", start)
    if proto < 0 or (early >= 0 and early < proto):
        proto = start
    else:
        proto += 3
    path_start = _path_separator(url, proto)
    if path_start < 0:
        return "/"
    hash_at = url.find("#", start)
    if 0 <= hash_at < path_start:
        return "/"
    path = url[path_start:hash_at] if hash_at >= 0 else url[path_start:]
    return path if path.startswith("/") else "/" + path


def _path_separator(text: str, start: int) -> int:
    """Where the first of "/", "?" and ";" is in text from start on (-1: none); one search where a find per
    character and a list of them cost 1 us a URL leased."""
    m = _PATH_SEPARATOR.search(text, start)
    return m.start() if m is not None else -1


_PATH_SEPARATOR = re.compile(r"[/?;]")


def escape_pattern(value: bytes) -> str:
    """A pattern with bytes outside ASCII percent-encoded and existing escapes upper-cased (Google's
    MaybeEscapePattern); the result is ASCII."""
    return _ESCAPE.sub(_escape_one, value).decode("ascii")


def _escape_one(m: re.Match[bytes]) -> bytes:
    text = m.group()
    return text.upper() if len(text) == 3 else b"%%%02X" % text[0]


def _skip_bom(body: bytes) -> bytes:
    # Google skips the BOM's bytes one by one: a partial BOM goes too, a wrong byte ends the skipping.
    n = 0
    while n < len(_BOM) and n < len(body) and body[n] == _BOM[n]:
        n += 1
    return body[n:]


def scan(body: bytes) -> Iterator[Line]:
    """The directives of a file in order, at most MAX_LINES lines read. Blank lines, comments and lines
    without a key and a value yield nothing; lines with an unknown key yield UNKNOWN."""
    for number, m in enumerate(_LINE.finditer(_skip_bom(body)), 1):
        if number > MAX_LINES:
            return
        raw = m.group().rstrip(b"\r\n")[:MAX_LINE_BYTES]
        line = raw.split(b"\0", 1)[0].split(b"#", 1)[0].strip()
        if not line:
            continue
        kv = _key_value(line)
        if kv is None:
            continue
        key, value = kv
        lower = key.lower()
        kind = next((k for k, prefixes in _KEYS if lower.startswith(prefixes)), UNKNOWN)
        yield Line(number, kind, key, value)


def _key_value(line: bytes) -> tuple[bytes, bytes] | None:
    sep = line.find(b":")
    if sep >= 0:
        key, value = line[:sep].strip(), line[sep + 1:].strip()
    else:
        # Google's leniency: "Disallow /x" for "Disallow: /x", when the line is exactly two words.
        cut = min((i for i in (line.find(b" "), line.find(b"\t")) if i >= 0), default=-1)
        if cut < 0:
            return None
        key, value = line[:cut], line[cut:].lstrip(b" \t")
        if b" " in value or b"\t" in value:
            return None
        key, value = key.strip(), value.strip()
    return (key, value) if key else None


def compile_rule(allow: bool, value: bytes) -> list[Rule]:
    """The rules an Allow/Disallow value stands for: one, or two for Google's ``index.html`` Allow."""
    pattern = escape_pattern(value)
    out = [_compile(allow, pattern)]
    slash = pattern.rfind("/")
    if allow and slash >= 0 and pattern.startswith("/index.htm", slash):
        out.append(_compile(True, pattern[:slash + 1] + "$"))
    return out


def _compile(allow: bool, pattern: str) -> Rule:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    head, *pieces = body.split("*")
    return Rule(allow, len(pattern), head, tuple(p for p in pieces[:-1] if p) + tuple(pieces[-1:]), anchored)


def _is_global(value: bytes) -> bool:
    # Google's leniency: "* something" is still the global agent.
    return value[:1] == b"*" and (len(value) == 1 or value[1:2].isspace())


def parse(body: bytes, agent: str) -> Robots:
    """The file as it applies to the crawler whose product token is ``agent`` (see product_token).

    Bounded: MAX_LINES lines, MAX_RULES rules and MAX_SITEMAPS sitemaps kept, time linear in the body.
    """
    agent_l, agent_ok = agent.lower(), bool(agent) and agent.isascii()   # tokens are ASCII, compared as such
    seen_global = seen_specific = closed = named = False
    rules: dict[bool, list[Rule]] = {True: [], False: []}     # keyed by "from a group naming the agent"
    delays: dict[bool, float | None] = {True: None, False: None}
    sitemaps: list[str] = []
    for line in scan(body):
        kind, value = line.kind, line.value
        if kind == USER_AGENT:
            if closed:
                seen_global = seen_specific = closed = False
            if _is_global(value):
                seen_global = True
            else:
                token = _TOKEN_B.match(value)
                assert token is not None
                if agent_ok and token.group().decode("ascii").lower() == agent_l:
                    seen_specific = named = True
        elif kind in (ALLOW, DISALLOW):
            if not (seen_global or seen_specific):
                continue          # a rule outside any group
            closed = True
            kept = rules[seen_specific]
            if len(kept) < MAX_RULES:
                kept.extend(compile_rule(kind == ALLOW, value)[:MAX_RULES - len(kept)])
        elif kind == CRAWL_DELAY:
            if seen_global or seen_specific:
                delay = _delay(value)
                old = delays[seen_specific]
                if delay is not None and (old is None or delay > old):
                    delays[seen_specific] = delay
        elif kind == SITEMAP and value and len(sitemaps) < MAX_SITEMAPS:
            sitemaps.append(value.decode("utf-8", errors="replace"))
    return Robots(agent, tuple(rules[named]), delays[named], tuple(sitemaps))


def _delay(value: bytes) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if delay >= 0 and math.isfinite(delay) else None
