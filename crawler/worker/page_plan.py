"""What a page task does with the answer its fetch got, decided from the answer alone. No I/O, no clock.

The worker's `process` (server.py) fetches the page, gathers the answer's status line and the headers the
decision reads (``Answer``) and carries out the action returned here, as the downloader does with
download_plan.py. The table, in the order its rows are tried:

    304 (the visit sent the validators of the last)   ``Unchanged``: nothing to parse; the audio its last full
                                                      answer listed is revalidated (revisit.py)
    429, 5xx                                          ``Report(RETRY, "HTTP <status>")``: the master pauses the
                                                      host (429/503) and leases the page again later
    301, 302, 303, 307, 308 with a usable Location    ``Redirect(target)``: the target is the same resource at
                                                      the same depth, reported as a link (even at the depth
                                                      limit) or, past the limit, as a reference (``ref``)
    a redirect without one (none, or not a URL)       ``Redirect(None)``: done, "redirect without a usable
                                                      Location"
    any other status >= 400                           ``Report(DONE)``: the status is the page's answer
    HTML not checked yet                              ``Check``: the shell runs html.precheck (off the loop for
                                                      a large page) and decides again with what it found
    HTML whose markup is refused (too many tags,      ``Report(ERROR, <why>)``: a permanent error of the URL
      too deep)
    anything else (2xx, a 3xx that is no redirect)    ``Parse``: links, the resolvers, the audio

Before the fetch, where the task stands against the crawl's depth limit (``depth``): below it its links are
followed; at it they are only counted (its audio references, a playlist or a stream, are still reported); past
it the task is itself such a reference, and what it names in turn is one too.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from crawler import protocol as p
from crawler.web.urls import InvalidURL, resolve

# ---- inputs ----


class Answer(msgspec.Struct, frozen=True):
    """One page answer without its body: the status and what the decision reads of it. A Struct: one or two are
    made for every page (a frozen dataclass sets each field through object.__setattr__)."""

    status: int
    final_url: str                       # the address that answered, after the client's own redirects
    location: str = ""                   # the Location header, stripped ("" when absent)
    html: bool = False                   # the body is HTML (it is parsed, so first checked)
    checked: bool = False                # html.precheck has looked at the body ...
    refused: str | None = None           # ... and this is why it must not be parsed (None: it may)


@dataclass(frozen=True, slots=True)
class Depth:
    follow: bool                         # below the limit: the page's links are followed
    beyond: bool                         # past it: the task is a reference, what it names is one too


# ---- actions ----


@dataclass(frozen=True, slots=True)
class Unchanged:
    pass


@dataclass(frozen=True, slots=True)
class Report:
    """The page ends here: a result of this status, with the answer's own fields and nothing parsed."""

    status: str                          # p.DONE, p.RETRY, p.ERROR
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Redirect:
    target: str | None                   # None: no usable Location
    ref: bool = False                    # reported as a reference, not a link (the task is past the limit)

    @property
    def error(self) -> str | None:
        return None if self.target else "redirect without a usable Location"


@dataclass(frozen=True, slots=True)
class Check:
    pass


@dataclass(frozen=True, slots=True)
class Parse:
    pass


Action = Unchanged | Report | Redirect | Check | Parse


# The actions without fields, and the four places a task can stand, made once: a frozen dataclass costs a
# microsecond or two to build, and these are decided for every page.
_UNCHANGED = Unchanged()
_CHECK = Check()
_PARSE = Parse()
_DEPTHS = {(follow, beyond): Depth(follow, beyond) for follow in (False, True) for beyond in (False, True)}


def depth(task_depth: int, max_depth: int | None) -> Depth:
    """Where a task at task_depth stands against the crawl's limit (None: no limit)."""
    return _DEPTHS[max_depth is None or task_depth < max_depth, max_depth is not None and task_depth > max_depth]


def checked(answer: Answer, refused: str | None) -> Answer:
    """The answer once html.precheck has looked at its body: ``refused`` why it must not be parsed (None: it
    may)."""
    return msgspec.structs.replace(answer, checked=True, refused=refused)


def decide(answer: Answer, where: Depth) -> Action:
    """The table of this module's docstring, one row at a time."""
    status = answer.status
    if status == 304:
        return _UNCHANGED
    if status == 429 or status >= 500:
        return Report(p.RETRY, f"HTTP {status}")
    if status in p.REDIRECT_STATUSES:
        return Redirect(_target(answer), ref=where.beyond)
    if status >= 400:
        return Report(p.DONE)
    if answer.html:
        if not answer.checked:
            return _CHECK
        if answer.refused:
            return Report(p.ERROR, answer.refused)
    return _PARSE


def _target(answer: Answer) -> str | None:
    if not answer.location:
        return None
    try:
        return resolve(answer.final_url, answer.location) or None
    except InvalidURL:
        return None
